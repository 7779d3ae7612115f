"""Prometheus metrics through `ray.serve.metrics` (exported by each Ray node's
metrics agent, scraped at http://NODE:8080 by default; see docs/operations.md, "Metrics"). Created in
constructors, never at import."""

from __future__ import annotations

from ray.serve.metrics import Counter, Gauge, Histogram

_LATENCY_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000]
_SIZES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128]


class StageMetrics:
    """One set per model deployment replica, tagged with its stage."""

    def __init__(self, stage: str):
        def tagged(metric):
            metric.set_default_tags({"stage": stage})  # a fresh dict each: Serve adds its own keys to it
            return metric

        keys = ("stage",)
        self.latency = tagged(Histogram("ocr_stage_latency_ms", description="Time of one batch call, by stage (ms).",
                                        boundaries=_LATENCY_MS, tag_keys=keys))
        self.batch_requests = tagged(Histogram("ocr_batch_requests", description="Requests in one batch, by stage.",
                                               boundaries=_SIZES, tag_keys=keys))
        self.batch_items = tagged(Histogram("ocr_batch_items",
                                            description="Items (images or crops) in one batch, by stage.",
                                            boundaries=_SIZES, tag_keys=keys))
        self.queue_depth = tagged(Gauge("ocr_stage_queue_depth",
                                        description="Calls waiting in this replica's batch queue.", tag_keys=keys))
        self.model_load_s = tagged(Gauge("ocr_model_load_seconds", description="Model load time of this replica (s).",
                                         tag_keys=keys))
        self.first_inference_s = tagged(Gauge(
            "ocr_first_inference_seconds", description="Warm-up (first inference over every warmed shape) time (s).",
            tag_keys=keys))
        self.errors = tagged(Counter("ocr_stage_errors", description="Items that failed in a batch, by stage.",
                                     tag_keys=keys))
        self.canary_runs = tagged(Counter(
            "ocr_canary_runs", description="Golden-input checks of a model replica, by stage and result (pass|fail).",
            tag_keys=("stage", "result")))
        self.backlog = tagged(Gauge(
            "ocr_autoscaling_backlog",
            description="Backlog this replica reports to the autoscaler: images queued (det), crops queued (rec).",
            tag_keys=keys))


class CacheMetrics:
    """At the ingress: the result cache and in-flight table (serve_app.http.policies.result_cache)."""

    def __init__(self):
        self.lookups = Counter("ocr_cache_requests",
                               description="Requests by how the result cache answered: hit, shared, miss, bypass.",
                               tag_keys=("result",))
        self.bytes = Gauge("ocr_cache_bytes", description="Bytes of results held in this ingress replica's cache.")
        self.entries = Gauge("ocr_cache_entries", description="Results held in this ingress replica's cache.")


class AdmissionMetrics:
    """At the ingress: admission by cost (serve_app.http.policies.admission)."""

    def __init__(self):
        self.refusals = Counter("ocr_admission_refusals",
                                description="Requests refused with 503 at the ingress, by reason: deadline (not "
                                "expected to finish in time), cost_bound (queued work over the limit), in_flight "
                                "(count limit).", tag_keys=("reason",))
        self.queued_cost = Gauge("ocr_admission_queued_cost_seconds",
                                 description="Estimated seconds of work admitted and unfinished at this ingress.")
        self.drain_rate = Gauge("ocr_admission_drain_rate",
                                description="Seconds of (estimated) work finished per second while busy, "
                                "measured over the drain window.")
        self.slowdown = Gauge("ocr_admission_slowdown",
                              description="Factor (1 to 3) on the expected finish times: the measured 95th "
                              "percentile of actual over expected seconds.")
        self.estimate_ratio = Histogram("ocr_admission_estimate_ratio",
                                        description="Actual over expected seconds to finish of each answered "
                                        "request (1: exact; below 1: the estimate was cautious).",
                                        boundaries=[0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10])


class RequestMetrics:
    """At the ingress: request outcomes and end-to-end latency."""

    def __init__(self):
        self.requests = Counter("ocr_requests", description="OCR requests by route and status code.",
                                tag_keys=("route", "code"))
        self.errors = Counter("ocr_errors", description="OCR errors by error code.", tag_keys=("code",))
        self.latency = Histogram("ocr_request_latency_ms", description="End-to-end OCR latency at the ingress (ms).",
                                 boundaries=_LATENCY_MS, tag_keys=("route",))
        self.stage_latency = Histogram("ocr_pipeline_stage_ms",
                                       description="Per-request time in each pipeline step (ms).",
                                       boundaries=_LATENCY_MS, tag_keys=("step",))


class LaneMetrics:
    """Priority lanes (serve_app.core.lanes) at one queue, tagged `stage`: det,
    cls, rec (the crop scheduler), pipeline (its bulk gate) or jobs."""

    def __init__(self, stage: str):
        def tagged(metric):
            metric.set_default_tags({"stage": stage})
            return metric

        self.queued = tagged(Gauge("ocr_lane_queued", description="Items waiting at this queue, by lane (images at "
                                   "det and pipeline, calls at cls, crops at rec, jobs at jobs).",
                                   tag_keys=("stage", "lane")))
        self.bulk_wait = tagged(Histogram("ocr_bulk_wait_ms", description="How long a bulk item waited at this queue "
                                          "before its turn (ms).", boundaries=_LATENCY_MS, tag_keys=("stage",)))
        self.promotions = tagged(Counter("ocr_bulk_promotions", description="Bulk items served ahead of waiting "
                                         "interactive work because they had waited lanes.bulk_max_wait_s.",
                                         tag_keys=("stage",)))


class LaneRequestMetrics:
    """At the pipeline: every image or PDF it reads, by lane."""

    def __init__(self):
        self.requests = Counter("ocr_lane_requests", description="Requests read by the pipeline, by priority lane.",
                                tag_keys=("lane",))
