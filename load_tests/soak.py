"""Soak run: the service from deployments.yaml under open-loop (Poisson) load
at about 70% of its measured saturation, for a long time; records every
replica's memory and reports errors and memory growth.

    .venv/bin/python load_tests/soak.py --seconds 1200           # the long run (about 20 min)
    .venv/bin/python load_tests/soak.py --seconds 120 --out DIR  # CI's short version (tests/e2e/test_soak.py)

Memory growth (each replica's private memory: RSS less the shared pages of
Ray's object store, which are recorded apart) is measured from the end of warm-up (every soak image read
twice, so every shape the replicas will see has been seen, then up to 90 s
at the soak rate, so the heaps have settled) to the end.
Writes DIR/soak.md (table and summary), DIR/soak_memory.csv and, with
matplotlib, DIR/soak_memory.png."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import sys
import time
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
PEER = REPO / "tests" / "data" / "peer"
IMAGES = ["rapidocr_ch_en_num.jpg", "rapidocr_issue_170.png", "paddleocr_00006737.jpg", "mmocr_wildreceipt_2.jpeg",
          "mmocr_icdar15_img_8.jpg", "rapidocr_test_without_det.jpg", "paddleocr_00111002.jpg", "mmocr_word_1036169.jpg"]
STAGES = ["TextDetector", "DirectionClassifier", "TextRecognizer", "OcrPipeline", "OcrIngress"]


def start_service(port: int) -> str:
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    cfg = yaml.safe_load((REPO / "deployments.yaml").read_text())
    cfg.pop("http_options")
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(cfg))
    return f"http://127.0.0.1:{port}"


def replica_memory() -> dict[str, float]:
    """Private memory (MB) of every live replica process of the app, by
    deployment: RSS less its shared-memory pages (RssShmem). Those are pages
    of Ray's object store, mapped into every process that passes images and
    crops through it; the count creeps up as the store hands out new
    offsets, up to the store's size, which is Ray's shared memory, not the
    replica's. Recorded apart, under "<replica> shm"."""
    import ray

    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        for name in STAGES:
            if f"#{name}#" in a["name"]:
                pid = ray.get(ray.get_actor(a["name"], namespace=a["namespace"]).__ray_call__.remote(
                    lambda self: __import__("os").getpid()))
                try:
                    status = open(f"/proc/{pid}/status").read()
                    rss, shm = (int(status.split(f"{k}:")[1].split()[0]) / 1024 for k in ("VmRSS", "RssShmem"))
                except (FileNotFoundError, IndexError):
                    continue
                out[f"{name}:{pid}"] = rss - shm
                out[f"{name}:{pid} shm"] = shm
    return out


async def wait_ready(session, url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{url}/readyz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1)
    raise TimeoutError("service not ready")


async def one(session, url: str, data: bytes, results: list) -> None:
    """Never raises: records (start, latency s, status or error)."""
    t = time.monotonic()
    try:
        async with session.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "application/octet-stream"}) as r:
            await r.read()
            results.append((t, time.monotonic() - t, r.status))
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        results.append((t, time.monotonic() - t, type(e).__name__))


async def closed_loop_rate(session, url: str, images: list[bytes], clients: int, seconds: float) -> float:
    results: list = []
    end = time.monotonic() + seconds

    async def client(i):
        k = i
        while time.monotonic() < end:
            await one(session, url, images[k % len(images)], results)
            k += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return sum(1 for r in results if r[2] == 200) / (time.monotonic() - t0)


