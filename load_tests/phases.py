"""The benchmark's phases, one at a time (nothing else of ours runs while a
phase is measured): in-process baselines, the simple server, the service
(cold start, HTTP closed and open loop, handle, jobs, batching off). A phase
that fails is logged and recorded in the run; the next one still runs."""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Iterator, Optional

from load_tests.baselines import SimpleServer, engine_loop, rapidocr_loop
from load_tests.batches import BatchSampler, set_batching
from load_tests.images import Img
from load_tests.loadgen import Send, closed_loop, http_job, http_sync, log, now, open_loop, serve_handle
from load_tests.runs import LABELS, Point, Run
from harness.service import MODEL_DEPLOYMENTS as STAGES, Service, http_status
from load_tests.stats import Record, summarize


async def sweep(run: Run, target: str, send: Send, images: list[Img], clients: list[int],
                sampler: Optional[BatchSampler] = None) -> None:
    a = run.args
    for c in clients:
        if run.over_deadline(f"{LABELS[target]} at {c} clients"):
            return
        recs, window, (batches, cpu) = await closed_loop(send, images, c, a.warmup, a.duration,
                                                         f"{target} c={c}", sampler)
        run.add(target, "closed", c, recs, window, batches, cpu)


async def warm_pass(send: Send, images: list[Img], label: str) -> list[Record]:
    """One untimed sequential pass over the images."""
    t = now()
    recs = [await send(img, None) for img in images]
    bad = [r for r in recs if not r.ok]
    log(f"{label}: warm-up pass over {len(images)} images in {now() - t:.1f}s"
        + (f", {len(bad)} failed: {bad[0].error}" if bad else ""))
    return recs


@contextlib.contextmanager
def phase(run: Run, name: str) -> Iterator[None]:
    """Log the phase; when it fails, log and record why and keep going
    (an interrupt or a cancellation still ends the run)."""
    log(f"=== {name}")
    t = now()
    try:
        yield
    except Exception as e:
        msg = f"phase {name} failed: {type(e).__name__}: {e}"
        log(msg + "\n" + traceback.format_exc()[-3000:])
        run.failures.append(msg)
        return
    log(f"=== {name} done in {now() - t:.1f}s")


def run_in_process(run: Run, images: list[Img]) -> None:
    a = run.args
    for target, fn, name in (("engine", engine_loop, "engine in-process"),
                             ("rapidocr", rapidocr_loop, "rapidocr-onnxruntime in-process")):
        if target not in a.targets:
            continue
        with phase(run, name):
            recs, window, cpu, note = fn(images, a.duration, warm=not a.quick)
            run.notes.append(note)
            if recs is None:
                log(note)
            else:
                run.add(target, "loop", 1, recs, window, cpu=cpu)


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
            if http_status(f"{svc.url}/healthz", timeout=2) != 0:
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
                window = (first.t_start, now() + 1e-6)
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
                    await set_batching(svc.config, 1, sampler)
                    run.notes.append(f"batching off: redeployed with user_config max_batch_size 1 for "
                                     f"{', '.join(STAGES.values())}; replicas took it in {now() - t:.1f}s "
                                     f"(live reconfigure, same processes)")
                    await sweep(run, "nobatch", send_http, images, a.nobatch_clients, sampler)
    finally:
        if svc.started:
            log(f"service stopped in {svc.stop():.1f}s")
