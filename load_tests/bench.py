"""Load tests of the OCR service, with its baselines measured in the same run.

One process runs everything, one phase at a time (nothing else of ours runs
while a phase is measured), on the same images and the same cores:

1. ``engine``: the in-process ``OcrEngine`` in a loop, one image at a time.
2. ``rapidocr``: RapidOCR on onnxruntime (``rapidocr_onnxruntime``) in-process
   in a loop, one image at a time (skipped with a note if not installed).
3. ``simple``: ``load_tests/simple_server.py`` (one process, one engine, a lock
   around ``engine.read``; FastAPI + uvicorn) started as a subprocess on
   ``--simple-port`` and loaded over HTTP like the service.
4. The service: a local Ray cluster of this process's own
   (``ray.init(address="local")``), Serve on ``--port``, and the applications
   of ``--config`` (default ``deployments.yaml``) deployed the way
   ``serve deploy`` does. Measured:

   * ``cold``: Ray start, Serve start, deploy -> ``/readyz`` 200, each model
     replica's load and warm-up time, and the first request's latency.
   * ``http``: ``POST /v1/ocr`` closed loop at ``--clients`` (finds saturation).
   * ``open``: open loop (Poisson arrivals) at ``--open-fraction`` (0.7) of the
     saturation throughput found by ``http`` (or at ``--open-rate``).
   * ``handle``: ``serve.get_app_handle("ocr").ocr.remote(bytes)`` from this
     Ray driver, closed loop.
   * ``jobs``: ``POST /v1/ocr/jobs`` -> 202 ``{job_id}``, then
     ``GET /v1/ocr/jobs/{id}`` polled until succeeded/failed. Probed first: if
     the endpoint is not deployed the phase is skipped with a note
     (``--jobs-force`` runs it anyway; every request then records its 404).
   * ``nobatch``: the same closed loop after redeploying with ``user_config``
     ``max_batch_size: 1`` for the three model deployments (batching off).

Every load point has a warm-up (``--warmup`` s, not recorded) and a
measurement window (``--duration`` s). Closed loop: N clients, each sending
its next image as soon as the previous answer arrives; latency statistics
cover the requests *sent* in the window (each runs to its end), throughput
counts the successful answers *received* in the window. Open loop: arrivals
from a seeded Poisson process, latency measured from the scheduled arrival
time (no coordinated omission); throughput as above. Each target first gets
one untimed pass over the images (every detector input shape seen once), so
every system is measured warm. Mean batch size per model stage comes from
each deployment's ``stats()`` (its last 256 batches), sampled every 2 s
during the window and diffed per replica pid.

The machine may be shared: each point records the load average and "others'
CPU" (cores busy with work outside this process tree, from /proc), and the
report warns when other work, or an engine point slower than the simple
server (the same engine plus HTTP), makes the comparisons untrustworthy.

Outputs: ``<out>/benchmarks.md`` (tables, targets, queueing with the image
mix taken out, low-load latency image by image, where the time goes),
``<out>/img/*.png`` (latency vs throughput; batching on vs off), the raw
per-request records as JSON (``--raw``, default
``load_tests/out/bench_results[_quick].json``), and a one-line summary on
stdout. Progress goes to stderr. ``--from-raw FILE`` measures nothing and
rewrites the report and plots from a recorded run.

Run from the repository root::

    .venv/bin/python load_tests/bench.py --quick               # < 2 min, proves the harness works
    .venv/bin/python load_tests/bench.py --n-images 20 --duration 30 --out docs   # the documented run
    .venv/bin/python load_tests/bench.py --targets handle --clients 1,8   # only the handle sweep

``--quick`` asserts nothing about speed: 3 small images, 0.5 + 2 s points, no
untimed pass for the in-process loops, every phase at one or two load
points, report in ``load_tests/out/quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_IMAGES = REPO / "tests/data/peer"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
CTYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
# --quick: a 14-line photo (several crops: cls/rec batches), a text line, a short German sign.
QUICK_IMAGES = ("rapidocr_ch_en_num.jpg", "rapidocr_text_rec.jpg", "paddleocr_ger_1.jpg")
STAGES = {"det": "TextDetector", "cls": "DirectionClassifier", "rec": "TextRecognizer"}
TIMING_KEYS = ("decode", "det", "cls", "rec", "total")
ALL_TARGETS = ("engine", "rapidocr", "simple", "http", "open", "handle", "jobs", "nobatch")
SERVICE_TARGETS = {"http", "open", "handle", "jobs", "nobatch"}
LABELS = {
    "engine": "engine, in-process",
    "rapidocr": "rapidocr-onnxruntime, in-process",
    "simple": "simple server, HTTP",
    "http": "service, HTTP",
    "open": "service, HTTP",
    "handle": "service, handle",
    "jobs": "service, HTTP jobs",
    "nobatch": "service, HTTP, batching off",
    "cold": "service, HTTP, first after ready",
}


def now() -> float:
    return time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# records and statistics (every percentile is computed here, nowhere else)


@dataclass
class Rec:
    """One request's outcome. `ok` is True only for a complete answer."""

    t_send: float  # perf_counter at the (scheduled) send
    t_done: float
    status: int  # HTTP status (200 for a handle call or a loop call that returned), 0 if none
    ok: bool
    error: Optional[str] = None
    image: str = ""
    timings: Optional[dict] = None  # the answer's timings_ms
    polls: int = 0  # jobs: GETs until the job finished

    @property
    def latency_ms(self) -> float:
        return (self.t_done - self.t_send) * 1000.0


PCTS = (50, 90, 99)


def percentiles(values: list[float], qs=PCTS) -> dict[str, float]:
    """p50/p90/p99 (linear interpolation between closest ranks); NaN if empty."""
    if not values:
        return {f"p{q}": float("nan") for q in qs}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs}


def summarize(recs: list[Rec], window: tuple[float, float]) -> dict[str, Any]:
    """Latency over the requests sent in the window; throughput = successful
    answers received in the window per second."""
    ws, we = window
    sent = [r for r in recs if ws <= r.t_send < we]
    ok = [r for r in sent if r.ok]
    done_in_window = sum(1 for r in recs if r.ok and ws <= r.t_done < we)
    lat = [r.latency_ms for r in ok]
    out: dict[str, Any] = {
        "requests": len(sent),
        "ok": len(ok),
        "errors": len(sent) - len(ok),
        "error_rate": (len(sent) - len(ok)) / len(sent) if sent else float("nan"),
        "throughput": done_in_window / (we - ws) if we > ws else float("nan"),
        "mean_ms": float(np.mean(lat)) if lat else float("nan"),
        "max_ms": float(np.max(lat)) if lat else float("nan"),
        **{k + "_ms": v for k, v in percentiles(lat).items()},
    }
    errs: dict[str, int] = {}
    for r in sent:
        if not r.ok:
            key = (r.error or f"status {r.status}")[:160]
            errs[key] = errs.get(key, 0) + 1
    out["error_kinds"] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5])
    timed = [r.timings for r in ok if r.timings]
    if timed:
        keys = sorted({k for t in timed for k in t})
        out["stage_ms"] = {k: float(np.mean([t.get(k, 0.0) for t in timed])) for k in keys}
    polls = [r.polls for r in ok if r.polls]
    if polls:
        out["mean_polls"] = float(np.mean(polls))
    return out


# --------------------------------------------------------------------------
# images


@dataclass(frozen=True)
class Img:
    name: str
    data: bytes
    ctype: str


