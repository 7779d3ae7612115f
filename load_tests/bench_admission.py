"""Benchmark: admission by cost (serve_app/http/policies/admission.py) against the count
limit alone, under overload, in one run on one service (deployments.yaml,
result cache off as in every benchmark):

1. the saturation throughput: N closed-loop clients over a mix of peer
   images (or --rate gives the offered load directly);
2. open-loop Poisson arrivals at --factor (2) x that rate for --seconds,
   every request with the same deadline (X-Request-Timeout), admission off
   (ingress.admission.enabled: false: today's count-only limit,
   max_in_flight), then the service redeployed with admission on and the
   same arrivals (same seed, same images in the same order).

Each run is preceded by one pass over the images one at a time (with
admission on, the requests that teach its cost model). Work spent on
requests that got no answer: the images the detector ran (its replicas'
batch records) less the answers (each answered image was detected once),
and the recogniser's crops per answered image.

    .venv/bin/python -m load_tests hostile admission [--deadline 4] [--seconds 40] [--factor 2] [--rate R]

Prints a table per mode: sent, answered (200), refused (503), 504, other,
the share of accepted (not refused) requests answered within their
deadline, goodput (answers within the deadline per second), p50/p99 latency
of the answers, lines read, the refusals' median Retry-After, and the work
spent on unanswered requests."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


from harness import service  # noqa: E402
from load_tests.images import DEFAULT_IMAGES, SOAK_IMAGES, Img, load  # noqa: E402
from load_tests.loadgen import log  # noqa: E402
from load_tests.stats import percentile  # noqa: E402
from load_tests.cli import standalone  # noqa: E402


@dataclass
class Answer:
    t_send: float
    latency_s: float
    status: int
    lines: int = 0
    retry_after: Optional[float] = None
    code: str = ""
    image: str = ""


async def send(session, url: str, img: Img, deadline_s: Optional[float], t_send: float) -> Answer:
    import aiohttp

    headers = {"Content-Type": img.ctype}
    if deadline_s is not None:
        headers["X-Request-Timeout"] = f"{deadline_s:g}"
    status, lines, retry, code = 0, 0, None, ""
    try:
        async with session.post(f"{url}/v1/ocr", data=img.data, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=300)) as r:
            status = r.status
            body = await r.read()
            if "retry-after" in r.headers:
                retry = float(r.headers["retry-after"])
        doc = json.loads(body)
        if status == 200:
            lines = len(doc.get("results", []))
        else:
            code = (doc.get("error") or {}).get("code", "")
    except Exception as e:  # recorded, never raised
        code = type(e).__name__
    return Answer(t_send, time.perf_counter() - t_send, status, lines, retry, code, img.name)


async def sequential_pass(session, url: str, images: list[Img]) -> None:
    for img in images:
        a = await send(session, url, img, None, time.perf_counter())
        if a.status != 200:
            log(f"warm-up {img.name}: {a.status} {a.code}")


async def closed_loop_rate(session, url: str, images: list[Img], clients: int, seconds: float) -> float:
    """Answers per second of N clients, each sending when its answer is in."""
    end = time.perf_counter() + seconds
    done = 0

    async def client(i: int) -> None:
        nonlocal done
        k = i
        while time.perf_counter() < end:
            a = await send(session, url, images[k % len(images)], None, time.perf_counter())
            k += 1
            done += a.status == 200

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return done / (time.perf_counter() - t0)


async def open_loop(session, url: str, images: list[Img], rate: float, seconds: float, deadline_s: float,
                    seed: int) -> list[Answer]:
    rng = random.Random(seed)
    order = random.Random(seed + 1)
    tasks = []
    t0 = time.perf_counter()
    t_next = t0
    while True:
        t_next += rng.expovariate(rate)
        if t_next >= t0 + seconds:
            break
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        img = images[order.randrange(len(images))]
        tasks.append(asyncio.create_task(send(session, url, img, deadline_s, t_next)))
    return list(await asyncio.gather(*tasks))


def with_admission(config: dict, enabled: bool) -> dict:
    import copy

    cfg = copy.deepcopy(config)
    for app in cfg["applications"]:
        ing = app.setdefault("args", {}).setdefault("ingress", {})
        ing["admission"] = {**ing.get("admission", {}), "enabled": enabled}
    return cfg


async def wait_admission(session, url: str, enabled: bool, timeout_s: float = 300) -> dict:
    """Until the ingress answering /v1/stats has admission `enabled`; its figures."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        try:
            async with session.get(f"{url}/v1/stats") as r:
                if r.status == 200:
                    adm = (await r.json())["ingress"]["admission"]
                    if adm["enabled"] is enabled:
                        return adm
        except Exception:
            pass
        await asyncio.sleep(1.0)
    raise TimeoutError(f"the ingress did not take admission enabled={enabled} in {timeout_s:.0f}s")


async def admission_stats(session, url: str) -> dict:
    await asyncio.sleep(1.1)  # /v1/stats is cached for ingress.stats_cache_s
    async with session.get(f"{url}/v1/stats") as r:
        return (await r.json())["ingress"]["admission"]


