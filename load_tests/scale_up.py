"""From a load step to an autoscaled detector replica answering requests
(`startup serve-run --scale-up`, not a program of its own): deploys
deployments.yaml (TextDetector autoscales from 1 to 2 replicas), runs
`--base-clients` closed-loop HTTP clients over the peer images, steps to
`--step-clients`, and prints the timeline (Serve starts a replica, its
process starts, builds its predictor, is loaded, warmed, ready, listed
RUNNING, runs its first batch) beside throughput per interval.
`--target-ongoing` / `--upscale-delay` override the detector's autoscaling
config (default: the file's). `--idle`: no load; at the step the config is
deployed again with the detector's min_replicas raised by one (a replica
added on idle cores); the run ends once it is RUNNING.

    timeout 600 .venv/bin/python -m load_tests startup serve-run --scale-up [--idle]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time


from load_tests.images import pick_images
from load_tests.loadgen import http_sync
from harness.service import apply_config, load_config, replica_stats, served
from harness.peer import PEER
from load_tests.stats import md_table

DET = "TextDetector"


def replica_states() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get("ocr")
    if app is None or DET not in app.deployments:
        return {}
    return {str(k): v for k, v in app.deployments[DET].replica_states.items()}


async def run(a) -> dict:
    config = load_config()
    auto = next(d for d in config["applications"][0]["deployments"] if d["name"] == DET)["autoscaling_config"]
    if a.target_ongoing is not None:
        auto["target_ongoing_requests"] = a.target_ongoing
    if a.upscale_delay is not None:
        auto["upscale_delay_s"] = a.upscale_delay
    t = time.time()
    with served(config) as url:
        print(f"started and ready in {time.time() - t:.1f} s; detector autoscaling: {auto}", flush=True)
        return await measure(a, url, config, auto)


async def measure(a, url: str, config: dict, auto: dict) -> dict:
    """The load step (or, with a.idle, one replica more on idle cores) and
    the new replica's timeline, on the service at `url`."""
    import aiohttp
    from ray import serve

    handle = serve.get_deployment_handle(DET, "ocr")
    old_pids = set(await asyncio.to_thread(replica_stats, handle, 10**6, 4))  # pid -> stats of every replica 4 calls reach
    images = pick_images(PEER, False, a.n_images, None)
    done: list[tuple[float, bool, float]] = []  # (wall time done, ok, latency s)
    events: dict[str, float] = {}
    stop = asyncio.Event()
    clients = {"n": a.base_clients}

    async def client(i: int, session) -> None:
        k = i * 7
        while not stop.is_set():
            if i >= clients["n"]:
                await asyncio.sleep(0.05)
                continue
            img = images[k % len(images)]
            k += 1
            r = await http_sync(session, url, img, 120.0)
            done.append((time.time(), r.ok, r.latency_s))

    new: dict = {}

    async def watch() -> None:
        while not stop.is_set():
            states = await asyncio.to_thread(replica_states)
            now = time.time()
            if "step" in events:
                if states.get("STARTING", 0) and "starting_seen" not in events:
                    events["starting_seen"] = now
                if states.get("RUNNING", 0) >= 2 and "running_seen" not in events:
                    events["running_seen"] = now
            if "running_seen" in events:
                stats = await asyncio.to_thread(replica_stats, handle, 10**6, 12)
                fresh = {p: s for p, s in stats.items() if p not in old_pids}
                if fresh:
                    pid, st = next(iter(fresh.items()))
                    new.update(st, pid=pid)
                    if a.idle and st.get("ready_at") and "end" not in events:
                        events["end"] = now  # nothing will run on it: no load
                    b = [x for x in st["recent_batches"] if x["seq"] == 1]
                    if b and "first_batch" not in events:
                        events["first_batch"] = b[0]["t"] - b[0]["ms"] / 1000.0
                        events["end"] = now + a.after_s
            if "end" in events and now >= events["end"]:
                stop.set()
            await asyncio.sleep(0.25)

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(client(i, session)) for i in range(a.step_clients)]
        watcher = asyncio.create_task(watch())
        t_base = time.time()
        await asyncio.sleep(a.base_s)
        events["step"] = time.time()
        if a.idle:  # one replica more, as the autoscaler would add it, on idle cores
            auto["min_replicas"] = auto.get("min_replicas", 1) + 1
            auto["max_replicas"] = max(auto.get("max_replicas", 1), auto["min_replicas"])
            await asyncio.to_thread(apply_config, config)
            print(f"no load; detector min_replicas raised to {auto['min_replicas']}", flush=True)
        else:
            clients["n"] = a.step_clients
            print(f"load step: {a.base_clients} -> {a.step_clients} clients", flush=True)
        try:
            await asyncio.wait_for(stop.wait(), timeout=a.max_s)
        except asyncio.TimeoutError:
            print(f"no new replica served a request within {a.max_s:.0f} s of the step", flush=True)
            stop.set()
        stopped = time.time()
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher.cancel()
    return {"events": events, "new": new, "done": done, "t_base": t_base, "stopped": stopped,
            "old_pids": sorted(old_pids), "auto": auto}


