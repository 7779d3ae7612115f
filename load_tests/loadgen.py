"""Load generators. A request function returns a `Record` and never raises
(cancellation aside): success, latency, status and error are recorded.

* request functions: `http_sync` (POST /v1/ocr), `http_job` (POST
  /v1/ocr/jobs, then poll), `serve_handle` (`handle.ocr.remote(bytes)`);
* `closed_loop` (N clients, each sends when its previous answer is in),
  `open_loop` (Poisson arrivals, latency from the scheduled arrival: no
  coordinated omission), `loop_baseline` (a blocking call in this thread).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any, Awaitable, Callable, Optional

from load_tests.images import Img
from harness.procfs import cpu_seconds, cpu_share
from load_tests.stats import Record


def now() -> float:
    return time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


Send = Callable[[Img, Optional[float]], Awaitable[Record]]


# --------------------------------------------------------------------------
# request functions


async def http_sync(session, base: str, img: Img, timeout_s: float, t_send: Optional[float] = None,
                    body: str = "raw") -> Record:
    """POST /v1/ocr with the image as the raw body (or multipart `file`)."""
    import aiohttp

    t0 = now() if t_send is None else t_send
    status, err, timings = 0, None, None
    try:
        if body == "multipart":
            form = aiohttp.FormData()
            form.add_field("file", img.data, filename=img.name, content_type=img.ctype)
            kw: dict = {"data": form}
        else:
            kw = {"data": img.data, "headers": {"Content-Type": img.ctype}}
        async with session.post(f"{base}/v1/ocr", timeout=aiohttp.ClientTimeout(total=timeout_s), **kw) as r:
            status = r.status
            payload = await r.read()
        if status == 200:
            doc = json.loads(payload)
            timings = doc.get("timings_ms")
            if not isinstance(doc.get("results"), list):
                err = "200 without a results list"
        else:
            err = f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}"
    except asyncio.TimeoutError:
        err = f"timeout after {timeout_s:g}s"
    except Exception as e:  # connection refused/reset, bad JSON, ...
        err = f"{type(e).__name__}: {e}"[:300]
    return Record(t0, now(), status, err is None and status == 200, err, img.name, timings)


async def http_job(session, base: str, img: Img, timeout_s: float, t_send: Optional[float] = None,
                   poll_s: float = 0.05, poll_max_s: float = 0.5) -> Record:
    """POST /v1/ocr/jobs (expects 202 {job_id}), then GET /v1/ocr/jobs/{id}
    every poll_s (x1.5 each time, at most poll_max_s) until the job's status is
    succeeded or failed. Latency = submit to the poll that saw it finished
    (so it includes up to one poll interval of delay)."""
    import aiohttp

    t0 = now() if t_send is None else t_send
    deadline = t0 + timeout_s
    status, err, timings, polls = 0, None, None, 0
    try:
        tmo = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(f"{base}/v1/ocr/jobs", data=img.data, headers={"Content-Type": img.ctype},
                                timeout=tmo) as r:
            status = r.status
            payload = await r.read()
        if status not in (200, 201, 202):
            err = f"HTTP {status} on submit: {payload[:200].decode('utf-8', 'replace')}"
        else:
            job_id = json.loads(payload).get("job_id")
            if not job_id:
                err = f"submit answered {status} without a job_id"
            interval = poll_s
            while err is None:
                if now() >= deadline:
                    err = f"timeout after {timeout_s:g}s (job {job_id} not finished)"
                    break
                await asyncio.sleep(min(interval, max(0.0, deadline - now())))
                interval = min(interval * 1.5, poll_max_s)
                polls += 1
                async with session.get(f"{base}/v1/ocr/jobs/{job_id}", timeout=tmo) as r:
                    status = r.status
                    payload = await r.read()
                if status != 200:
                    err = f"HTTP {status} on poll: {payload[:200].decode('utf-8', 'replace')}"
                    break
                doc = json.loads(payload)
                if doc.get("status") == "succeeded":
                    timings = doc.get("timings_ms")
                    break
                if doc.get("status") == "failed":
                    err = f"job failed: {json.dumps(doc.get('error'))[:200]}"
                    break
    except asyncio.TimeoutError:
        err = f"timeout after {timeout_s:g}s"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"[:300]
    return Record(t0, now(), status, err is None and status == 200, err, img.name, timings, polls)


async def serve_handle(handle, img: Img, timeout_s: float, t_send: Optional[float] = None) -> Record:
    """`await handle.ocr.remote(bytes)` from this driver; a raised domain
    error records its HTTP status (0 if it has none)."""
    t0 = now() if t_send is None else t_send
    status, err, timings = 0, None, None
    resp = None
    try:
        resp = handle.ocr.remote(img.data)
        doc = await asyncio.wait_for(awaitable(resp), timeout_s)
        status = 200
        timings = doc.get("timings_ms")
        if not isinstance(doc.get("results"), list):
            err = "answer without a results list"
    except asyncio.TimeoutError:
        err = f"timeout after {timeout_s:g}s"
        if resp is not None:
            try:
                resp.cancel()
            except Exception:
                pass
    except Exception as e:
        cause = getattr(e, "cause", None) or e
        status = int(getattr(cause, "status", 0) or 0)
        err = f"{type(cause).__name__}: {cause}"[:300]
    return Record(t0, now(), status, err is None, err, img.name, timings)


async def awaitable(resp):
    return await resp


class Progress:
    """A status line on stderr: rewritten in place on a terminal, one line
    every 5 s otherwise (logs, CI)."""

    def __init__(self, label: str, total_s: float):
        self.label, self.total_s = label, total_s
        self.t0 = now()
        self.sent = self.done = self.errors = 0
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def record(self, r: Record) -> None:
        self.done += 1
        self.errors += 0 if r.ok else 1

    def line(self) -> str:
        el = now() - self.t0
        return (f"  {self.label}: {el:5.1f}/{self.total_s:.0f}s sent {self.sent} done {self.done} "
                f"errors {self.errors} in flight {self.sent - self.done}")

    def tick(self, force: bool = False) -> None:
        t = now()
        if not force and t - self._last < (1.0 if self.tty else 5.0):
            return
        self._last = t
        if self.tty:
            print("\r" + self.line().ljust(100), end="", file=sys.stderr, flush=True)
        else:
            print(self.line(), file=sys.stderr, flush=True)

    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(0.5)

    def close(self) -> None:
        self.tick(force=True)
        if self.tty:
            print(file=sys.stderr, flush=True)


async def sample_window(sampler: Optional[Any], ws: float, we: float) -> tuple[Optional[dict], Optional[dict]]:
    """(the model stages' batches between ws and we, None without a sampler;
    the CPU use over the window)."""
    await asyncio.sleep(max(0.0, ws - now()))
    c0, t0 = cpu_seconds(), now()
    batches = None
    try:
        if sampler is not None:
            await sampler.begin()
        await asyncio.sleep(max(0.0, we - now()))
        c1, t1 = cpu_seconds(), now()
        if sampler is not None:
            batches = await sampler.end()
    except Exception as e:  # batch sizes are extra information: never fail a load point for them
        log(f"batch sampling failed: {type(e).__name__}: {e}")
        c1, t1 = cpu_seconds(), now()
    return batches, cpu_share(c0, c1, t1 - t0)


async def closed_loop(send: Send, images: list[Img], clients: int, warmup_s: float, duration_s: float,
                      label: str, sampler: Optional[Any] = None
                      ) -> tuple[list[Record], tuple[float, float], tuple[Optional[dict], Optional[dict]]]:
    """N clients, each sending its next image when its previous answer is in.
    Clients start at different offsets of the image list."""
    recs: list[Record] = []
    prog = Progress(label, warmup_s + duration_s)
    t0 = now()
    ws, we = t0 + warmup_s, t0 + warmup_s + duration_s
    batches = asyncio.create_task(sample_window(sampler, ws, we))

    async def client(i: int) -> None:
        k = (i * len(images)) // max(clients, 1)
        while now() < we:
            img = images[k % len(images)]
            k += 1
            prog.sent += 1
            r = await send(img, None)
            recs.append(r)
            prog.record(r)

    ticker = asyncio.create_task(prog.run())
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        ticker.cancel()
        prog.close()
    return recs, (ws, we), await batches


async def open_loop(send: Send, images: list[Img], rate: float, warmup_s: float, duration_s: float,
                    label: str, seed: int = 1, max_in_flight: int = 512,
                    sampler: Optional[Any] = None
                    ) -> tuple[list[Record], tuple[float, float], tuple[Optional[dict], Optional[dict]]]:
    """Poisson arrivals at `rate`/s; latency from the scheduled arrival. Above
    max_in_flight outstanding requests an arrival is recorded as an error
    (the client itself is saturated) instead of being sent."""
    rng = random.Random(seed)
    recs: list[Record] = []
    tasks: set[asyncio.Task] = set()
    prog = Progress(label, warmup_s + duration_s)
    t0 = now()
    ws, end = t0 + warmup_s, t0 + warmup_s + duration_s
    t_next, k = t0, 0
    batches = asyncio.create_task(sample_window(sampler, ws, end))

    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled():
            r = task.result()
            recs.append(r)
            prog.record(r)

    ticker = asyncio.create_task(prog.run())
    try:
        while True:
            t_next += rng.expovariate(rate)
            if t_next >= end:
                break
            delay = t_next - now()
            if delay > 0:
                await asyncio.sleep(delay)
            img = images[k % len(images)]
            k += 1
            prog.sent += 1
            if len(tasks) >= max_in_flight:
                r = Record(t_next, t_next, 0, False, "not sent: client in-flight cap reached", img.name)
                recs.append(r)
                prog.record(r)
                continue
            task = asyncio.create_task(send(img, t_next))
            tasks.add(task)
            task.add_done_callback(done)
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
    finally:
        ticker.cancel()
        prog.close()
    return recs, (ws, end), await batches


def loop_baseline(label: str, call: Callable[[bytes], Optional[dict]], images: list[Img], duration_s: float,
                  min_passes: int = 1, warm: bool = True) -> tuple[list[Record], tuple[float, float], Optional[dict]]:
    """One image at a time, in this thread, until duration_s has passed and
    at least min_passes full passes are done (after one untimed warm-up
    pass). Throughput = answers / elapsed. `call` returns the stage timings
    (ms) if it has them, else None; an exception is a failed call."""
    for img in images if warm else []:  # warm-up: every input shape seen once
        try:
            call(img.data)
        except Exception:
            pass
    recs: list[Record] = []
    prog = Progress(label, duration_s)
    c0, t0 = cpu_seconds(), now()
    k = 0
    while now() - t0 < duration_s or k < min_passes * len(images):
        img = images[k % len(images)]
        k += 1
        prog.sent += 1
        ts = now()
        try:
            timings = call(img.data)
            r = Record(ts, now(), 200, True, None, img.name, timings if isinstance(timings, dict) else None)
        except Exception as e:
            r = Record(ts, now(), 0, False, f"{type(e).__name__}: {e}"[:300], img.name)
        recs.append(r)
        prog.record(r)
        prog.tick()
    t1 = now()
    cpu = cpu_share(c0, cpu_seconds(), t1 - t0)
    prog.close()
    return recs, (t0, t1 + 1e-9), cpu


def post_file(url: str, path, timeout: float = 120, headers: Optional[dict] = None):
    """POST url/v1/ocr with the file at `path` as multipart `file` (blocking)."""
    import requests

    with path.open("rb") as f:
        return requests.post(f"{url}/v1/ocr", files={"file": (path.name, f)}, headers=headers or {}, timeout=timeout)


def threaded_load(url: str, images: list, clients: int, seconds: float, post=post_file) -> dict:
    """`clients` threads, each posting `images` in turn (client k from the
    k-th) for `seconds`; a request that fails is recorded (its exception's
    name), never raised."""
    import collections
    import threading
    from concurrent.futures import ThreadPoolExecutor

    lat, codes, stop = [], collections.Counter(), time.monotonic() + seconds
    lock = threading.Lock()

    def client(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            t = time.perf_counter()
            try:
                code = post(url, images[i % len(images)]).status_code
            except Exception as e:  # noqa: BLE001 - recorded, never raised
                code = type(e).__name__
            with lock:
                lat.append((time.perf_counter() - t) * 1000)
                codes[code] += 1
            i += clients

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(clients, 1)) as pool:
        list(pool.map(client, range(clients)))
    return threaded_summary(clients, lat, codes, time.perf_counter() - t0)


def threaded_summary(clients: int, lat_ms: list[float], codes: dict, wall_s: float) -> dict:
    from load_tests.stats import percentile

    ok = codes.get(200, 0)
    return {"clients": clients, "ok": ok, "img_s": ok / wall_s if wall_s > 0 else 0.0,
            "p50_ms": percentile(lat_ms, 50), "p99_ms": percentile(lat_ms, 99), "codes": dict(codes),
            "clean": bool(ok) and set(codes) == {200}}
