"""The single-process OCR server a user would write first: `serve load`'s
baseline (load_tests/bench.py). One process, one ``OcrEngine`` (all
cores), FastAPI + uvicorn, an ``asyncio.Lock`` around ``engine.read`` (in
a worker thread, so the loop keeps accepting). ``POST /v1/ocr`` as the
service for what the benchmark sends (multipart ``file`` or the raw body);
the answer ``{request_id, image, results, timings_ms}`` (``lock_wait``: the
time queued), errors ``{request_id, error: {code, message}}`` with the
service's status codes; ``GET /healthz``, ``GET /readyz`` (200 once loaded).

    .venv/bin/python -m load_tests.simple_server --port 8712"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager


from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from serve_app.core.errors import OcrError
import sys
from load_tests.cli import standalone

log = logging.getLogger("simple_server")
state: dict = {"engine": None}
lock = asyncio.Lock()


@asynccontextmanager
async def lifespan(app: FastAPI):
    from serve_app.engine import OcrEngine

    t0 = time.perf_counter()
    state["engine"] = await asyncio.to_thread(OcrEngine)
    log.warning("engine loaded in %.1fs", time.perf_counter() - t0)
    try:
        yield
    finally:
        state["engine"].close()


app = FastAPI(title="simple OCR server (benchmark baseline)", lifespan=lifespan)


def error(status: int, code: str, message: str, request_id: str) -> JSONResponse:
    return JSONResponse({"request_id": request_id, "error": {"code": code, "message": message}}, status_code=status)


@app.post("/v1/ocr")
async def ocr(request: Request):
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        try:
            form = await request.form()
        except Exception:
            return error(400, "bad_request", "malformed multipart body", request_id)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            return error(400, "bad_request", "multipart body has no file field named `file`", request_id)
        data = await upload.read()
    elif ctype.startswith("image/") or ctype == "application/octet-stream":
        data = await request.body()
    else:
        return error(415, "unsupported_media_type", f"unsupported Content-Type {ctype!r}", request_id)
    t_wait = time.perf_counter()
    try:
        async with lock:
            waited = (time.perf_counter() - t_wait) * 1000
            result = await asyncio.to_thread(state["engine"].read, data)
    except OcrError as e:
        return error(e.status, e.code, e.message, request_id)
    except Exception:
        log.exception("request %s failed", request_id)
        return error(500, "internal", "internal error; the request was not completed", request_id)
    body = {"request_id": request_id, **result.to_dict()}
    body["timings_ms"]["lock_wait"] = round(waited, 2)
    return JSONResponse(body)


@app.get("/healthz")
async def healthz():
    return {"status": "ok"}


@app.get("/readyz")
async def readyz():
    ready = state["engine"] is not None
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8712)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    sys.exit(standalone(__name__))