def pick_images(folder: Path, quick: bool, n: Optional[int], names: Optional[list[str]]) -> list[Img]:
    if not folder.is_dir():
        sys.exit(f"image folder {folder} not found (use --images DIR)")
    avail = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not avail:
        sys.exit(f"no jpg/jpeg/png images in {folder}")
    if names:
        missing = [x for x in names if x not in avail]
        if missing:
            sys.exit(f"images not in {folder}: {missing}")
        chosen = names
    elif quick:
        chosen = [x for x in QUICK_IMAGES if x in avail] or avail[:3]
    elif n and n < len(avail):
        # evenly spaced over the sorted names: every source (mmocr, paddleocr, rapidocr) is represented
        chosen = [avail[int(i * len(avail) / n)] for i in range(n)]
    else:
        chosen = avail
    return [Img(x, (folder / x).read_bytes(), CTYPES[Path(x).suffix.lower()]) for x in chosen]


# --------------------------------------------------------------------------
# request functions: each returns a Rec and never raises (cancellation aside)


async def http_sync(session, base: str, img: Img, timeout_s: float, t_send: Optional[float] = None,
                    body: str = "raw") -> Rec:
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
    return Rec(t0, now(), status, err is None and status == 200, err, img.name, timings)


async def http_job(session, base: str, img: Img, timeout_s: float, t_send: Optional[float] = None,
                   poll_s: float = 0.05, poll_max_s: float = 0.5) -> Rec:
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
    return Rec(t0, now(), status, err is None and status == 200, err, img.name, timings, polls)


async def serve_handle(handle, img: Img, timeout_s: float, t_send: Optional[float] = None) -> Rec:
    """`await handle.ocr.remote(bytes)` from this driver; a raised domain
    error records its HTTP status (0 if it has none)."""
    t0 = now() if t_send is None else t_send
    status, err, timings = 0, None, None
    resp = None
    try:
        resp = handle.ocr.remote(img.data)
        doc = await asyncio.wait_for(_awaitable(resp), timeout_s)
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
    return Rec(t0, now(), status, err is None, err, img.name, timings)


async def _awaitable(resp):
    return await resp


# --------------------------------------------------------------------------
# progress


class Progress:
    """A status line on stderr: rewritten in place on a terminal, one line
    every 5 s otherwise (logs, CI)."""

    def __init__(self, label: str, total_s: float):
        self.label, self.total_s = label, total_s
        self.t0 = now()
        self.sent = self.done = self.errors = 0
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def record(self, r: Rec) -> None:
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


# --------------------------------------------------------------------------
# load generators

Send = Callable[[Img, Optional[float]], Awaitable[Rec]]


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds used by this
    process and its descendants: the simple server, Ray's processes and
    replicas), both from /proc. Their difference over a window is what
    other users' work took from the same cores. (0, 0) where /proc is not
    readable."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        busy = sum(v) - v[3] - v[4]
        parent, used = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    rest = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(rest[1])
            used[int(d)] = int(rest[11]) + int(rest[12])  # utime + stime
        ours, me = 0, os.getpid()
        for pid, t in used.items():
            q, hops = pid, 0
            while q and q != me and hops < 64:
                q, hops = parent.get(q, 0), hops + 1
            if q == me:
                ours += t
        return busy / tick, ours / tick
    except Exception:
        return 0.0, 0.0


def cpu_share(c0: tuple[float, float], c1: tuple[float, float], seconds: float) -> Optional[dict]:
    """Cores in use over a window: all, ours, and others' (machine minus ours)."""
    if seconds <= 0 or not c0[0] or not c1[0]:
        return None
    machine, ours = (c1[0] - c0[0]) / seconds, (c1[1] - c0[1]) / seconds
    return {"machine": machine, "ours": ours, "others": max(0.0, machine - ours)}


async def sample_window(sampler: Optional["BatchSampler"], ws: float, we: float) -> tuple[Optional[dict], Optional[dict]]:
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
                      label: str, sampler: Optional["BatchSampler"] = None
                      ) -> tuple[list[Rec], tuple[float, float], tuple[Optional[dict], Optional[dict]]]:
    """N clients, each sending its next image when its previous answer is in.
    Clients start at different offsets of the image list."""
    recs: list[Rec] = []
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
                    sampler: Optional["BatchSampler"] = None
                    ) -> tuple[list[Rec], tuple[float, float], tuple[Optional[dict], Optional[dict]]]:
    """Poisson arrivals at `rate`/s; latency from the scheduled arrival. Above
    max_in_flight outstanding requests an arrival is recorded as an error
    (the client itself is saturated) instead of being sent."""
    rng = random.Random(seed)
    recs: list[Rec] = []
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
                r = Rec(t_next, t_next, 0, False, "not sent: client in-flight cap reached", img.name)
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
                  min_passes: int = 1, warm: bool = True) -> tuple[list[Rec], tuple[float, float], Optional[dict]]:
    """One image at a time, in this thread, until duration_s has passed and
    at least min_passes full passes are done (after one untimed warm-up
    pass). Throughput = answers / elapsed. `call` returns the stage timings
    (ms) if it has them, else None; an exception is a failed call."""
    for img in images if warm else []:  # warm-up: every input shape seen once
        try:
            call(img.data)
        except Exception:
            pass
    recs: list[Rec] = []
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
            r = Rec(ts, now(), 200, True, None, img.name, timings if isinstance(timings, dict) else None)
        except Exception as e:
            r = Rec(ts, now(), 0, False, f"{type(e).__name__}: {e}"[:300], img.name)
        recs.append(r)
        prog.record(r)
        prog.tick()
    t1 = now()
    cpu = cpu_share(c0, cpu_seconds(), t1 - t0)
    prog.close()
    return recs, (t0, t1 + 1e-9), cpu


# --------------------------------------------------------------------------
# per-stage batch sizes from the model deployments' stats()