def report(r: dict, a) -> str:
    ev, new = r["events"], r["new"]
    step = ev["step"]
    rows = [("load step", step, f"{a.base_clients} -> {a.step_clients} closed-loop HTTP clients")] if not a.idle else [
        ("config deployed again, detector min_replicas +1", step, "no load: both cores idle")]
    if "starting_seen" in ev:
        rows.append(("Serve lists a STARTING detector replica", ev["starting_seen"],
                     f"upscale_delay_s {r['auto'].get('upscale_delay_s')}, target_ongoing_requests "
                     f"{r['auto'].get('target_ongoing_requests')}"))
    if new.get("process_started_at"):
        rows.append(("replica process started", new["process_started_at"], f"pid {new['pid']}"))
    if new.get("started_at"):
        rows.append(("replica begins building its predictor", new["started_at"], "Ray worker start and imports before it"))
        rows.append(("predictor loaded", new["started_at"] + new["load_seconds"],
                     f"load {new['load_seconds']:.2f} s, cache {new.get('compile_cache')}"))
    if new.get("ready_at"):
        rows.append(("warmed, ready", new["ready_at"], f"warm-up {new['warm_seconds']:.2f} s"))
    if "running_seen" in ev:
        rows.append(("Serve lists it RUNNING", ev["running_seen"], "polled every 0.25 s"))
    if "first_batch" in ev:
        rows.append(("first request's batch runs on it", ev["first_batch"], ""))
    rows.sort(key=lambda x: x[1])
    out = md_table(["event", "s after the step", "note"], ([name, f"{t - step:+.2f}", note] for name, t, note in rows),
                   "lrl")
    if a.idle:  # no load: no throughput to show
        return "\n".join(out)
    # throughput and latency per interval
    intervals, w = [], a.interval_s
    k = -int(a.base_s // w)
    last = r["stopped"] - step  # answers after the stop (clients draining) are left out
    while k * w < last:
        lo, hi = k * w, (k + 1) * w
        sel = [(ok, lat) for t, ok, lat in r["done"] if lo <= t - step < hi]
        oks = [lat for ok, lat in sel if ok]
        p50 = f"{statistics.median(oks) * 1000:.0f}" if oks else "-"
        intervals.append([f"{lo:+.0f} .. {hi:+.0f}", len(oks), f"{len(oks) / w:.2f}", p50, len(sel) - len(oks)])
        k += 1
    return "\n".join([*out, "", *md_table(["interval (s from step)", "answers", "img/s", "p50 ms", "errors"], intervals)])


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base-clients", type=int, default=1)
    ap.add_argument("--step-clients", type=int, default=12)
    ap.add_argument("--base-s", type=float, default=10.0, help="seconds at the base load before the step")
    ap.add_argument("--after-s", type=float, default=10.0, help="seconds kept after the new replica's first batch")
    ap.add_argument("--max-s", type=float, default=180.0, help="give up this long after the step")
    ap.add_argument("--interval-s", type=float, default=5.0)
    ap.add_argument("--n-images", type=int, default=20)
    ap.add_argument("--target-ongoing", type=float)
    ap.add_argument("--upscale-delay", type=float)
    ap.add_argument("--idle", action="store_true",
                    help="no load: add a detector replica by raising min_replicas (both cores idle)")


def main(args: argparse.Namespace) -> int:
    a = args
    if a.idle:
        a.base_clients = a.step_clients = 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    r = asyncio.run(run(a))
    print(f"\nRun {started}; {' '.join(sys.argv[1:]) or 'defaults'}\n")
    print(report(r, a))
    return 0
