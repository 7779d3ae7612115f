"""The application's typed arguments (the `args:` block of deployments.yaml),
one model per deployment, and the batch knobs (a model deployment's
`user_config`). Pydantic, no Ray import: every bad value is refused when the
application is built, with a message naming it.

Where each setting lives (one home each):
- resources, replica counts, autoscaling, max_ongoing_requests: the Serve
  config file (deployments.yaml / deployments.gpu.yaml), never the code;
- batch knobs: `user_config` of each model deployment (changed live), with
  the defaults below for a config that gives none;
- everything else: the typed args here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serve_app.core.engine_config import EngineConfig, PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.core.job_args import JobArgs, LaneArgs, _Args


class ModelArgs(_Args):
    """How one model deployment's replicas run its predictor. The malloc_*
    settings tune the process's glibc heap (serve_app/serving/heap.py,
    docs/operations.md, "Memory"): with a model beside the recogniser, the
    recogniser's values hold (one process, one heap). The heap's arena limit
    is not a setting here: glibc reads it once, at the process's first
    allocation, so its one home is MALLOC_ARENA_MAX in the deployment's
    runtime_env (every profile gives the model processes 1)."""

    @model_validator(mode="before")
    @classmethod
    def _arena_in_the_environment(cls, data: Any) -> Any:
        if isinstance(data, dict) and "malloc_arena_max" in data:
            raise ValueError("malloc_arena_max is not an arg: set MALLOC_ARENA_MAX in the deployment's "
                             "ray_actor_options.runtime_env.env_vars (glibc reads it at the process's first "
                             "allocation; docs/operations.md, \"Memory\")")
        return data

    predictor: Optional[PredictorOptions] = Field(
        None,
        description="Predictor options for this stage, laid over engine.predictor inside AppArgs (only what differs "
        "is written here: `tensorrt: {...}` alone keeps the engine's `device: gpu`); None = the engine's.")
    cpu_cores: Optional[list[int]] = Field(
        None,
        description="Cores this stage's replicas pin their inference threads to. Replica k on a node takes `threads` "
        "consecutive entries starting at k * threads (wrapping), so replicas of one stage spread over the "
        "listed cores.")
    threads: int = Field(
        1, ge=1,
        description="cores (and inference threads) each replica takes from cpu_cores; no effect without cpu_cores")
    canary_interval_s: float = Field(
        60.0, ge=0,
        description="The correctness canary (serve_app.serving.canary): each replica reads its golden input before it "
        "is ready, after every reconfigure, and every this many seconds (checked within Serve's health "
        "checks, so at most every health_check_period_s); 0 = not periodically.")
    malloc_mmap_threshold: Optional[int] = Field(
        None, ge=64 * 1024, le=32 * 1024 * 1024,
        description="bytes: a fixed glibc mmap threshold for the replica's process (mallopt "
        "M_MMAP_THRESHOLD, set before its predictor is built): larger buffers are mapped on every "
        "allocation and unmapped when freed. null (the default): glibc's own threshold, which rises to the "
        "largest buffer freed, so image-sized buffers are reused from the heap; 131072 was the default "
        "before and cost ~25 ms of page faults per image here (the heap_settings benchmark, deleted once it had decided this; commit 4adefb1 has it). "
        "At least 64 KiB and at most 32 MiB (glibc's own ceiling)")
    malloc_trim_idle_s: Optional[float] = Field(
        1.0, gt=0,
        description="seconds: the heap's free pages go back to the OS (malloc_trim) after warm-up and once "
        "no predictor call has begun or ended in the process for this long; null: never trimmed (the "
        "heap keeps its peak)")


class DetectorArgs(ModelArgs):
    warm_shapes: list[tuple[int, int]] = Field(
        [(960, 960), (640, 640), (320, 960)],
        description="Detector input shapes (h, w) warmed before the replica is ready when engine.det's sizing is an "
        "open mode (\"max\"/\"min\"); with the default \"ladder\" every input shape of its closed set is warmed "
        "instead.")
    beside_recognizer: bool = Field(
        False,
        description="true: no TextDetector deployment; each recogniser replica also runs the detector "
        "(serve_app/serving/stages_in_one_process.py): one process and one copy of the runtimes fewer, "
        "but the detector then scales with the recogniser. Its predictor options still apply; its cores, "
        "threads, replicas, resources and user_config are the recogniser's (its batch knobs stay the "
        "code's defaults).")


class ClassifierArgs(ModelArgs):
    beside_recognizer: bool = Field(
        False,
        description="true: no DirectionClassifier deployment; each recogniser replica also runs the classifier "
        "(serve_app/serving/stages_in_one_process.py): one process and one copy of the runtimes fewer. "
        "Its predictor options still apply; its cores, threads, replicas and resources are the "
        "recogniser's.")


class RecognizerArgs(ModelArgs):
    warm_widths: list[int] = Field(
        [480, 640, 960],
        description="Crop widths (at height 48) warmed when the width set is open (rec.batch_padding \"batch_max\"); "
        "with the width ladder every shape is.")
    warm: Literal["full", "core"] = Field(
        "core",
        description="Which input shapes a replica runs before it is ready. \"full\": all of them (71 by default). "
        "\"core\": every width of the ladder at batch size 1 (15); the rest are built after ready on the "
        "predictor's thread, one at a time and only while no batch is queued, and until then a batch at a "
        "shape not built yet runs as batches of built shapes of its width: the same text, and no request "
        "waits on the predictor for more than the one build running when it came; but the builds take CPU "
        "from the other stages, so the first requests after ready are slower "
        "(serve_app/serving/shapes_after_ready.py). Applies with bucket padding unless TensorRT is on (it "
        "builds an engine per shape; a replica on the CPU fallback defers); otherwise every shape is "
        "warmed.")
    batch_sizes: Optional[list[int]] = Field(
        None,
        description="The predictor batch sizes a replica builds at each width, besides the width's largest (a full "
        "batch, batch_limit); a batch of any other size runs as batches of built sizes (5 crops as 4 + "
        "1), reading the same text (bucket padding: a crop is padded to its own bucket in any batch). "
        "Each shape a replica builds keeps ~3.5 MB of the engine's kernels and buffers; null: every size "
        "from 1 to the width's largest (71 shapes by default, against 51 with [1, 2, 4]). Needs 1 (a lone "
        "crop); applies with bucket padding unless TensorRT is on, as `warm` does.")
    with_pipeline: bool = Field(
        False,
        description="true (with detector.beside_recognizer, and classifier.beside_recognizer unless engine.cls is "
        "off): the pipeline's own work (decoding, crops, order) runs in the recogniser's process too, "
        "which is then the OcrPipeline deployment (serve_app/serving/stages_in_one_process.py, "
        "PipelineWithModels): no TextRecognizer deployment, and an image's three stage calls are local "
        "calls instead of Ray hops (~7-10 ms each here). The deployment's resources, replicas, "
        "max_ongoing_requests and user_config (the recogniser's and classifier's batch knobs) come from "
        "the YAML's OcrPipeline block.")
    fan_out: int = Field(
        1, ge=1,
        description="An image with at least `fan_out_min_items` crops is sent as up to `fan_out` calls (crops dealt "
        "out in width order), so that several replicas read one text-dense page at once. 1 = one call per "
        "image. Answers are the same either way (crops are batched by width bucket wherever they are "
        "read).")
    fan_out_min_items: int = Field(12, ge=2, description="(see fan_out)")


    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is None:
            return v
        if 1 not in v or any(n < 1 for n in v) or len(set(v)) != len(v):
            raise ValueError(f"batch_sizes {v}: distinct sizes of at least 1, including 1 (a lone crop)")
        return sorted(v)


class BatchKnobs(_Args):
    """A model deployment's `user_config`: its `@serve.batch` knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_batch_size: int = Field(ge=1, description="requests per @serve.batch call at most")
    batch_wait_timeout_s: float = Field(
        0.0, ge=0,
        description="seconds a batch waits to fill (0: it runs with what is there)")

    def updated(self, user_config: Optional[dict[str, Any]]) -> "BatchKnobs":
        """These knobs with a user_config's values laid over them; a bad key
        or value is a ConfigError naming it."""
        try:
            return BatchKnobs.model_validate({**self.model_dump(), **(user_config or {})})
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "user_config"
            raise ConfigError(f"user_config {where}: {first.get('msg')} "
                              f"(allowed: max_batch_size >= 1, batch_wait_timeout_s >= 0)") from None


