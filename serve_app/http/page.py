"""The routes of the page and the probes: GET /healthz, /readyz, the web page
(/, /ui and its files) and the live figures (/v1/stats). A mixin of
OcrIngress (serve_app/http/ingress.py), on the one FastAPI app."""

import asyncio
import time
from typing import Any, Optional

from fastapi.responses import JSONResponse, Response
from ray import serve

from serve_app.core.errors import NotFound
from serve_app.serving.live_stats import deployment_summary, stage_summary
from serve_app.http.ui import page_config, static_file
from serve_app.http.api import PAGE_HEADERS, V1, api, log


class Reused:
    """A value made by one call at a time and reused for `ttl_s` seconds
    (readiness, the live figures): cheap under any polling. A caller that
    goes away does not cancel the call the others wait on."""

    def __init__(self, make):
        self.make = make
        self.last: Optional[tuple[float, Any]] = None  # (when, value) of the last call
        self.call: Optional[asyncio.Future] = None

    async def get(self, ttl_s: float) -> Any:
        if self.last is None or time.monotonic() - self.last[0] > ttl_s:
            if self.call is None or self.call.done():
                self.call = asyncio.ensure_future(self.make())
            value = await asyncio.shield(self.call)
            self.last = (time.monotonic(), value)
        return self.last[1]


class PageRoutes:
    """Health, readiness, the web page and the live stats."""

    @api.get("/healthz", summary="Alive")
    async def healthz(self):
        return {"status": "ok"}

    async def _probe_ready(self) -> dict:
        try:
            return await self.pipeline.ready.remote()
        except Exception:
            return {}

    @api.get("/readyz", summary="Every model loaded and warmed")
    async def readyz(self):
        """Open (for probes), but cheap: one probe of the stages at a time,
        its answer reused for ingress.ready_cache_s."""
        stages = await self._ready.get(self.args.ready_cache_s)
        ready = bool(stages) and all(stages.values())
        return JSONResponse({"ready": ready, "stages": stages}, status_code=200 if ready else 503)

    # -- the web page and its live view --------------------------------------
    # The page holds no secret, so it is open like /healthz; what it calls
    # (/v1/ocr, /v1/stats) carries the token the person types in.
    # Served at / and /ui alike: both resolve the page's relative URLs
    # (ui/app.js, v1/ocr) under the app's route prefix.
    @api.get("/", include_in_schema=False)
    async def root(self):
        return self._static("index.html")

    @api.get("/ui", include_in_schema=False)
    async def ui_page(self):
        return self._static("index.html")

    @api.get("/ui/options.json", include_in_schema=False)
    async def ui_options(self):
        return JSONResponse(page_config())

    @api.get("/ui/{name}", include_in_schema=False)
    async def ui_file(self, name: str):
        return self._static(name)

    def _static(self, name: str) -> Response:
        found = static_file(name)
        if found is None:
            raise NotFound(f"no page file {name!r}")
        content, media = found
        return Response(content, media_type=media, headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    async def _gather_stats(self) -> dict:
        """Replica states from Serve's controller, and each model stage's
        replicas' stats() through the pipeline (each asked about twice as
        often as it has replicas running, at most 8 times)."""
        app = serve.get_replica_context().app_name
        try:
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), timeout=3.0)
            deployments = deployment_summary(status.applications[app].deployments)
        except Exception as e:  # the live view shows what it got
            log.warning("live view: no deployment status: %s", e)
            deployments = {}
        names = {"det": "TextDetector", "cls": "DirectionClassifier", "rec": "TextRecognizer"}
        calls = {s: min(8, 2 * max(1, deployments.get(n, {}).get("running", 1))) for s, n in names.items()}
        try:
            stages = await asyncio.wait_for(self.pipeline.stats.remote(calls), timeout=5.0)
        except Exception as e:
            log.warning("live view: no stage stats: %s", e)
            stages = {}
        now = time.time()
        return {
            "time": now,
            "app": app,
            "deployments": deployments,
            "stages": {s: {"deployment": home(names.get(s, s), deployments), **stage_summary(r, now)}
                       for s, r in stages.items()},
            "ingress": {"in_flight": self.in_flight, "max_in_flight": self.args.max_in_flight,
                        "bulk_in_flight": self.bulk_in_flight,
                        "job_submits_in_flight": self.submitting, "admission": self.admission.snapshot(),
                        "cache": self.dedupe.stats()},
            "history": {"bucket_s": self.history.bucket_s, "buckets": self.history.snapshot(now)},
        }

    @api.get("/v1/stats", dependencies=V1, summary="Live figures: replicas, queues, batches, recent requests")
    async def http_stats(self):
        """What the page's live view draws. Cheap under any polling: one
        gathering at a time, its answer reused for ingress.stats_cache_s.
        The history is this ingress replica's (one by default)."""
        return JSONResponse(await self._stats.get(self.args.stats_cache_s))


def home(name: str, deployments: dict) -> str:
    """The deployment whose replicas run a stage: its own, else the
    recogniser's (detector/classifier.beside_recognizer), else the
    pipeline's (recognizer.with_pipeline). Unknown deployments: its own."""
    if not deployments or name in deployments:
        return name
    return "TextRecognizer" if "TextRecognizer" in deployments else "OcrPipeline"