class BatchSampler:
    """Reads `stats()["recent_batches"]` (a deque of the last 256 batches) of
    every model deployment, `fanout` calls one after the other so that every
    replica is likely reached (the router picks one per call), and keeps per
    replica (pid) the batches that are new since the previous read.
    begin()/end() bracket a measurement window. The calls are sequential on
    purpose: concurrent reads of one replica can come back out of order, and
    a newer read diffed against an older one would count every batch again."""

    def __init__(self, app: str = "ocr", interval_s: float = 2.0, fanout: int = 4, call_timeout_s: float = 5.0):
        from ray import serve

        self.handles = {s: serve.get_deployment_handle(d, app_name=app) for s, d in STAGES.items()}
        self.interval_s, self.fanout, self.call_timeout_s = interval_s, fanout, call_timeout_s
        self.last: dict[str, dict[int, list]] = {s: {} for s in STAGES}
        self.acc: dict[str, list[dict]] = {s: [] for s in STAGES}
        self.pids: dict[str, set] = {s: set() for s in STAGES}
        self.info: dict[str, dict] = {}
        self.overflow = 0
        self.collecting = False
        self.t_read: dict[str, float] = {}
        self.t_begin: dict[str, float] = {}
        self._task: Optional[asyncio.Task] = None

    @staticmethod
    def new_batches(prev: list, cur: list) -> tuple[list, bool]:
        """The entries of `cur` appended since `prev` (two reads of the same
        bounded deque: cur = prev minus k dropped from the front, plus the
        new ones). The second value is True when no overlap is found, i.e.
        at least the deque's length of batches passed between the reads
        (some may be lost)."""
        if not prev:
            return cur, False
        for k in range(len(prev)):
            tail = prev[k:]
            if cur[: len(tail)] == tail:
                return cur[len(tail):], False
        return cur, True

    async def snapshot(self) -> None:
        for stage, h in self.handles.items():
            for _ in range(self.fanout):
                try:
                    st = await asyncio.wait_for(_awaitable(h.stats.remote()), self.call_timeout_s)
                except Exception:
                    break  # that replica is stuck or gone: try again at the next snapshot
                if not isinstance(st, dict):
                    continue
                pid = st["pid"]
                cur = list(st.get("recent_batches", []))
                new, lost = self.new_batches(self.last[stage].get(pid, []), cur)
                self.last[stage][pid] = cur
                self.info[stage] = {k: st.get(k) for k in ("max_batch_size", "batch_wait_timeout_s")}
                self.info.setdefault(f"{stage}_replicas", {})[pid] = {
                    k: st.get(k) for k in ("load_seconds", "warm_seconds", "cpu_affinity")}
                if self.collecting:
                    self.pids[stage].add(pid)
                    self.acc[stage].extend(new)
                    self.overflow += int(lost)
            self.t_read[stage] = now()  # when this stage's batches were last read

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.snapshot()
            except Exception as e:  # sampling must never stop a load point
                log(f"stats sampling failed: {type(e).__name__}: {e}")

    async def begin(self) -> None:
        self.collecting = False
        await self.snapshot()
        self.acc = {s: [] for s in STAGES}
        self.pids = {s: set() for s in STAGES}
        self.overflow = 0
        self.collecting = True
        self.t_begin = dict(self.t_read)
        self._task = asyncio.create_task(self._loop())

    async def end(self) -> dict[str, Any]:
        if self._task:
            self._task.cancel()
        await self.snapshot()
        self.collecting = False
        out: dict[str, Any] = {}
        for s in STAGES:
            b = self.acc[s]
            out[s] = {
                "batches": len(b),
                "mean_requests": float(np.mean([x["requests"] for x in b])) if b else float("nan"),
                "mean_items": float(np.mean([x["items"] for x in b])) if b else float("nan"),
                "mean_batch_ms": float(np.mean([x["ms"] for x in b])) if b else float("nan"),
                "busy_s": float(sum(x["ms"] for x in b) / 1000.0),
                # the interval these batches were collected over (first read to last read of this stage)
                "sampled_s": self.t_read.get(s, 0.0) - self.t_begin.get(s, 0.0),
                "replicas": len(self.pids[s]),
                "max_batch_size": (self.info.get(s) or {}).get("max_batch_size"),
            }
        out["overflow"] = self.overflow
        return out


# --------------------------------------------------------------------------
# the service (own local Ray cluster) and the simple server (subprocess)


def http_get_status(url: str, timeout: float = 5.0) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


def wait_ready(url: str, timeout_s: float, proc: Optional[subprocess.Popen] = None, every_s: float = 0.25) -> float:
    """Seconds until GET url/readyz answers 200; raises TimeoutError."""
    t0 = now()
    while now() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it was ready")
        if http_get_status(f"{url}/readyz", timeout=5) == 200:
            return now() - t0
        time.sleep(every_s)
    raise TimeoutError(f"{url}/readyz not 200 after {timeout_s:.0f}s")


class Service:
    def __init__(self, config_path: Path, port: int):
        import yaml

        self.config = yaml.safe_load(config_path.read_text())
        self.config.pop("http_options", None)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.started = False
        self.cold: dict[str, Any] = {}

    def start(self, ready_timeout_s: float) -> None:
        import ray
        from ray import serve

        t = now()
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
        self.started = True
        self.cold["ray_init_s"] = now() - t
        t = now()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        self.cold["serve_start_s"] = now() - t
        t = now()
        self._deploy(self.config)
        self.cold["deploy_call_s"] = now() - t
        self.cold["deploy_to_ready_s"] = (now() - t) + wait_ready(self.url, ready_timeout_s)

    def _deploy(self, config: dict) -> None:
        from ray.serve.context import _get_global_client
        from ray.serve.schema import ServeDeploySchema

        _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))

    async def set_batching(self, size: Optional[int], sampler: BatchSampler, timeout_s: float = 120) -> None:
        """Redeploy with user_config max_batch_size = size for the three model
        deployments (None: the config file's values); wait until every
        replica reports it."""
        cfg = copy.deepcopy(self.config)
        want = {}
        for app in cfg["applications"]:
            for d in app.get("deployments", []):
                if d["name"] in STAGES.values():
                    uc = dict(d.get("user_config") or {})
                    if size is not None:
                        uc["max_batch_size"] = size
                    d["user_config"] = uc
                    want[d["name"]] = uc.get("max_batch_size")
        self._deploy(cfg)
        t0 = now()
        while now() - t0 < timeout_s:
            sizes = []
            for stage, dep in STAGES.items():
                got = await asyncio.gather(*(asyncio.wait_for(_awaitable(sampler.handles[stage].stats.remote()), 15)
                                             for _ in range(sampler.fanout)), return_exceptions=True)
                sizes += [g.get("max_batch_size") == want.get(dep) for g in got if isinstance(g, dict)]
            if sizes and all(sizes):
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"replicas did not take max_batch_size={size} in {timeout_s}s")

    def stop(self) -> None:
        if not self.started:
            return
        import ray

        # ray.shutdown() of the driver that started this local cluster stops
        # all of it (Serve's actors included); serve.shutdown() first would
        # only add ~10 s of graceful draining that a benchmark does not need.
        t = now()
        ray.shutdown()
        self.started = False
        log(f"service stopped in {now() - t:.1f}s")