# For a Serve config whose model deployments give no user_config. No batch
# wait: on the CPU a wait is pure latency (the GPU profile sets its own).
BATCH_DEFAULTS = {
    "det": BatchKnobs(max_batch_size=4),
    "cls": BatchKnobs(max_batch_size=24),
    "rec": BatchKnobs(max_batch_size=24),
}


class AdmissionArgs(_Args):
    """Admission by cost (serve_app.http.policies.admission), per ingress replica: a
    request is refused (503, Retry-After from the measured drain rate) when
    it is not expected to finish before its deadline, or when the work
    admitted and unfinished here would pass max_queued_cost_s. Applies to
    POST /v1/ocr, /v1/ocr/batch (per item), PaddleX /ocr and the handle's
    `ocr`; not to job submits. Cached or shared answers cost nothing."""

    enabled: bool = Field(
        True,
        description="False: count limit (max_in_flight) only; the ledger, drain rate and estimates are still measured "
        "and exported.")
    max_queued_cost_s: float = Field(
        60.0, gt=0,
        description="Seconds of work (estimated, as if each request ran alone) admitted and unfinished at once; more: "
        "503 (reason cost_bound). An empty ledger admits any request within max_request_share (below).")
    deadline_share: float = Field(
        0.8, gt=0, le=1,
        description="Admitted only when expected to finish within this share of the time left to its deadline (the "
        "rest is margin for estimation error).")
    drain_window_s: float = Field(
        10.0, gt=0,
        description="The drain rate: work finished per second of busy time over this window.")
    max_retry_after_s: int = Field(30, ge=1, description="the largest Retry-After it sends (seconds)")
    prior_base_s: float = Field(
        0.15, ge=0,
        description="The cost model's prior (seconds alone = base + per_mp * megapixels + per_line * lines), replaced "
        "as requests that ran alone are measured.")
    prior_s_per_mp: float = Field(0.2, ge=0, description="(see prior_base_s)")
    prior_s_per_line: float = Field(0.006, ge=0, description="(see prior_base_s)")
    prior_s_per_tile: float = Field(
        0.1, ge=0,
        description="Each detector tile past the first (a long image) adds this much work (not learned).")
    model_drift: float = Field(
        4.0, ge=1,
        description="Learning is bounded: a page's learned cost is used within this many times of the prior's for its "
        "size, either way, and only answers that read text teach the model (blank pages do not).")
    s_per_picture_mp: float = Field(
        0.05, ge=0,
        description="A `visualize` picture adds this much work per megapixel (not learned).")
    min_turned_share: float = Field(
        0.1, ge=0, le=1,
        description="With page orientation on, at least this share of pages is priced as read twice (turned); more "
        "once more are seen turned.")
    max_request_share: float = Field(
        0.5, gt=0, le=1,
        description="One request's own estimated work at most, as a share of max_queued_cost_s, even to an empty "
        "ledger: more is a 503 that names the jobs API (POST /v1/ocr/jobs), for a big document, say.")
    client_share: float = Field(
        0.5, gt=0, le=1,
        description="A fair share per client (its address): while other clients have been seen within "
        "client_window_s, one client holds at most max(client_share, 1 / active clients) of the ledger "
        "and of ingress.max_in_flight; a client alone may use all of both.")
    client_window_s: float = Field(
        10.0, gt=0,
        description="a client counts as active this long after its last request")
    header_bytes: int = Field(
        256 * 1024, ge=1024,
        description="Image headers are read from at most this many bytes at the door, off the event loop.")


