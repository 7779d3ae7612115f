"""Asynchronous OCR jobs. The store is its own deployment, not the ingress:
an ingress restart loses no job, and the store runs the jobs itself, through
the pipeline handle. Two backends (`jobs.backend`):
- `sqlite` (the default, one machine, one replica): with a journal
  (`jobs.journal`, a SQLite file) a restart of the store loses no job: the
  new replica reads the file, runs the unfinished jobs again and keeps
  serving the finished ones' results;
- `redis` (a cluster): the book is on a Redis server (its URL in the
  environment variable jobs.redis_url_env, OCR_REDIS_URL by default), shared
  by any number of store replicas on any nodes; a job whose replica died
  runs again on another (serve_app.jobs.redis_book).

The logic is serve_app.jobs.book.JobBook; this deployment owns its lifecycle:
the workers start with the replica and stop with it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Callable, Optional

from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.core.errors import ConfigError
from serve_app.jobs.book import JobBook
from serve_app.jobs.dispatch import job_client
from serve_app.jobs.journal import journal_path
from serve_app.core.lanes import BULK, lane_of
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.serving.payloads import sized
from serve_app.core.request_context import RequestContext
from serve_app.core.app_args import JobArgs, LaneArgs
from serve_app.flow.upload import upload_of


def proxy_url() -> str:
    """The address Serve's HTTP proxy serves on (http_options; a wildcard
    host as 127.0.0.1), the default jobs.callbacks.public_url."""
    try:
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "", None) else config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{config.port}"
    except Exception:  # noqa: BLE001  no Serve client here: Serve's default
        return "http://127.0.0.1:8000"


# One replica by default: with the sqlite backend the store holds the jobs (a
# second replica would not see the first one's). With `jobs.backend: redis`
# the Serve config may give it several. Resources are in the config file.
@serve.deployment(name="JobStore", num_replicas=1)
class JobStore:
    async def __init__(self, pipeline: DeploymentHandle, args: JobArgs, lanes: LaneArgs = LaneArgs()):
        # async: Serve runs it in the replica's event loop, where the workers
        # must live; jobs recovered from the journal start running at once.
        self.pipeline = pipeline
        self.args = args
        from serve_app.serving.metrics import LaneMetrics

        app_name = serve.get_replica_context().app_name
        if args.callbacks.public_url is None:  # an event's data.url: where Serve's HTTP proxy listens
            args = args.model_copy(update={"callbacks": args.callbacks.model_copy(
                update={"public_url": proxy_url()})})
        if args.backend == "redis":
            from serve_app.jobs.redis_book import RedisJobBook
            from serve_app.jobs.redis_scripts import redis_prefix

            url = os.environ.get(args.redis_url_env, "")
            if not url:
                raise ConfigError(f"jobs.backend is redis, but the environment variable {args.redis_url_env} "
                                  f"(jobs.redis_url_env) is empty: set it to the server's URL, e.g. "
                                  f"redis://127.0.0.1:6379/0, in the shell that runs `serve` or in runtime_env")
            self.book = RedisJobBook(self._run, args, lanes, LaneMetrics("jobs"), url=url,
                                     prefix=redis_prefix(app_name))
        else:
            if args.journal:
                args = args.model_copy(update={"journal": journal_path(args.journal, app_name)})
            self.book = JobBook(self._run, args, lanes, LaneMetrics("jobs"))
        await self.book.start()

    async def _run(self, image: Any, options: OcrOptions, progress: Callable[..., None]) -> dict:
        # The attempt's deadline goes along: what is still queued for it in
        # the replicas when the job times out is dropped there. A PDF is
        # read as a stream of progress reports ending in its result.
        upload = upload_of(image)  # what it is was decided when it was submitted; bytes from the journal: again
        ctx = RequestContext("", time.time() + self.args.job_timeout_s, lane_of(options.priority, BULK),
                             job_client())  # its work takes its client's turns in the stages
        pipeline = sized(self.pipeline, upload.data)  # big images by reference (serve_app/serving/payloads.py)
        if not upload.is_document:
            return await pipeline.ocr.remote(upload, options, ctx)
        stream = pipeline.options(stream=True).ocr_progress.remote(upload, options, ctx)
        try:
            async for event in stream:
                if "result" in event:
                    return event["result"]
                progress(event["pages_done"], event["pages_total"], event.get("pages", ()))
        finally:
            stream.cancel()  # a no-op once the stream has ended; else the job timed out or the store stops
        raise RuntimeError("the pipeline's stream ended without a result")

    async def submit(self, image: Any, options: Optional[OcrOptions | dict],
                     idempotency_key: Optional[str] = None, client: str = "",
                     callback_url: Optional[str] = None) -> dict:
        """A new job's view ({"job_id", "status"}), or the existing one for a
        known idempotency key. Options: an OcrOptions (the ingress parses
        them) or a dict. A job's lane is bulk unless its options say
        `priority: interactive`; it is kept in the job's options (journal
        included) and goes with its pipeline call. `client`
        (serve_app/http/clients.py; the ingress passes it) names whose share of
        the result store the job's result counts against. `callback_url`:
        a signed event is POSTed there when the job ends (serve_app.jobs.callbacks;
        a refused target or no signing secret: BadRequest before it is
        accepted); its data.url is jobs.callbacks.public_url + the job's path."""
        return await self.book.submit(image, parse_options(options).with_lane(BULK), idempotency_key,
                                      client or "handle", callback_url)

    async def get(self, job_id: str) -> Optional[dict]:
        """The job's view, its result parsed (in a worker thread, not on
        the loop that serves every other call)."""
        raw = await self.book.get_raw(job_id)
        if raw is None:
            return None
        head, blob = raw
        return head if blob is None else {**head, **await asyncio.to_thread(json.loads, blob)}

    async def get_raw(self, job_id: str) -> Optional[tuple[dict, Optional[bytes]]]:
        """(status fields, the stored result's JSON bytes), nothing parsed:
        HTTP serves the bytes as they are (serve_app.jobs.state.job_body)."""
        return await self.book.get_raw(job_id)

    async def page(self, job_id: str, number: int) -> Optional[tuple[dict, Optional[bytes]]]:
        """A job's page `number` (1-based) as its JSON bytes once that page
        is read (while the job runs; None before, and once it has ended:
        its result holds the pages then), with the job's status fields
        ({"status", "pages_done", "pages_total"}); None for an unknown job."""
        return await self.book.page(job_id, number)

    async def head(self, job_id: str) -> Optional[tuple[dict, Optional[int]]]:
        """(status fields, the stored result's size in bytes or None), the
        result not sent: the ingress fetches the bytes (get_raw) only to
        make an answer it does not keep (serve_app/http/policies/answers.py)."""
        raw = await self.book.get_raw(job_id)
        if raw is None:
            return None
        head, blob = raw
        return head, None if blob is None else len(blob)

    async def counts(self) -> dict[str, int]:
        return await self.book.acounts()

    async def check_health(self) -> None:
        """Dead workers are replaced; a journal that cannot be read or
        written makes the replica unhealthy (Serve replaces it)."""
        await self.book.health()

    def __del__(self):
        book = getattr(self, "book", None)  # absent if __init__ failed
        if book is not None:
            book.close()
