"""Soak run: the service from deployments.yaml under open-loop (Poisson) load
at about 70% of its measured saturation, for a long time; records every
replica's memory and reports errors and memory growth (docs/testing.md,
"The soak").

    .venv/bin/python -m load_tests soak --seconds 1200           # the long run (about 20 min)
    .venv/bin/python -m load_tests soak --seconds 60 --settle 30 --sizes 8 --out DIR   # CI's short one (tests/e2e/test_soak.py)
    .venv/bin/python -m load_tests soak --from-raw DIR/soak_raw.json --out DIR   # re-render, measure nothing

The good clients replay `--sizes` seeded random resizes of the peer images;
a hostile share (`--hostile`, a fraction of the good rate) is mixed in
(HOSTILE_KINDS: junk 400, oversized 413, trickled 408, dense pages past a
0.2 s deadline 504 or 503, and harness/hostile.py's costliest cheap
requests in turn), counted apart: the good clients must see no error.
Memory growth (each replica's private memory; the object store's shared
pages recorded apart) runs from the end of warm-up (every image read twice,
then up to 90 s at the soak rate) to the end. `soak(url, ...)` runs against
a started service; the command line starts its own. Writes
DIR/soak_raw.json and from it soak.md, summary.json, soak_memory.csv (and
soak_memory.png with matplotlib)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Optional


from harness import service
from harness import procfs
from load_tests.images import DEFAULT_IMAGES, SOAK_IMAGES, Img, load, pick_images, resized_variants
from load_tests.loadgen import closed_loop, http_sync, log, now, open_loop
from load_tests.report import write_soak_report
from load_tests.stats import summarize

REPO = service.REPO
DEPLOYMENTS = ["TextDetector", "DirectionClassifier", "TextRecognizer", "OcrPipeline", "OcrIngress"]


def replica_memory() -> dict[str, float]:
    """Private memory (MB) of every live replica process of the app, by
    "<deployment>:<pid>": RSS less its shared-memory pages (RssShmem). Those
    are pages of Ray's object store, mapped into every process that passes
    images and crops through it; the count creeps up as the store hands out
    new offsets, up to the store's size, which is Ray's shared memory, not
    the replica's. Recorded apart, under "<deployment>:<pid> shm"."""
    out = {}
    for name, pids in service.replica_pids(DEPLOYMENTS).items():
        for pid in pids:
            m = procfs.memory_mb(pid)
            if m is not None:
                out[f"{name}:{pid}"] = m["private"]
                out[f"{name}:{pid} shm"] = m["shared"]
    return out


HOSTILE_KINDS = ("junk", "oversized", "slow", "expired", "costly")
_COSTLY = [0]  # the next of harness/hostile.py's CASES a "costly" request sends


async def hostile_request(session, url: str, kind: str, dense: Img, slow_s: float = 15.0) -> str:
    """One hostile request of `kind`; its outcome ("400", "408", ..., or the
    exception's name). Never raises."""
    import aiohttp

    try:
        if kind == "slow":  # headers, then a byte a second: the ingress must give up (408)
            host, port = url.split("//", 1)[1].split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(f"POST /v1/ocr HTTP/1.1\r\nHost: {host}\r\nContent-Type: image/png\r\n"
                             f"Content-Length: 100000\r\n\r\n".encode())
                t_end = now() + slow_s * 2
                while now() < t_end:
                    writer.write(b"x")
                    await writer.drain()
                    try:
                        line = await asyncio.wait_for(reader.readline(), 1.0)
                        return line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"
                    except asyncio.TimeoutError:
                        continue
                return "no answer"
            finally:
                writer.close()
        if kind == "costly":  # the cheapest, costliest requests of issue 24, in turn
            from harness.hostile import CASES

            case = CASES[_COSTLY[0] % len(CASES)]
            _COSTLY[0] += 1
            body, ctype = case.request()
            kw = {"data": body, "headers": {"Content-Type": ctype}}
        elif kind == "junk":
            kw = {"data": bytes(range(256)) * 4, "headers": {"Content-Type": "image/png"}}
        elif kind == "oversized":
            kw = {"data": b"\0" * (21 * 1024 * 1024), "headers": {"Content-Type": "image/png"}}
        else:  # expired: a dense page that cannot be read in 0.2 s
            kw = {"data": dense.data, "headers": {"Content-Type": dense.ctype, "X-Request-Timeout": "0.2"}}
        async with session.post(f"{url}/v1/ocr", timeout=aiohttp.ClientTimeout(total=60), **kw) as r:
            await r.read()
            return str(r.status)
    except Exception as e:
        return type(e).__name__