class IngressArgs(_Args):
    """Admission control and deadlines at the HTTP edge."""

    max_in_flight: int = Field(
        32, ge=1,
        description="Synchronous requests one ingress replica works on at once; more get 503 with Retry-After instead "
        "of waiting in an unbounded queue.")
    retry_after_s: int = Field(
        1, ge=1,
        description="Retry-After (seconds) of the count limit's and the body budget's 503s")
    max_submits_in_flight: int = Field(
        64, ge=1,
        description="Job submits one ingress replica works on at once (reading is not counted: see body_timeout_s); "
        "more get 503.")
    default_timeout_s: float = Field(
        120.0, gt=0,
        description="Deadline for a request that names none (X-Request-Timeout, seconds).")
    max_timeout_s: float = Field(600.0, gt=0, description="the longest X-Request-Timeout accepted (more: 400)")
    auth_token_env: Optional[str] = Field(
        None,
        description="Bearer-token authentication for /v1/* and the API docs: the name of an environment variable (in "
        "the ingress replica) holding the token. None = off, which the ingress accepts only when Serve "
        "listens on loopback (127.0.0.1, localhost, ::1) or allow_anonymous is true.")
    allow_anonymous: bool = Field(False, description="(see auth_token_env)")
    client_tokens_env: Optional[str] = Field(
        None,
        description="Per-client tokens: the name of an environment variable holding NAME:TOKEN pairs (commas or "
        "spaces between). Each is accepted as the bearer token, and names its holder as a client for the "
        "fair shares (serve_app/http/clients.py); else a client is its address.")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Proxies trusted to say who the client is (addresses or networks): from one of these, the client "
        "is the rightmost X-Forwarded-For entry that is not one. Empty (the default): the TCP peer, never "
        "a header.")
    body_timeout_s: float = Field(
        10.0, gt=0,
        description="A request body must arrive within this many seconds (or the request's own deadline, if shorter), "
        "else 408; a body being read holds no in-flight slot. Bodies being read or worked on hold at most "
        "max_body_bytes in all (more: 503).")
    max_body_bytes: int = Field(512 * 1024 * 1024, ge=1, description="(see body_timeout_s)")
    ready_cache_s: float = Field(
        1.0, ge=0,
        description="/readyz answers at once from the last probe of the stages, which a background task repeats "
        "every this many seconds while /readyz is asked.")
    ready_timeout_s: float = Field(
        3.0, gt=0,
        description="A probe of the stages not answered within this many seconds counts as not ready (503): with no "
        "live pipeline replica, Serve would hold the probe until one starts, and /readyz would hang "
        "instead of answering.")
    stats_cache_s: float = Field(
        1.0, ge=0,
        description="GET /v1/stats (the page's live view): answered from figures gathered at most this many seconds "
        "ago; its request history is kept per bucket of stats_bucket_s seconds over the last "
        "stats_span_s.")
    stats_bucket_s: float = Field(5.0, gt=0, description="(see stats_cache_s)")
    stats_span_s: float = Field(600.0, gt=0, description="(see stats_cache_s)")
    max_batch_items: int = Field(
        32, ge=1, le=1000,
        description="POST /v1/ocr/batch: items per request at most (more: 413), and items of one request sent to the "
        "pipeline at once (the batch holds one in-flight slot; the whole body is under the one body size "
        "limit).")
    batch_concurrency: int = Field(4, ge=1, description="(see max_batch_items)")
    max_answer_bytes: int = Field(
        32 * 1024 * 1024, ge=1024,
        description="A synchronous answer (POST /v1/ocr, in any format) at most this many bytes (more: 413 naming the "
        "jobs API); a job's result has its own bound (jobs.max_result_bytes).")
    render_workers: int = Field(
        1, ge=1,
        description="Text/hOCR/ALTO written off the loop by render_workers threads with render_waiting more waiting "
        "(more: 503); sends of job results over large_result_bytes at most max_large_reads at once (more: "
        "503).")
    render_waiting: int = Field(4, ge=0, description="(see render_workers)")
    large_result_bytes: int = Field(4 * 1024 * 1024, ge=1, description="(see render_workers)")
    max_large_reads: int = Field(2, ge=1, description="(see render_workers)")
    max_large_submits: int = Field(
        1, ge=1,
        description="Job submits whose Content-Length is at least large_result_bytes read at once (more: 503 with "
        "Retry-After before the body is read).")
    answer_cache_bytes: int = Field(
        64 * 1024 * 1024, ge=0,
        description="Job results as sent (JSON, text, hOCR, ALTO) kept in the ingress, at most this many bytes (least "
        "recently used go first): made once however many read them, each reader streamed the one copy "
        "(serve_app/http/policies/answers.py); 0: made for every read, still once for readers at the same time.")
    answer_bytes_per_s: int = Field(
        16 * 1024 * 1024, ge=0,
        description="Job results over 256 KiB are streamed at most this many bytes a second, all readers together, so "
        "that sending them is a bounded share of the ingress's CPU and memory (0: unpaced).")
    admission: AdmissionArgs = Field(
        AdmissionArgs(),
        description="Admission by cost, inside the count limit above (serve_app.http.policies.admission).")