class SimpleServer:
    def __init__(self, port: int, log_path: Path):
        self.port, self.log_path = port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float) -> float:
        if http_get_status(f"{self.url}/healthz", timeout=2) != 0:
            raise RuntimeError(f"port {self.port} already answers; pick another with --simple-port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "load_tests/simple_server.py"), "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return wait_ready(self.url, timeout_s, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError("simple server did not start; its log:\n" + self.log_path.read_text()[-2000:])

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own child's session only
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._log.close()
        self.proc = None


# --------------------------------------------------------------------------
# the run


@dataclass
class Point:
    target: str  # engine | rapidocr | simple | http | open | handle | jobs | nobatch
    mode: str  # loop | closed | open
    load: float  # clients (closed), rate in img/s (open), 1 (loop)
    window: tuple[float, float]
    summary: dict
    batches: Optional[dict] = None
    loadavg: tuple = ()
    records: list = field(default_factory=list)
    cpu: Optional[dict] = None  # cores used in the window: machine, ours, others

    @property
    def label(self) -> str:
        return LABELS[self.target]

    def load_str(self) -> str:
        if self.mode == "closed":
            return f"{int(self.load)} client{'s' if self.load != 1 else ''}"
        if self.mode == "open":
            return f"{self.load:.2f}/s Poisson"
        return "1 at a time"


class Run:
    def __init__(self, args):
        self.args = args
        self.points: list[Point] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.cold: dict[str, Any] = {}
        self.probes: dict[str, Any] = {}
        self.t_start = now()
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.loadavg_start = os.getloadavg()
        self.loadavg_end: Optional[tuple] = None
        self.wall_s: Optional[float] = None
        self.git = git_state()
        self.machine = f"{platform.node()}, {platform.machine()}, os.cpu_count()={os.cpu_count()}, " \
                       f"affinity {sorted(os.sched_getaffinity(0))}"
        self.versions = (f"python {platform.python_version()}, ray {_dist_version('ray')}, paddlepaddle "
                         f"{_dist_version('paddlepaddle')}, onnxruntime {_dist_version('onnxruntime')}, aiohttp "
                         f"{_dist_version('aiohttp')}")

    def finish(self) -> None:
        if self.wall_s is None:
            self.wall_s = now() - self.t_start
            self.loadavg_end = os.getloadavg()

    @classmethod
    def from_raw(cls, args, raw: dict) -> "Run":
        """A finished run read back from its raw JSON (for --from-raw)."""
        run = cls(args)
        run.started, run.wall_s = raw["started"], raw.get("wall_s")
        run.loadavg_start = tuple(raw.get("loadavg_start") or ())
        run.loadavg_end = tuple(raw.get("loadavg_end") or ())
        run.git = tuple(raw.get("git") or ("?", []))
        run.machine, run.versions = raw.get("machine", "?"), raw.get("versions", "?")
        run.cold, run.probes = raw.get("cold", {}), raw.get("probes", {})
        run.notes, run.failures = list(raw.get("notes", [])), list(raw.get("failures", []))
        for pt in raw["points"]:
            recs = [Rec(r["t_send"], r.get("t_done", r["t_send"] + r["latency_ms"] / 1000.0), r["status"], r["ok"],
                        r["error"], r["image"], r["timings"], r.get("polls", 0)) for r in pt["records"]]
            window = (0.0, pt["window_s"])
            summary = pt["summary"]  # as computed during the run, from unrounded times
            run.points.append(Point(pt["target"], pt["mode"], pt["load"], window, summary, pt.get("batches"),
                                    tuple(pt.get("loadavg") or ()), recs, pt.get("cpu")))
        return run

    def over_deadline(self, what: str) -> bool:
        if now() - self.t_start > self.args.deadline:
            note = f"{what} skipped: the run passed its --deadline of {self.args.deadline:.0f}s"
            log(note)
            self.notes.append(note)
            return True
        return False

    def add(self, target: str, mode: str, load: float, recs: list[Rec], window, batches=None, cpu=None) -> Point:
        p = Point(target, mode, load, window, summarize(recs, window), batches, os.getloadavg(), recs, cpu)
        self.points.append(p)
        s = p.summary
        log(f"{p.label} [{p.load_str()}]: {s['requests']} req, {s['errors']} errors, {s['throughput']:.2f} img/s, "
            f"p50 {s['p50_ms']:.0f} p90 {s['p90_ms']:.0f} p99 {s['p99_ms']:.0f} ms"
            + (" | batch req det/cls/rec " + "/".join(f"{batches[st]['mean_requests']:.2f}" for st in STAGES)
               if batches else "")
            + (f" | others' CPU {cpu['others']:.2f} cores" if cpu else ""))
        return p

    def get(self, target: str, mode: Optional[str] = None) -> list[Point]:
        return [p for p in self.points if p.target == target and (mode is None or p.mode == mode)]


async def sweep(run: Run, target: str, send: Send, images: list[Img], clients: list[int],
                sampler: Optional[BatchSampler] = None) -> None:
    a = run.args
    for c in clients:
        if run.over_deadline(f"{LABELS[target]} at {c} clients"):
            return
        recs, window, (batches, cpu) = await closed_loop(send, images, c, a.warmup, a.duration,
                                                         f"{target} c={c}", sampler)
        run.add(target, "closed", c, recs, window, batches, cpu)


async def warm_pass(send: Send, images: list[Img], label: str) -> list[Rec]:
    """One untimed sequential pass over the images."""
    t = now()
    recs = [await send(img, None) for img in images]
    bad = [r for r in recs if not r.ok]
    log(f"{label}: warm-up pass over {len(images)} images in {now() - t:.1f}s"
        + (f", {len(bad)} failed: {bad[0].error}" if bad else ""))
    return recs


def phase(run: Run, name: str):
    """Decorator-free guard: log and keep going when a phase fails."""

    class Guard:
        def __enter__(self):
            log(f"=== {name}")
            self.t = now()
            return self

        def __exit__(self, et, e, tb):
            if et is None:
                log(f"=== {name} done in {now() - self.t:.1f}s")
                return False
            if et in (KeyboardInterrupt, asyncio.CancelledError):
                return False
            msg = f"phase {name} failed: {et.__name__}: {e}"
            log(msg + "\n" + "".join(traceback.format_exception(et, e, tb))[-3000:])
            run.failures.append(msg)
            return True

    return Guard()


def run_in_process(run: Run, images: list[Img]) -> None:
    a = run.args
    if "engine" in a.targets:
        with phase(run, "engine in-process"):
            from serve_app.engine import OcrEngine

            t = now()
            eng = OcrEngine()
            run.notes.append(f"engine (in-process) loaded in {now() - t:.1f}s; predictor threads "
                             f"{eng.config.predictor.cpu_math_library_num_threads}, pinned to "
                             f"{eng.config.predictor.cpu_affinity}")
            try:
                recs, window, cpu = loop_baseline("engine", lambda b: eng.read(b).timings_ms, images, a.duration,
                                              warm=not a.quick)
                run.add("engine", "loop", 1, recs, window, cpu=cpu)
            finally:
                eng.close()
                del eng
    if "rapidocr" in a.targets:
        with phase(run, "rapidocr-onnxruntime in-process"):
            try:
                from rapidocr_onnxruntime import RapidOCR
            except Exception as e:
                note = f"rapidocr-onnxruntime skipped: cannot import it ({type(e).__name__}: {e})"
                log(note)
                run.notes.append(note)
            else:
                t = now()
                ocr = RapidOCR()
                run.notes.append(f"rapidocr-onnxruntime {_dist_version('rapidocr-onnxruntime')} loaded in "
                                 f"{now() - t:.1f}s, default settings (onnxruntime threads: its default)")
                recs, window, cpu = loop_baseline("rapidocr", lambda b: (ocr(b), None)[1], images, a.duration,
                                              warm=not a.quick)
                run.add("rapidocr", "loop", 1, recs, window, cpu=cpu)
                del ocr


async def run_simple(run: Run, images: list[Img]) -> None:
    import aiohttp

    a = run.args
    with phase(run, "simple server"):
        srv = SimpleServer(a.simple_port, a.raw.parent / "simple_server.log")
        t = srv.start(a.ready_timeout)
        run.notes.append(f"simple server (subprocess, port {a.simple_port}) ready {t:.1f}s after its start")
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                async def send(img, t_send=None):
                    return await http_sync(session, srv.url, img, a.timeout, t_send, a.body)

                await warm_pass(send, images, "simple")
                await sweep(run, "simple", send, images, a.clients)
        finally:
            srv.stop()


async def run_service(run: Run, images: list[Img]) -> None:
    import aiohttp
    from ray import serve

    a = run.args
    svc = Service(a.config, a.port)
    try:
        with phase(run, "service start (cold)"):
            if http_get_status(f"{svc.url}/healthz", timeout=2) != 0:
                raise RuntimeError(f"port {a.port} already answers; pick another with --port")
            svc.start(a.ready_timeout)
            run.cold.update(svc.cold)
        if not svc.started or "deploy_to_ready_s" not in run.cold:
            return
        sampler = BatchSampler()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def send_http(img, t_send=None):
                return await http_sync(session, svc.url, img, a.timeout, t_send, a.body)

            with phase(run, "first request"):
                first = await send_http(images[0], None)
                run.cold["first_request"] = {"image": first.image, "latency_ms": first.latency_ms,
                                             "ok": first.ok, "error": first.error, "timings": first.timings}
                await sampler.snapshot()  # replicas' load and warm-up seconds
                run.cold["replicas"] = {s: sampler.info.get(f"{s}_replicas", {}) for s in STAGES}
                # a second and third call of the same image: is the first one special?
                again = [await send_http(images[0], None) for _ in range(2)]
                run.cold["same_image_next_ms"] = [r.latency_ms for r in again]
                window = (first.t_send, now() + 1e-6)
                run.points.append(Point("cold", "single", 1, window, summarize([first] + again, window), None,
                                        os.getloadavg(), [first] + again))
            with phase(run, "service warm-up pass"):
                await warm_pass(send_http, images, "service")
            if "http" in a.targets:
                with phase(run, "service HTTP closed-loop sweep"):
                    await sweep(run, "http", send_http, images, a.clients, sampler)
            if "open" in a.targets:
                with phase(run, "service HTTP open loop"):
                    sat = max((p.summary["throughput"] for p in run.get("http", "closed")), default=float("nan"))
                    rate = a.open_rate or (a.open_fraction * sat if sat == sat and sat > 0 else None)
                    if rate is None:
                        run.notes.append("open loop skipped: no saturation throughput (run `http` or give --open-rate)")
                    elif not run.over_deadline("open loop"):
                        recs, window, (batches, cpu) = await open_loop(
                            send_http, images, rate, a.warmup, a.duration, f"open {rate:.2f}/s", seed=a.seed,
                            sampler=sampler)
                        run.add("open", "open", rate, recs, window, batches, cpu)
                        run.points[-1].summary["fraction_of_saturation"] = rate / sat if sat == sat and sat else None
            if "handle" in a.targets:
                with phase(run, "service handle sweep"):
                    h = serve.get_app_handle("ocr")

                    async def send_handle(img, t_send=None):
                        return await serve_handle(h, img, a.timeout, t_send)

                    await sweep(run, "handle", send_handle, images, a.handle_clients, sampler)
            if "jobs" in a.targets:
                with phase(run, "service HTTP jobs"):
                    async def send_job(img, t_send=None):
                        return await http_job(session, svc.url, img, a.timeout, t_send)

                    probe = await send_job(images[0], None)
                    run.probes["jobs"] = {"ok": probe.ok, "status": probe.status, "error": probe.error,
                                          "latency_ms": probe.latency_ms}
                    if probe.ok or a.jobs_force:
                        await sweep(run, "jobs", send_job, images, a.jobs_clients, sampler)
                    else:
                        note = (f"HTTP jobs phase skipped: the probe POST /v1/ocr/jobs got {probe.error} "
                                f"(the endpoint is not deployed?); --jobs-force runs it anyway")
                        log(note)
                        run.notes.append(note)
            if "nobatch" in a.targets:
                with phase(run, "service HTTP, batching off"):
                    t = now()
                    await svc.set_batching(1, sampler)
                    run.notes.append(f"batching off: redeployed with user_config max_batch_size 1 for "
                                     f"{', '.join(STAGES.values())}; replicas took it in {now() - t:.1f}s "
                                     f"(live reconfigure, same processes)")
                    await sweep(run, "nobatch", send_http, images, a.nobatch_clients, sampler)
    finally:
        svc.stop()


def _dist_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def git_state() -> tuple[str, list[str]]:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "--", "serve_app", "deployments.yaml",
                                "deployments.gpu.yaml", "pyproject.toml"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
        return head, [d.strip() for d in dirty]
    except Exception:
        return "?", []


# --------------------------------------------------------------------------
# report


def f(x, nd: int = 0) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}f}"