async def soak(url: str, seconds: float, out: Path, fraction: float) -> dict:
    images = [(PEER / n).read_bytes() for n in IMAGES]
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await wait_ready(session, url)
        warm: list = []
        for _ in range(2):
            for data in images:
                await one(session, url, data, warm)
        saturation = await closed_loop_rate(session, url, images, clients=4, seconds=min(30.0, seconds / 4))
        rate = fraction * saturation
        print(f"saturation ~{saturation:.2f} img/s; soaking at {rate:.2f} img/s for {seconds:.0f} s", file=sys.stderr)
        rng = random.Random(7)
        # Warm-up at the soak rate itself: the Python replicas' heaps settle
        # in the first minutes of sustained load (seen: +13-19 MB in 2 min,
        # then flat), and growth is measured from after that.
        settle: list = []
        t_settle = time.monotonic()
        pending = []
        while time.monotonic() - t_settle < min(90.0, seconds / 2):
            pending.append(asyncio.create_task(one(session, url, images[len(pending) % len(images)], settle)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*pending)
        mem_rows = [(0.0, replica_memory())]
        results: list = []
        tasks = []
        t0 = time.monotonic()
        next_sample = t0 + 10
        k = 0
        while time.monotonic() - t0 < seconds:
            tasks.append(asyncio.create_task(one(session, url, images[k % len(images)], results)))
            k += 1
            await asyncio.sleep(rng.expovariate(rate))
            if time.monotonic() >= next_sample:
                mem_rows.append((time.monotonic() - t0, await asyncio.to_thread(replica_memory)))
                next_sample += 10
        await asyncio.gather(*tasks)
        mem_rows.append((time.monotonic() - t0, replica_memory()))
    return report(results, mem_rows, saturation, rate, seconds, out)


def report(results, mem_rows, saturation, rate, seconds, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if r[2] == 200]
    errors = [r for r in results if r[2] != 200]
    lat = sorted(r[1] for r in ok)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan"))
    keys = sorted(mem_rows[0][1])
    growth = {}
    for key in [k for k in keys if not k.endswith(" shm")]:
        start = mem_rows[0][1].get(key)
        end = mem_rows[-1][1].get(key)
        if start and end:
            growth[key] = (end - start) / start
    with open(out / "soak_memory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s"] + keys)
        for t, row in mem_rows:
            w.writerow([round(t, 1)] + [round(row.get(k, float("nan")), 1) for k in keys])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        for k in growth:
            ax.plot([t for t, _ in mem_rows], [row.get(k) for _, row in mem_rows], label=k.split(":")[0])
        ax.set_xlabel("seconds into the soak")
        ax.set_ylabel("replica private memory (RSS less shared, MB)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "soak_memory.png", dpi=100)
    except ImportError:
        pass
    summary = {
        "seconds": seconds, "saturation_img_s": round(saturation, 3), "offered_img_s": round(rate, 3),
        "requests": len(results), "errors": len(errors), "error_kinds": sorted({str(e[2]) for e in errors}),
        "p50_ms": round(pct(0.5), 1), "p99_ms": round(pct(0.99), 1),
        "max_memory_growth": round(max(growth.values()), 4) if growth else None,
        "memory_growth": {k: round(v, 4) for k, v in growth.items()},
        "memory_mb": {k: [round(mem_rows[0][1][k], 1), round(mem_rows[-1][1][k], 1)] for k in growth},
        "shared_mb": {k: [round(mem_rows[0][1].get(f"{k} shm", 0), 1), round(mem_rows[-1][1].get(f"{k} shm", 0), 1)]
                      for k in growth},
    }
    lines = ["# Soak", "", f"`load_tests/soak.py --seconds {seconds:.0f}`", "",
             "| requests | errors | offered img/s | saturation img/s | p50 ms | p99 ms | max replica memory growth |",
             "|---|---|---|---|---|---|---|",
             f"| {summary['requests']} | {summary['errors']} | {summary['offered_img_s']} | {summary['saturation_img_s']} "
             f"| {summary['p50_ms']} | {summary['p99_ms']} | {summary['max_memory_growth']:.2%} |", "",
             "Memory: each replica's private memory (RSS less the object store's shared pages it has touched,"
             " shown apart), from the end of warm-up to the end.", "",
             "| replica | private start MB | private end MB | growth | shared (object store) start -> end MB |",
             "|---|---|---|---|---|"]
    for k in growth:
        shm = f"{k} shm"
        lines.append(f"| {k} | {mem_rows[0][1][k]:.0f} | {mem_rows[-1][1][k]:.0f} | {growth[k]:.2%} "
                     f"| {mem_rows[0][1].get(shm, float('nan')):.0f} -> {mem_rows[-1][1].get(shm, float('nan')):.0f} |")
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=1200)
    p.add_argument("--fraction", type=float, default=0.7, help="share of measured saturation to offer")
    p.add_argument("--port", type=int, default=8723)
    p.add_argument("--out", type=Path, default=REPO / "load_tests" / "out" / "soak")
    args = p.parse_args(argv)
    url = start_service(args.port)
    try:
        summary = asyncio.run(soak(url, args.seconds, args.out, args.fraction))
    finally:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