class CacheArgs(_Args):
    """Identical work done once (serve_app.http.policies.result_cache), per ingress
    replica: results of the sync route and the handle API, keyed by image
    bytes, options and model identity."""

    max_bytes: int = Field(64 * 1024 * 1024, ge=0,
                           description="bytes of results kept (least recently used go first); 0: no result cache")
    ttl_s: float = Field(300.0, gt=0, description="how long a result is kept")
    share_in_flight: bool = Field(True, description="identical concurrent requests wait on one computation")


STAGES = ("detector", "classifier", "recognizer")


def _given(value: Any) -> dict[str, Any]:
    """The settings a config wrote (a dict as written, or a model's
    explicitly set fields)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    return dict(value)


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, nested mappings (tensorrt) key by key."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(value, (dict, BaseModel)) and isinstance(below, dict):
            out[key] = _overlay(below, _given(value))
        else:
            out[key] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


class AppArgs(_Args):
    """The `args:` block of an application in deployments.yaml."""

    engine: EngineConfig = Field(
        EngineConfig(predictor=PredictorOptions(enable_openvino_engine=True)),
        description="The in-process engine: model files, stage parameters, limits and the default predictor options.")
    models: list[str] = Field(
        ["ppocrv4_mobile"],
        description="The model sets this application serves (serve_app.core.model_sets); the first is the default (a "
        "request naming none). Each set has its own detector and recogniser (deployments of their own, or "
        "predictors in the pipeline's process with recognizer.with_pipeline), all loaded and warmed "
        "before the application is ready; the direction classifier is shared. engine's settings apply to "
        "every set, each set's own detector thresholds and normalisation filling what engine does not "
        "name.")
    ingress: IngressArgs = Field(IngressArgs(), description="Admission control and deadlines at the HTTP edge.")
    cache: CacheArgs = Field(CacheArgs(), description="Identical work done once: the ingress's result cache.")
    jobs: JobArgs = Field(
        JobArgs(),
        description="The job book (POST /v1/ocr/jobs): its bounds, its store and its journal.")
    detector: DetectorArgs = Field(DetectorArgs(), description="How the TextDetector deployment's replicas run.")
    classifier: ClassifierArgs = Field(
        ClassifierArgs(),
        description="How the DirectionClassifier deployment's replicas run.")
    recognizer: RecognizerArgs = Field(
        RecognizerArgs(),
        description="How the TextRecognizer deployment's replicas run.")
    lanes: LaneArgs = Field(
        LaneArgs(),
        description="Priority lanes: interactive work first, bulk in the spare capacity.")

    @field_validator("models")
    @classmethod
    def _served(cls, v: list[str]) -> list[str]:
        from serve_app.core.model_sets import check_served

        return check_served(v)

    def engines(self) -> dict[str, EngineConfig]:
        """Each served set's engine config, the default first."""
        from serve_app.core.engine_config import for_model

        return {name: for_model(self.engine, name) for name in self.models}

    @model_validator(mode="after")
    def _pipeline_beside_models(self) -> "AppArgs":
        if self.recognizer.with_pipeline and not (
                self.detector.beside_recognizer and (self.classifier.beside_recognizer or not self.engine.cls.enabled)):
            raise ValueError("recognizer.with_pipeline needs detector.beside_recognizer: true and "
                             "classifier.beside_recognizer: true (or engine.cls.enabled: false): "
                             "the pipeline then calls every stage in its own process")
        return self

    @model_validator(mode="before")
    @classmethod
    def _stage_predictors_overlay(cls, data: Any) -> Any:
        """A stage's `predictor` is laid over engine.predictor, so a value
        has one home (the GPU profile says `device: gpu` once). The merged
        options are validated as a whole: `tensorrt` in a stage is valid
        when the engine's device is gpu."""
        if not isinstance(data, dict) or not any(
                isinstance(data.get(s), (dict, BaseModel)) and _given(data[s]).get("predictor") is not None
                for s in STAGES):
            return data
        engine = data.get("engine", cls.model_fields["engine"].default)
        try:
            engine = engine if isinstance(engine, EngineConfig) else EngineConfig.model_validate(engine)
        except ValidationError:
            return data  # reported by the field's own validation, with its path
        base = engine.predictor.model_dump()
        out = dict(data)
        for stage in STAGES:
            block = data.get(stage)
            if not isinstance(block, (dict, BaseModel)):
                continue
            given = _given(block)
            top = given.get("predictor")
            if top is None or not isinstance(top, (dict, BaseModel)):
                continue
            out[stage] = {**given, "predictor": _overlay(base, _given(top))}
        return out