def image_medians(p: Point) -> dict[str, float]:
    """Median latency per image over the point's successful requests sent in its window."""
    ws, we = p.window
    by: dict[str, list[float]] = {}
    for r in p.records:
        if r.ok and ws <= r.t_send < we:
            by.setdefault(r.image, []).append(r.latency_ms)
    return {k: percentiles(v, (50,))["p50"] for k, v in by.items()}


def reference_point(run: Run, p: Point) -> Optional[Point]:
    """The same system unloaded: its own 1-client point (the loop itself for
    in-process baselines), else the service's HTTP 1-client point."""
    if p.mode == "loop":
        return p
    for target in (p.target, "http") if p.target in SERVICE_TARGETS | {"cold"} else (p.target,):
        ref = [q for q in run.get(target, "closed") if q.load == 1]
        if ref:
            return ref[0]
    return None


def slowdowns(run: Run, p: Point) -> tuple[list[float], Optional[Point]]:
    """Each request's latency over the median latency of the same image on
    the same system at 1 client: queueing, with the image mix taken out."""
    ref = reference_point(run, p)
    if ref is None:
        return [], None
    med = image_medians(ref)
    ws, we = p.window
    return [r.latency_ms / med[r.image] for r in p.records
            if r.ok and ws <= r.t_send < we and med.get(r.image, 0) > 0], ref


def paired_diff(a: Point, b: Point) -> tuple[float, int]:
    """Median over the images both points read of (a's median - b's median), ms."""
    ma, mb = image_medians(a), image_medians(b)
    common = sorted(set(ma) & set(mb))
    return percentiles([ma[i] - mb[i] for i in common], (50,))["p50"], len(common)


def disturbance_warnings(run: Run, others_max: float = 0.3, slack_ms: float = 5.0) -> list[str]:
    """Signs that other work on the machine distorted the comparisons."""
    out = []
    hit = [f"{p.label} [{p.load_str()}] {p.cpu['others']:.2f}" for p in run.points
           if p.cpu and p.cpu["others"] >= others_max]
    if hit:
        out.append(f"other users' work took >= {others_max} cores during: {'; '.join(hit)}")
    eng, s1 = run.get("engine", "loop"), [p for p in run.get("simple", "closed") if p.load == 1]
    if eng and s1:
        d, n = paired_diff(s1[0], eng[0])
        if d < -slack_ms:
            out.append(f"the simple server at 1 client (the same engine plus HTTP) was faster than the in-process "
                       f"engine by {-d:.0f} ms per image (median over {n} images): the engine point was disturbed"
                       f"{' (or cold: --quick skips its warm-up pass)' if run.args.quick else ''}, "
                       f"so the ratios against it are not trustworthy; the simple server at 1 client is the "
                       f"better reference in this run")
    return out


