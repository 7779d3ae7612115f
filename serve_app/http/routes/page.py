"""The routes of the page and the probes: GET /healthz, /readyz, the web page
(/, /ui and its files) and the live figures (/v1/stats)."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from serve_app.core.errors import NotFound
from serve_app.http.routes.deps import V1, CurrentFront
from serve_app.http.ui import page_config, static_file

router = APIRouter()

# The page loads only its own script and style, shows pictures from data:
# and blob: URLs (the answer's visualization, the chosen file) and talks
# only to this service; nothing may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/healthz", summary="Alive")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz", summary="Every model loaded and warmed")
async def readyz(front: CurrentFront):
    """Open (for probes), but cheap: one probe of the stages at a time,
    its answer reused for ingress.ready_cache_s."""
    stages = await front.ready()
    ready = bool(stages) and all(stages.values())
    return JSONResponse({"ready": ready, "stages": stages}, status_code=200 if ready else 503)


# -- the web page and its live view --------------------------------------
# The page holds no secret, so it is open like /healthz; what it calls
# (/v1/ocr, /v1/stats) carries the token the person types in.
# Served at / and /ui alike: both resolve the page's relative URLs
# (ui/app.js, v1/ocr) under the app's route prefix.
@router.get("/", include_in_schema=False)
async def root():
    return page_file("index.html")


@router.get("/ui", include_in_schema=False)
async def ui_page():
    return page_file("index.html")


@router.get("/ui/options.json", include_in_schema=False)
async def ui_options():
    return JSONResponse(page_config())


@router.get("/ui/{name}", include_in_schema=False)
async def ui_file(name: str):
    return page_file(name)


def page_file(name: str) -> Response:
    found = static_file(name)
    if found is None:
        raise NotFound(f"no page file {name!r}")
    content, media = found
    return Response(content, media_type=media, headers={"Cache-Control": "no-cache", **PAGE_HEADERS})


@router.get("/v1/stats", dependencies=V1, summary="Live figures: replicas, queues, batches, recent requests")
async def http_stats(front: CurrentFront):
    """What the page's live view draws. Cheap under any polling: one
    gathering at a time, its answer reused for ingress.stats_cache_s.
    The history is this ingress replica's (one by default)."""
    return JSONResponse(await front.stats())