async def hostile_load(session, url: str, rate: float, dense: Img, counts: dict, seed: int = 13) -> None:
    """Poisson arrivals of hostile requests, kinds in turn, until cancelled."""
    import random

    rng = random.Random(seed)
    tasks: set = set()

    async def one(kind: str) -> None:
        outcome = await hostile_request(session, url, kind, dense)
        counts.setdefault(kind, {})
        counts[kind][outcome] = counts[kind].get(outcome, 0) + 1

    k = 0
    try:
        while True:
            await asyncio.sleep(rng.expovariate(rate))
            t = asyncio.create_task(one(HOSTILE_KINDS[k % len(HOSTILE_KINDS)]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            k += 1
    finally:
        for t in list(tasks):
            t.cancel()


async def soak(url: str, seconds: float, fraction: float, timeout_s: float = 120, sizes: int = 48,
               hostile: float = 0.1, settle_s: Optional[float] = None) -> dict:
    """Measure; returns the raw document (records relative to the soak's start)."""
    import aiohttp

    peers = pick_images(DEFAULT_IMAGES, False, None, None)
    images = load(DEFAULT_IMAGES, SOAK_IMAGES) + (resized_variants(peers, sizes) if sizes else [])
    dense = load(DEFAULT_IMAGES, ["paddleocr_00018069.jpg"])[0]
    hostile_counts: dict = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def send(img, t_send=None):
            return await http_sync(session, url, img, timeout_s, t_send)

        for _ in range(2):  # every shape seen: each image twice, four at a time (as the soak's clients send)
            lane = asyncio.Semaphore(4)

            async def once(img):
                async with lane:
                    await send(img)

            await asyncio.gather(*(once(img) for img in images))
        recs, window, _ = await closed_loop(send, images, 4, 0.0, min(30.0, seconds / 4), "saturation")
        saturation = summarize(recs, window)["throughput"]
        rate = fraction * saturation
        if not rate > 0:
            raise RuntimeError(f"no rate to soak at: the saturation run got no answers ({summarize(recs, window)})")
        settle = min(90.0, seconds / 2) if settle_s is None else settle_s
        log(f"saturation ~{saturation:.2f} img/s; soaking at {rate:.2f} img/s for {seconds:.0f} s "
            f"after {settle:.0f} s of warm-up at that rate")
        # Warm-up at the soak rate itself: the Python replicas' heaps settle
        # in the first minutes of sustained load (seen: +13-19 MB in 2 min,
        # then flat), and growth is measured from after that.
        t_ws = now() + settle
        memory: list = []

        async def sample_memory() -> None:
            await asyncio.sleep(max(0.0, t_ws - now()))
            while True:
                memory.append((now() - t_ws, await asyncio.to_thread(replica_memory)))
                await asyncio.sleep(10.0)

        sampler = asyncio.create_task(sample_memory())
        bad = (asyncio.create_task(hostile_load(session, url, hostile * rate, dense, hostile_counts))
               if hostile > 0 else None)
        try:
            recs, (ws, we), _ = await open_loop(send, images, rate, settle, seconds, "soak", seed=7)
        finally:
            sampler.cancel()
            if bad is not None:
                bad.cancel()
        memory.append((now() - ws, await asyncio.to_thread(replica_memory)))
    return {"argv": sys.argv[1:], "seconds": seconds, "saturation_img_s": saturation, "offered_img_s": rate,
            "window_s": we - ws, "records": [r.to_json(ws) for r in recs if r.t_start >= ws],
            "memory": [[t, row] for t, row in memory], "images": len(images),
            "hostile_share": hostile, "hostile": hostile_counts}


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=1200)
    p.add_argument("--fraction", type=float, default=0.7, help="share of measured saturation to offer")
    p.add_argument("--sizes", type=int, default=48, help="random resizes of the peer images added to the mix")
    p.add_argument("--hostile", type=float, default=0.1,
                   help="hostile requests (junk, oversized, slow, expired, costly) per good one; 0: none")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds of warm-up at the soak rate before memory is first sampled (default: "
                        "half of --seconds, at most 90)")
    p.add_argument("--port", type=int, default=8723)
    p.add_argument("--config", type=Path, default=service.DEFAULT_CONFIG, help="Serve config to deploy")
    p.add_argument("--out", type=Path, default=REPO / "load_tests" / "out" / "soak")
    p.add_argument("--from-raw", type=Path, help="measure nothing: re-render a recorded soak_raw.json")


def main(args: argparse.Namespace) -> int:
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
    else:
        with service.served(service.load_config(args.config), args.port) as url:
            raw = asyncio.run(soak(url, args.seconds, args.fraction, sizes=args.sizes, hostile=args.hostile,
                                   settle_s=args.settle))
        args.out.mkdir(parents=True, exist_ok=True)  # every request and memory sample: the report is rendered from it
        (args.out / "soak_raw.json").write_text(json.dumps(raw, indent=1))
    summary = write_soak_report(raw, args.out)
    print(json.dumps(summary))
    return 0 if summary["errors"] == 0 else 1


def smoke(args: argparse.Namespace) -> int:
    """The soak's report of a tiny recorded run (two seconds, one replica's
    memory twice): no Ray, no models."""
    import tempfile

    from load_tests.cli import check
    from load_tests.stats import Record

    recs = [Record(0.2 * i, 0.2 * i + (100 + i) / 1000, 200, True, None, "a", None) for i in range(10)]
    recs.append(Record(1.0, 1.005, 0, False, "ClientError: x", "a", None))
    raw = {"seconds": 2.0, "saturation_img_s": 5.0, "offered_img_s": 3.5, "window_s": 2.0,
           "records": [r.to_json() for r in recs],
           "memory": [[0.0, {"TextDetector:1": 100.0, "TextDetector:1 shm": 5.0}],
                      [2.0, {"TextDetector:1": 102.0, "TextDetector:1 shm": 9.0}]]}
    with tempfile.TemporaryDirectory() as tmp:
        s = write_soak_report(raw, Path(tmp))
        check((s["requests"], s["errors"]) == (11, 1), f"requests and errors counted: {s}")
        check(s["memory_growth"] == {"TextDetector:1": 0.02}, f"memory growth per replica: {s['memory_growth']}")
        check("| TextDetector:1 | 100 | 102 | 2.00% |" in (Path(tmp) / "soak.md").read_text(), "the memory table")
    print(json.dumps(s))
    return 0