def summarize(label: str, answers: list[Answer], seconds: float, deadline_s: float, work: dict) -> dict:
    ok = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 503]
    late = [a for a in answers if a.status == 504]
    accepted = len(answers) - len(refused)
    in_time = [a for a in ok if a.latency_s <= deadline_s]
    det = work["det"]["items"]
    crops = work["rec"]["items"]
    return {
        "mode": label, "sent": len(answers), "answered": len(ok), "refused_503": len(refused), "late_504": len(late),
        "other": accepted - len(ok) - len(late),
        "in_deadline_of_accepted": len(in_time) / accepted if accepted else float("nan"),
        "goodput": len(in_time) / seconds,
        "p50_ms": percentile([a.latency_s * 1000 for a in ok], 50),
        "p99_ms": percentile([a.latency_s * 1000 for a in ok], 99),
        "lines": sum(a.lines for a in ok),
        "retry_after_p50": statistics.median([a.retry_after for a in refused if a.retry_after is not None])
        if refused else float("nan"),
        "det_images": det, "det_unanswered": det - len(ok),
        "crops_per_answer": crops / len(ok) if ok else float("nan"),
        "batches_lost": work["overflow"],
        "by_image": {name: {c: sum(1 for a in answers if a.image == name and a.status == c) for c in (200, 503, 504)}
                     for name in sorted({a.image for a in answers})},
        "late_first_10s": sum(1 for a in late if a.t_send - answers[0].t_send < 10) if answers else 0,
    }


async def measured(session, url: str, images: list[Img], rate: float, args, sampler) -> tuple[list[Answer], dict]:
    await sampler.begin()
    answers = await open_loop(session, url, images, rate, args.seconds, args.deadline, args.seed)
    await asyncio.sleep(1.0)  # the replicas finish (or drop) what is left
    work = await sampler.end()
    stages = {s: {"items": sum(b["items"] for b in sampler.acc[s])} for s in ("det", "rec")}
    return answers, {**stages, "overflow": work["overflow"]}


async def run(args) -> int:
    import aiohttp

    from load_tests.batches import BatchSampler

    images = load(DEFAULT_IMAGES, SOAK_IMAGES)
    config = service.load_config(args.config)
    config.pop("http_options", None)
    service.start_ray()
    rows, stats_on = [], {}
    try:
        url = service.deploy_config(with_admission(config, False), args.port or service.free_port())
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_admission(session, url, False)
            await sequential_pass(session, url, images)
            rate = args.rate
            if rate is None:
                log(f"saturation: {args.clients} clients for {args.sat_seconds:g} s")
                sat = await closed_loop_rate(session, url, images, args.clients, args.sat_seconds)
                rate = args.factor * sat
                log(f"saturation {sat:.2f} img/s -> offered {rate:.2f} img/s")
            sampler = BatchSampler()
            log(f"admission off: {rate:.2f} img/s for {args.seconds:g} s, deadline {args.deadline:g} s")
            answers, work = await measured(session, url, images, rate, args, sampler)
            rows.append(summarize("count limit only (admission off)", answers, args.seconds, args.deadline, work))
            t = time.perf_counter()
            service.apply_config(with_admission(config, True))
            await wait_admission(session, url, True)
            service.wait_ready(url)
            service.wait_replicas(config)
            log(f"redeployed with admission on in {time.perf_counter() - t:.0f} s")
            await sequential_pass(session, url, images)
            await sequential_pass(session, url, images)  # requests that ran alone: the cost model's data
            log(f"admission on: {rate:.2f} img/s for {args.seconds:g} s, deadline {args.deadline:g} s")
            answers, work = await measured(session, url, images, rate, args, sampler)
            rows.append(summarize("admission by cost (on)", answers, args.seconds, args.deadline, work))
            stats_on = await admission_stats(session, url)
    finally:
        service.stop_all(graceful=False)
    print(f"\n{len(images)} images ({', '.join(i.name for i in images)}), Poisson arrivals at {rate:.2f} img/s "
          f"({'given' if args.rate else f'{args.factor:g} x saturation'}) for {args.seconds:g} s, "
          f"X-Request-Timeout {args.deadline:g} s, seed {args.seed}\n")
    print("| mode | sent | 200 | 503 | 504 | other | accepted in deadline | goodput img/s | p50 ms | p99 ms "
          "| lines read | Retry-After p50 s | detector images | det. images unanswered | rec crops / answer |")
    print("|---|" + "---:|" * 14)
    for r in rows:
        print(f"| {r['mode']} | {r['sent']} | {r['answered']} | {r['refused_503']} | {r['late_504']} | {r['other']} "
              f"| {100 * r['in_deadline_of_accepted']:.1f}% | {r['goodput']:.2f} | {r['p50_ms']:.0f} "
              f"| {r['p99_ms']:.0f} | {r['lines']} | {r['retry_after_p50']:g} | {r['det_images']} "
              f"| {r['det_unanswered']} | {r['crops_per_answer']:.1f} |")
    print("\n| image | " + " | ".join(f"{r['mode']}: 200 / 503 / 504" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for name in rows[0]["by_image"]:
        print(f"| {name} | " + " | ".join(" / ".join(str(r["by_image"][name][c]) for c in (200, 503, 504))
                                            for r in rows) + " |")
    print("\n504s sent in the first 10 s of each run: " + ", ".join(f"{r['mode']}: {r['late_first_10s']}" for r in rows))
    if any(r["batches_lost"] for r in rows):
        print("\n(some batch records were lost between reads: the detector counts are low)")
    print(f"\nadmission at the end of its run: {json.dumps(stats_on)}")
    return 0


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=service.DEFAULT_CONFIG)
    p.add_argument("--deadline", type=float, default=4.0, help="X-Request-Timeout of every request (s)")
    p.add_argument("--seconds", type=float, default=40.0, help="length of each open-loop run")
    p.add_argument("--factor", type=float, default=2.0, help="offered load over the saturation throughput")
    p.add_argument("--rate", type=float, default=None, help="offered load (img/s); skips the saturation run")
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients for the saturation run")
    p.add_argument("--sat-seconds", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--port", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
