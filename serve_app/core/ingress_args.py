"""The ingress's typed arguments (the `ingress:` and `cache:` blocks of an
application's args): admission control, deadlines, body and answer limits,
and the result cache. Pydantic, no Ray import; serve_app.core.app_args
gathers them into AppArgs."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from serve_app.core.job_args import _Args


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
    s_per_structure_page: float = Field(
        0.3, ge=0,
        description="Document structure (options.structure, format=markdown) adds this much work per page, its "
        "layout (not learned; scaled by the model set's relative cost).")
    s_per_table: float = Field(
        0.6, ge=0,
        description="... and this much per table region: tables_per_page of them priced per page at the door, the "
        "answer drained at the table regions it had (at most engine.structure.max_tables a page).")
    tables_per_page: float = Field(1.0, ge=0, description="(see s_per_table)")
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
        "and of ingress.max_in_flight; a client alone may use all of the ledger and all but one of the in-flight "
        "slots (kept for a client arriving).")
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
        "every this many seconds while /readyz is asked (every 0.1 s while a stage is not ready, so a start is "
        "seen at once).")
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
        description="Job submits whose Content-Length is at least large_result_bytes (or not given) read at once "
        "(more: 503 with Retry-After before the body is read).")
    submit_bytes_per_s: int = Field(
        16 * 1024 * 1024, ge=0,
        description="The bytes of such large job submits taken per second, all clients together: one is taken when "
        "the ones before it are paid for at this rate, else 503 with Retry-After before its body is read (each "
        "costs the proxy, the ingress and the job store copies of it; 0: unpaced).")
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