def targets_check(run: Run) -> list[tuple[str, str, str, Optional[bool]]]:
    """(target, measured, requirement, met) for each target of the issue."""
    rows: list[tuple[str, str, str, Optional[bool]]] = []
    eng = run.get("engine", "loop")
    http = run.get("http", "closed")
    simple = run.get("simple", "closed")
    e = eng[0].summary if eng else None
    sat = max(http, key=lambda p: p.summary["throughput"]) if http else None
    if e and sat:
        r = sat.summary["throughput"] / e["throughput"]
        rows.append(("service throughput at saturation >= 1.0x in-process engine",
                     f"{sat.summary['throughput']:.2f} img/s ({sat.load_str()}) vs {e['throughput']:.2f} img/s "
                     f"= **{r:.2f}x**", ">= 1.0x", r >= 1.0))
    low = [p for p in http if p.load == min(q.load for q in http)] if http else []
    if e and low:
        d = low[0].summary["p50_ms"] - e["p50_ms"]
        per_image = f"; per image (median of per-image median differences): service - engine " \
                    f"{paired_diff(low[0], eng[0])[0]:+.0f} ms"
        s1 = [p for p in simple if p.load == 1]
        if s1:
            per_image += (f", service - simple server (1 client) {paired_diff(low[0], s1[0])[0]:+.0f} ms, "
                          f"simple server - engine {paired_diff(s1[0], eng[0])[0]:+.0f} ms")
        rows.append(("service p50 at low load <= engine p50 + 15 ms",
                     f"{low[0].summary['p50_ms']:.0f} ms ({low[0].load_str()}) vs {e['p50_ms']:.0f} ms "
                     f"= **{d:+.0f} ms**{per_image}", "<= +15 ms", d <= 15))
    op = run.get("open", "open")
    if op:
        s = op[0].summary
        r = s["p99_ms"] / s["p50_ms"] if s["p50_ms"] else float("nan")
        frac = s.get("fraction_of_saturation")
        sl, _ = slowdowns(run, op[0])
        mix = ""
        if sl:
            sp = percentiles(sl)
            mix = (f"; with the image mix taken out (latency / the image's 1-client median): p50 "
                   f"{sp['p50']:.2f}, p99 {sp['p99']:.2f}")
        if e:
            mix += f"; the engine alone, one at a time, has p99/p50 = {e['p99_ms'] / e['p50_ms']:.1f}x on these images"
        rows.append(("p99 <= 2.5x p50 at 70% of saturation",
                     f"open loop {op[0].load:.2f}/s ({f(100 * frac) if frac else '?'}% of saturation): "
                     f"p50 {s['p50_ms']:.0f}, p99 {s['p99_ms']:.0f} ms = **{r:.2f}x**; errors {s['errors']}{mix}",
                     "<= 2.5x", bool(r <= 2.5)))
    first = run.cold.get("first_request")
    if first and low:
        steady = low[0].summary["p50_ms"]
        r_all = first["latency_ms"] / steady
        same = image_medians(low[0]).get(first["image"])
        if same:  # judged against the same image: the image mix is not a cold-start cost
            r = first["latency_ms"] / same
            text = (f"`{first['image']}`: {first['latency_ms']:.0f} ms vs that image's steady median at 1 client "
                    f"{same:.0f} ms = **{r:.2f}x** (against the p50 of all images, {steady:.0f} ms: {r_all:.2f}x)")
        else:
            r = r_all
            text = f"{first['latency_ms']:.0f} ms vs {steady:.0f} ms = **{r:.2f}x**"
        rows.append(("first request after ready <= 1.5x steady p50", text, "<= 1.5x", r <= 1.5))
    if http and simple:
        s_sat = max(p.summary["throughput"] for p in simple)
        v_sat = sat.summary["throughput"]
        rows.append(("service > simple server: throughput at saturation",
                     f"{v_sat:.2f} vs {s_sat:.2f} img/s = **{v_sat / s_sat:.2f}x**", "> 1.0x", v_sat > s_sat))
        common = sorted({p.load for p in http} & {p.load for p in simple} - {1})
        for c in common:
            hp = [p for p in http if p.load == c][0].summary
            sp = [p for p in simple if p.load == c][0].summary
            rows.append((f"service > simple server: p99 at {int(c)} clients",
                         f"{hp['p99_ms']:.0f} vs {sp['p99_ms']:.0f} ms (throughput {hp['throughput']:.2f} vs "
                         f"{sp['throughput']:.2f} img/s)", "lower p99", hp["p99_ms"] < sp["p99_ms"]))
    return rows


def batch_cell(b: Optional[dict], key: str) -> str:
    if not b:
        return ""
    return "/".join(f(b[s][key], 2) if key.startswith("mean") else str(b[s][key]) for s in STAGES)


