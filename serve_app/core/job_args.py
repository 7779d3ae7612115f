"""The job book's and the priority lanes' typed arguments (the `jobs:` and
`lanes:` blocks of an application's args: serve_app.core.app_args.AppArgs),
and the strict base every args model shares. Pydantic, no Ray import."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_public_url(url: Optional[str]) -> Optional[str]:
    from urllib.parse import urlsplit

    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"jobs.callbacks.public_url is {url!r}: give the service's base URL, "
                         f"e.g. https://ocr.example.com")
    return url.rstrip("/")


class CallbackArgs(_Args):
    """Job callbacks (`callback_url`; serve_app.jobs.callbacks): signed
    events POSTed when a job ends, retried until delivered or given up."""

    secret_env: str = Field("OCR_WEBHOOK_SECRET", description="the environment variable holding the signing "
                            "secret of clients without a name (no named token), in the Standard Webhooks "
                            "`whsec_<base64>` form (24 to 64 bytes; checked at start), where the JobStore runs; "
                            "two, space-separated, during a rotation (each signs); unset: such a client's "
                            "callback_url is a 400")
    client_secret_envs: dict[str, str] = Field(
        {}, description="each named client's own signing secret: token name (ingress.client_tokens_env) -> the "
        "environment variable holding it (same form as secret_env). A named client without one may not name a "
        "callback_url (400): a receiver holding one client's secret never verifies another's event")
    public_url: Optional[str] = Field(
        None, description="the service's address as its clients reach it (`https://ocr.example.com`): an event's "
        "data.url is this + the job's path, never built from a request's Host header. None: the address Serve's "
        "HTTP proxy listens on (http_options)")
    retry_s: tuple[float, ...] = Field(
        (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0),
        description="pauses before each retry of a delivery that got no 2xx answer (any other status, a timeout, a "
        "refused connection), each with the same webhook-id; after the last, it is given up. The default spans "
        "about 17 hours")
    allow: tuple[str, ...] = Field(
        (), description="callback targets allowed although their address is not global (loopback, private, "
        "link-local, ...): an address with its port (`10.0.0.5:8443`, `[fd00::5]:8443`), a network (`10.0.0.0/24`, "
        "host bits unset) or a host name (`hooks.internal:8443`: resolved at start into the addresses it allows); "
        "an entry without a port opens every port there (logged at start)")
    concurrency: int = Field(8, ge=1, description="deliveries in flight at once per JobStore replica; the rest "
                             "wait their turn (a slow receiver holds one of them, never a job worker)")
    per_target: int = Field(2, ge=1, description="deliveries in flight at once to one host (per JobStore replica): "
                            "a slow receiver with many events holds at most this many of the concurrency places")
    timeout_s: float = Field(10.0, gt=0, description="one delivery's time to connect, send and get the answer's "
                             "status; longer is a failed attempt")
    max_pending: int = Field(10000, ge=1, description="deliveries not yet delivered or given up that the book "
                             "holds; a new job with a callback_url past it is a 503")
    max_pending_per_client: Optional[int] = Field(
        None, ge=1, description="of those, one client's (a 503 past it): one client's black-holed targets never "
        "fill the book for the others. None: a tenth of max_pending")

    _public_url = field_validator("public_url")(_check_public_url)


class JobArgs(_Args):
    ttl_s: float = Field(3600, gt=0, description="how long a finished job's result is kept")
    capacity: int = Field(1000, ge=1, description="unfinished jobs (queued or running) held at once")
    max_queued_bytes: int = Field(1024 * 1024 * 1024, ge=1,
                                  description="image bytes of unfinished jobs held at once (more: 503)")
    max_finished: int = Field(10000, ge=1, description="finished jobs' results kept; the oldest go first")
    max_finished_bytes: int = Field(512 * 1024 * 1024, ge=1,
                                    description="bytes of finished jobs' results kept, counted as stored (their "
                                    "JSON, UTF-8)")
    client_share: float = Field(0.1, gt=0, le=1, description="the part of max_finished and of max_finished_bytes "
                                "one client's finished results may hold (client: the bearer token, else the "
                                "address). Before its TTL a result is dropped only when its client is over its "
                                "share, or when the store is over its bounds with every client within its share "
                                "(then the biggest holder's oldest). Also the part of capacity and of max_queued_bytes one client's "
                                "unfinished jobs may hold while another client has jobs in the book; a client alone "
                                "may fill it but one share, kept for the next client")
    max_result_bytes: int = Field(32 * 1024 * 1024, ge=1, description="one job's result (JSON bytes): a job "
                                  "whose result is bigger fails with `result_too_large` (split the document)")
    backend: Literal["sqlite", "redis"] = Field(
        "sqlite", description="where the job book lives: `sqlite` (the journal file, one JobStore replica, one "
        "machine) or `redis` (a Redis server shared by several JobStore replicas; a cluster needs no shared "
        "file system)")
    redis_url_env: str = Field("OCR_REDIS_URL", description="backend redis: the environment variable holding "
                               "the server's URL (redis://[:password@]host:port/db)")
    redis_fsync: Literal["always", "everysec", "any"] = Field(
        "always", description="backend redis: the AOF policy the server must have (CONFIG GET appendonly, "
        "appendfsync, checked at start). `always`: a job is on the server's disk before its 202 (else the "
        "store refuses to start); `everysec`: up to a second of accepted jobs may be lost if the server's "
        "machine dies (a warning unless the server has it); `any`: not checked (a server without CONFIG)")
    lease_s: float = Field(30.0, gt=0, description="backend redis: a running job's lease, renewed while it runs; "
                           "a job whose worker died runs again on another replica after this long")
    max_claims: int = Field(4, ge=1, description="backend redis: a job whose worker died this many times (a job "
                            "that kills its replica) fails with `internal` instead of running again")
    job_timeout_s: float = Field(600.0, gt=0, description="one attempt of a job longer than this fails it")
    overloaded_wait_s: float = Field(
        1800.0, ge=0, description="a job whose attempt meets `overloaded` (the PDF children or the pipeline are "
        "full) is tried again after a growing pause (2 s doubling to 60 s, or the service's Retry-After if longer) "
        "until it has waited this long in all; then it fails with `overloaded`")
    concurrency: int = Field(8, ge=1, description="jobs sent to the pipeline at once")
    callbacks: CallbackArgs = Field(CallbackArgs(), description="signed callbacks when a job ends "
                                    "(docs/jobs.md#callbacks)")
    journal: Optional[str] = Field(
        None, description="SQLite file holding every accepted job until it expires, so that a restarted store "
        "loses none (unfinished ones run again). `{app}` in it is replaced by the application's name and "
        "`{uid}` by the user id, so that two services do not share one file; its folder is made 0700 and the "
        "file 0600. It must be reachable by the restarted replica: on a multi-node cluster, shared storage, "
        "or the JobStore pinned to one node. None: jobs are in memory only.")


class LaneArgs(_Args):
    """Priority lanes (serve_app.core.lanes): interactive work first, bulk in the
    spare capacity, bulk never starved longer than bulk_max_wait_s per queue."""

    enabled: bool = Field(True, description="false: one lane for everything (the service as before lanes)")
    bulk_max_wait_s: float = Field(
        5.0, gt=0, description="a bulk item that has waited this long at one queue (the job queue, the pipeline's "
        "bulk gate, a stage's gate, the crop scheduler) is served as interactive")
    bulk_fill: bool = Field(
        False, description="bulk crops fill the spare places of a recogniser predictor batch led by interactive "
        "work: more bulk throughput, but on a CPU a batch's time grows with its crops, so interactive waits longer "
        "(on a GPU it is nearly free)")
    bulk_depth: int = Field(1, ge=1, le=2, description="recogniser predictor batches handed to the predictor at "
                            "once while only bulk crops are pending (2 when interactive work leads): 1 keeps an "
                            "arriving interactive request behind at most one bulk batch")
    det_bulk_batch: int = Field(1, ge=1, description="bulk images in the detector's batch queue at once (of its "
                                "max_batch_size): a batch runs to its end, so an interactive image that arrives "
                                "waits for at most this many bulk images")
    bulk_in_stages: int = Field(1, ge=1, description="bulk images (or PDF pages) one pipeline replica has in the "
                                "model stages at once: bulk never fills a stage's max_ongoing_requests, and on a "
                                "few cores an interactive request waits behind little bulk work in each stage")
    bulk_max_in_flight: int = Field(16, ge=1, description="bulk synchronous requests one ingress replica works on at "
                                    "once (more: 503); the rest of ingress.max_in_flight stays for interactive")