def render(run: Run, images: list[Img], plots: list[str], out: Path) -> str:
    a = run.args
    head, dirty = run.git
    L: list[str] = []
    w = L.append
    w(f"# Load-test results{' (quick: proves the harness works, numbers mean nothing)' if a.quick else ''}")
    w("")
    w(f"Written by `load_tests/bench.py` ({' '.join(a.argv) or 'no options'}). Started {run.started}, "
      f"wall {f(run.wall_s)} s.")
    w("")
    w("## Setup")
    w("")
    w(f"- machine: {run.machine}; load average at start {tuple(round(x, 2) for x in run.loadavg_start)}, "
      f"at end {tuple(round(x, 2) for x in (run.loadavg_end or ()))} (each point's is in the table)")
    w(f"- code: commit {head}" + (f", with uncommitted changes in {', '.join(d.split()[-1] for d in dirty)}"
                                  if dirty else ", clean"))
    w(f"- {run.versions}")
    w(f"- service config: `{a.config.relative_to(REPO) if a.config.is_relative_to(REPO) else a.config}` "
      f"(HTTP on 127.0.0.1:{a.port}), simple server on 127.0.0.1:{a.simple_port}; request body: {a.body}")
    w(f"- images: {len(images)} from `{a.images}`: {', '.join(i.name for i in images)}")
    w(f"- each load point: {a.warmup:g} s warm-up, then {a.duration:g} s measured; client timeout {a.timeout:g} s; "
      f"latency statistics over requests sent in the window, throughput = successful answers received in it")
    w("")
    w("## Results")
    w("")
    w("| target | load | requests | errors | img/s | p50 ms | p90 ms | p99 ms | mean batch det/cls/rec "
      "(requests) | rec crops/batch | replicas det/cls/rec | load avg 1 min | others' CPU (cores) |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|")
    for p in run.points:
        if p.target == "cold":
            continue
        s = p.summary
        b = p.batches
        w(f"| {p.label} | {p.load_str()} | {s['requests']} | {s['errors']} ({f(100 * s['error_rate'], 1)}%) "
          f"| {f(s['throughput'], 2)} | {f(s['p50_ms'])} | {f(s['p90_ms'])} | {f(s['p99_ms'])} "
          f"| {batch_cell(b, 'mean_requests')} | {f(b['rec']['mean_items'], 1) if b else ''} "
          f"| {batch_cell(b, 'replicas')} | {f(p.loadavg[0], 1) if p.loadavg else ''} "
          f"| {f(p.cpu['others'], 2) if p.cpu else 'n/a'} |")
    w("")
    w("`load avg 1 min`: the machine's at the end of the point (every process, ours included). `others' CPU`: "
      "cores busy with work that is not this run's process tree during the window (from /proc; n/a in runs "
      "recorded before it was measured). Both say how much another user's work disturbed the point.")
    w("")
    errs = [(p, k, v) for p in run.points for k, v in p.summary.get("error_kinds", {}).items()]
    if errs:
        w("Errors seen (first kinds per point):")
        w("")
        for p, k, v in errs:
            w(f"- {p.label} [{p.load_str()}]: {v} x `{k}`")
        w("")
    rows = targets_check(run)
    if rows:
        w("## Targets (ratios from this run; reported, not asserted)")
        w("")
        w("| target | measured | wanted | met |")
        w("|---|---|---|---|")
        for t, m, want, ok in rows:
            w(f"| {t} | {m} | {want} | {'yes' if ok else 'no' if ok is not None else '?'} |")
        w("")
        for warning in disturbance_warnings(run):
            w(f"- **Warning:** {warning}")
        w("")
    if run.cold:
        c = run.cold
        w("## Cold start")
        w("")
        w(f"- Ray start {f(c.get('ray_init_s'), 1)} s, Serve start {f(c.get('serve_start_s'), 1)} s, "
          f"**deploy -> /readyz 200: {f(c.get('deploy_to_ready_s'), 1)} s** (deploy call "
          f"{f(c.get('deploy_call_s'), 1)} s; readiness polled every 0.25 s)")
        for s, reps in (c.get("replicas") or {}).items():
            for pid, r in reps.items():
                w(f"- {STAGES[s]} replica pid {pid}: model load {f(r.get('load_seconds'), 2)} s, warm-up "
                  f"{f(r.get('warm_seconds'), 2)} s, cores {r.get('cpu_affinity')}")
        fr = c.get("first_request")
        if fr:
            w(f"- first request after ready (`{fr['image']}`): {f(fr['latency_ms'])} ms, ok={fr['ok']}, server "
              f"timings {fr.get('timings')}; the next two of the same image: "
              f"{', '.join(f(x) for x in c.get('same_image_next_ms', []))} ms")
        w("")
    tail_rows = []
    for p in run.points:
        if p.target == "cold" or p.mode == "loop":
            continue
        sl, ref = slowdowns(run, p)
        if sl:
            sp = percentiles(sl)
            tail_rows.append(f"| {p.label} | {p.load_str()} | {ref.label}, {ref.load_str()} | {sp['p50']:.2f} "
                             f"| {sp['p90']:.2f} | {sp['p99']:.2f} |")
    if tail_rows:
        w("## Queueing, with the image mix taken out")
        w("")
        w("Latency of each request divided by the median latency of the same image on the same system at 1 "
          "client (1.0 = as fast as unloaded). The images differ a lot in cost (a dense page takes ~20x a "
          "typical photo), so the plain percentiles above mix image cost with queueing; these do not.")
        w("")
        w("| target | load | reference | p50 | p90 | p99 |")
        w("|---|---|---|---:|---:|---:|")
        L.extend(tail_rows)
        w("")
    pairs = []
    by = {(p.target, p.load) for p in run.points}
    for x, y in ((("http", 1), ("engine", 1)), (("http", 1), ("simple", 1)), (("simple", 1), ("engine", 1)),
                 (("handle", 1), ("engine", 1)), (("nobatch", 1), ("http", 1))):
        if x in by and y in by:
            px = [p for p in run.points if (p.target, p.load) == x][0]
            py = [p for p in run.points if (p.target, p.load) == y][0]
            d, n = paired_diff(px, py)
            pairs.append(f"| {px.label}, {px.load_str()} | {py.label}, {py.load_str()} | {f(d, 1)} | {n} |")
    if pairs:
        w("## Low-load latency, image by image")
        w("")
        w("Median over the images of (median latency of the image on A - on B), in ms: what A adds per "
          "request when nothing queues.")
        w("")
        w("| A | B | A - B (ms) | images |")
        w("|---|---|---:|---:|")
        L.extend(pairs)
        w("")
    w("## Where the time goes (means over successful requests; ms)")
    w("")
    w("`decode`..`total` are the server's own `timings_ms` (in the service each model stage includes the hop to "
      "its deployment and the wait for a batch); `outside` = client latency minus server `total` (HTTP, proxy, "
      "ingress, queueing before the pipeline); `busy` = the model replicas' summed batch compute time per "
      "stage in the window divided by the window's length (1.0 = one replica computing all the time; batch "
      "times are wall times on the predictor thread, so CPU contention stretches them).")
    w("")
    w("| target | load | latency | decode | det | cls | rec | total | outside | lock wait | batch ms det/cls/rec | "
      "busy det/cls/rec |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for p in run.points:
        st = p.summary.get("stage_ms")
        if not st:
            continue
        b = p.batches
        lat = p.summary["mean_ms"]
        outside = lat - st["total"] if p.mode != "loop" and "total" in st else float("nan")
        busy = ("/".join(f(b[s]["busy_s"] / b[s]["sampled_s"] if b[s]["sampled_s"] > 0 else None, 2)
                         for s in STAGES)) if b else ""
        w(f"| {p.label} | {p.load_str()} | {f(lat)} | " + " | ".join(f(st.get(k), 0) for k in TIMING_KEYS)
          + f" | {f(outside)} | {f(st.get('lock_wait'))} | {batch_cell(b, 'mean_batch_ms')} | {busy} |")
    w("")
    if plots:
        w("## Plots")
        w("")
        for pth in plots:
            w(f"![{Path(pth).stem}](img/{Path(pth).name})")
            w("")
    if run.probes:
        w("## Probes")
        w("")
        for k, v in run.probes.items():
            w(f"- {k}: {v}")
        w("")
    if run.notes or run.failures:
        w("## Notes")
        w("")
        for n in run.notes:
            w(f"- {n}")
        for n in run.failures:
            w(f"- **{n}**")
        w("")
    w(summary_line(run))
    return "\n".join(L) + "\n"


def summary_line(run: Run) -> str:
    parts = []
    eng = run.get("engine", "loop")
    http = run.get("http", "closed")
    simple = run.get("simple", "closed")
    if eng:
        parts.append(f"engine {eng[0].summary['throughput']:.2f} img/s p50 {eng[0].summary['p50_ms']:.0f} ms")
    if http:
        sat = max(http, key=lambda p: p.summary["throughput"])
        parts.append(f"service saturates at {sat.summary['throughput']:.2f} img/s ({sat.load_str()}, "
                     f"p99 {sat.summary['p99_ms']:.0f} ms)")
    if simple:
        sat = max(simple, key=lambda p: p.summary["throughput"])
        parts.append(f"simple server {sat.summary['throughput']:.2f} img/s ({sat.load_str()}, "
                     f"p99 {sat.summary['p99_ms']:.0f} ms)")
    if run.cold.get("deploy_to_ready_s"):
        parts.append(f"deploy->ready {run.cold['deploy_to_ready_s']:.1f} s")
    rows = targets_check(run)
    if rows:
        parts.append(f"targets met {sum(1 for r in rows if r[3])}/{len(rows)}")
    total = sum(p.summary["requests"] for p in run.points)
    bad = sum(p.summary["errors"] for p in run.points)
    parts.append(f"{total} requests, {bad} errors")
    if run.failures:
        parts.append(f"{len(run.failures)} phase(s) FAILED")
    return "Summary: " + "; ".join(parts) + "."


def plot(run: Run, img_dir: Path, suffix: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def curve(ax, pts: list[Point], name: str, color: str) -> None:
        pts = sorted(pts, key=lambda p: p.load)
        x = [p.summary["throughput"] for p in pts]
        ax.plot(x, [p.summary["p50_ms"] for p in pts], "o-", color=color, label=f"{name} p50")
        ax.plot(x, [p.summary["p99_ms"] for p in pts], "s--", color=color, alpha=0.7, label=f"{name} p99")
        for p in pts:
            ax.annotate(f"{int(p.load)}", (p.summary["throughput"], p.summary["p50_ms"]), fontsize=7,
                        textcoords="offset points", xytext=(3, -9), color=color)

    def finish(fig, ax, title: str, name: str) -> None:
        eng = run.get("engine", "loop")
        if eng:
            ax.axvline(eng[0].summary["throughput"], color="gray", ls=":", label="engine in-process img/s")
        ax.set_xlabel("achieved throughput (img/s)")
        ax.set_ylabel("latency (ms, log)")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = img_dir / f"{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    http, simple, nob = run.get("http", "closed"), run.get("simple", "closed"), run.get("nobatch", "closed")
    if http or simple:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if http:
            curve(ax, http, "service HTTP", "tab:blue")
        if simple:
            curve(ax, simple, "simple server", "tab:red")
        op = run.get("open", "open")
        if op:
            s = op[0].summary
            ax.plot([s["throughput"]] * 2, [s["p50_ms"], s["p99_ms"]], "D", color="tab:green",
                    label=f"service open loop {op[0].load:.2f}/s (p50, p99)")
        finish(fig, ax, "Latency vs throughput, closed loop (labels: clients)", "latency_vs_throughput")
    if http or nob:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if http:
            curve(ax, http, "batching on", "tab:blue")
        if nob:
            curve(ax, nob, "batching off (max_batch_size 1)", "tab:orange")
        finish(fig, ax, "Service: batching on vs off (labels: clients)", "batching_on_off")
    return written


def write_outputs(run: Run, images: list[Img], write_raw: bool = True) -> Path:
    a = run.args
    run.finish()
    a.out.mkdir(parents=True, exist_ok=True)
    plots: list[str] = []
    try:
        plots = plot(run, a.out / "img", "_quick" if a.quick else "")
    except Exception as e:
        run.failures.append(f"plots failed: {type(e).__name__}: {e}")
    report = a.out / "benchmarks.md"
    report.write_text(render(run, images, plots, a.out), encoding="utf-8")
    if not write_raw:
        log(f"wrote {report}" + (f", {', '.join(plots)}" if plots else ""))
        return report
    a.raw.parent.mkdir(parents=True, exist_ok=True)
    raw = {
        "argv": a.argv, "started": run.started, "wall_s": run.wall_s, "loadavg_start": run.loadavg_start,
        "loadavg_end": run.loadavg_end, "git": run.git, "machine": run.machine, "versions": run.versions,
        "cold": run.cold, "probes": run.probes, "notes": run.notes,
        "failures": run.failures, "images": [i.name for i in images],
        "points": [{
            "target": p.target, "label": p.label, "mode": p.mode, "load": p.load, "summary": p.summary,
            "batches": p.batches, "loadavg": p.loadavg, "cpu": p.cpu, "window_s": p.window[1] - p.window[0],
            "records": [{"t_send": round(r.t_send - p.window[0], 6), "t_done": round(r.t_done - p.window[0], 6),
                         "latency_ms": round(r.latency_ms, 2),
                         "status": r.status, "ok": r.ok, "error": r.error, "image": r.image, "polls": r.polls,
                         "timings": r.timings} for r in p.records],
        } for p in run.points],
    }
    a.raw.write_text(json.dumps(raw, indent=1, default=str), encoding="utf-8")
    log(f"wrote {report}, {a.raw}" + (f", {', '.join(plots)}" if plots else ""))
    return report


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    ap.add_argument("--quick", action="store_true", help="everything at a tiny scale, < 2 min (asserts no speed)")
    ap.add_argument("--out", type=Path, help="report folder: benchmarks.md and img/ (default docs; "
                                             "load_tests/out/quick with --quick)")
    ap.add_argument("--raw", type=Path, help="raw JSON (default load_tests/out/bench_results[_quick].json)")
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image folder (default %(default)s)")
    ap.add_argument("--n-images", type=int, default=20, help="evenly spaced subset of the sorted images (0 = all)")
    ap.add_argument("--image", action="append", dest="image_names", help="use this image (repeatable)")
    ap.add_argument("--targets", "--target", dest="targets", default=",".join(ALL_TARGETS),
                    help="comma-separated subset of " + ",".join(ALL_TARGETS))
    ap.add_argument("--clients", type=ints, help="closed-loop clients for engine-vs-service sweeps (default 1,2,4,8,16)")
    ap.add_argument("--handle-clients", type=ints, help="default 1,8")
    ap.add_argument("--jobs-clients", type=ints, help="default 8")
    ap.add_argument("--nobatch-clients", type=ints, help="default 1,4,16")
    ap.add_argument("--open-fraction", type=float, default=0.7, help="open-loop rate as a fraction of saturation")
    ap.add_argument("--open-rate", type=float, help="open-loop rate (img/s), instead of the fraction")
    ap.add_argument("--warmup", type=float, help="seconds per point before measuring (default 5; quick 0.5)")
    ap.add_argument("--duration", type=float, help="measured seconds per point (default 30; quick 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")
    ap.add_argument("--body", choices=("raw", "multipart"), default="raw", help="how HTTP requests carry the image")
    ap.add_argument("--config", type=Path, default=REPO / "deployments.yaml", help="Serve config to deploy")
    ap.add_argument("--port", type=int, default=8711, help="the service's HTTP port")
    ap.add_argument("--simple-port", type=int, default=8712, help="the simple server's port")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--jobs-force", action="store_true", help="run the jobs phase even if the probe fails")
    ap.add_argument("--deadline", type=float, help="skip the remaining points after this many seconds "
                                                   "(default 1500; quick 240)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--from-raw", type=Path, help="measure nothing: rewrite the report and plots of the run "
                                                  "recorded in this raw JSON (into --out, default its own)")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    q = args.quick
    args.clients = args.clients or ([1, 4] if q else [1, 2, 4, 8, 16])
    args.handle_clients = args.handle_clients or ([2] if q else [1, 8])
    args.jobs_clients = args.jobs_clients or ([2] if q else [8])
    args.nobatch_clients = args.nobatch_clients or ([4] if q else [1, 4, 16])
    args.warmup = args.warmup if args.warmup is not None else (0.5 if q else 5.0)
    args.duration = args.duration if args.duration is not None else (2.0 if q else 30.0)
    args.deadline = args.deadline or (240.0 if q else 1500.0)
    args.out = args.out or (REPO / "load_tests/out/quick" if q else REPO / "docs")
    args.raw = args.raw or REPO / f"load_tests/out/bench_results{'_quick' if q else ''}.json"
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in args.targets if t not in ALL_TARGETS]
    if bad:
        ap.error(f"unknown targets {bad}; choose from {ALL_TARGETS}")
    if args.open_fraction <= 0 or args.duration <= 0:
        ap.error("--open-fraction and --duration must be positive")
    args.config = args.config.resolve()
    args.images = args.images.resolve()
    args.out = args.out.resolve()
    args.raw = args.raw.resolve()
    return args


def rerender(args) -> int:
    raw = json.loads(args.from_raw.read_text(encoding="utf-8"))
    orig = parse_args(raw["argv"])
    if "--out" in (args.argv or []):
        orig.out = args.out
    orig.raw = args.from_raw.resolve()
    run = Run.from_raw(orig, raw)
    images = [Img(n, b"", "") for n in raw["images"]]
    write_outputs(run, images, write_raw=False)
    print(summary_line(run))
    return 0


async def main_async(args) -> int:
    images = pick_images(args.images, args.quick, None if args.n_images == 0 else args.n_images, args.image_names)
    run = Run(args)
    log(f"{len(images)} images, targets {','.join(args.targets)}, {args.warmup:g}+{args.duration:g} s per point")
    try:
        run_in_process(run, images)
        if "simple" in args.targets:
            await run_simple(run, images)
        if SERVICE_TARGETS & set(args.targets):
            await run_service(run, images)
    finally:
        write_outputs(run, images)
    print(summary_line(run))
    log(f"total {now() - run.t_start:.0f}s")
    return 1 if run.failures else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_raw:
        return rerender(args)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
