"""The systems the service is compared with: the in-process engine, RapidOCR
(on onnxruntime, and for bench_engine.py also on Paddle), and the simple
server (load_tests/simple_server.py: one process, one engine behind a lock)
as a subprocess. bench.py loads them as loops over image bytes
(`engine_loop`, `rapidocr_loop`); bench_engine.py as `System`s that read an
image path (`make_engine`, `make_rapidocr`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from load_tests.images import Img
from load_tests.loadgen import loop_baseline, now
from load_tests.runs import dist_version
from harness.service import REPO, http_status, wait_ready

STAGES = ("det", "cls", "rec")


def engine_loop(images: list[Img], duration_s: float, warm: bool = True):
    """The in-process engine (serve_app's defaults), one image at a time.
    Returns (records, window, cpu, note)."""
    from serve_app.engine import OcrEngine

    t = now()
    eng = OcrEngine()
    note = (f"engine (in-process) loaded in {now() - t:.1f}s; predictor threads "
            f"{eng.config.predictor.cpu_math_library_num_threads}, pinned to {eng.config.predictor.cpu_affinity}")
    try:
        recs, window, cpu = loop_baseline("engine", lambda b: eng.read(b).timings_ms, images, duration_s, warm=warm)
    finally:
        eng.close()
    return recs, window, cpu, note


def rapidocr_loop(images: list[Img], duration_s: float, warm: bool = True):
    """RapidOCR on onnxruntime with its defaults, one image at a time.
    Returns (records, window, cpu, note); records None (and why, in the
    note) if rapidocr_onnxruntime cannot be imported."""
    try:
        from rapidocr_onnxruntime import RapidOCR
    except Exception as e:
        return None, None, None, f"rapidocr-onnxruntime skipped: cannot import it ({type(e).__name__}: {e})"
    t = now()
    ocr = RapidOCR()
    note = (f"rapidocr-onnxruntime {dist_version('rapidocr-onnxruntime')} loaded in {now() - t:.1f}s, "
            f"default settings (onnxruntime threads: its default)")
    call: Callable[[bytes], Optional[dict]] = lambda b: (ocr(b), None)[1]  # noqa: E731
    recs, window, cpu = loop_baseline("rapidocr", call, images, duration_s, warm=warm)
    return recs, window, cpu, note


class SimpleServer:
    def __init__(self, port: int, log_path: Path):
        self.port, self.log_path = port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float) -> float:
        if http_status(f"{self.url}/healthz", timeout=2) != 0:
            raise RuntimeError(f"port {self.port} already answers; pick another with --simple-port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "load_tests.simple_server", "--host", "127.0.0.1", "--port", str(self.port)],
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
# bench_engine.py's systems: an image path in, its text lines and stage seconds out


@dataclass
class CallOutput:
    texts: list[str]
    stages_s: dict[str, float]
    error: Optional[str] = None


@dataclass
class System:
    name: str
    call: Callable[[str], CallOutput]
    load_s: float
    detail: str
    close: Callable[[], None] = lambda: None


def make_engine(threads: int, which: str) -> System:
    from serve_app.engine import OcrEngine, default_engine_config

    base = default_engine_config()
    if which == "reference":
        from serve_app.core.engine_config import reference_config

        base = reference_config(predictor=base.predictor)
    cfg = base.model_copy(update={"predictor": base.predictor.model_copy(
        update={"cpu_math_library_num_threads": threads})})
    t0 = time.perf_counter()
    eng = OcrEngine(cfg)
    load_s = time.perf_counter() - t0

    def call(path: str) -> CallOutput:
        res = eng.read(path)
        t = res.timings_ms
        return CallOutput([ln.text for ln in res.lines], {s: t.get(s, 0.0) / 1000.0 for s in STAGES})

    p = cfg.predictor
    detail = (
        f"config={which}, cpu_math_library_num_threads={p.cpu_math_library_num_threads}, "
        f"openvino={p.enable_openvino_engine}, mkldnn={p.enable_mkldnn}, affinity={p.cpu_affinity}, "
        f"det limit {cfg.det.limit_side_len}/{cfg.det.limit_type}"
    )
    return System("engine", call, load_s, detail, eng.close)


def make_rapidocr(name: str, threads: int) -> System:
    if name == "rapidocr-paddle":
        from rapidocr_paddle import RapidOCR
        import rapidocr_paddle as pkg

        kwargs = {"cpu_math_library_num_threads": threads}
    else:
        from rapidocr_onnxruntime import RapidOCR
        import rapidocr_onnxruntime as pkg

        kwargs = {"intra_op_num_threads": threads}
    if threads > (os.cpu_count() or 1):
        print(f"warning: {name} ignores {threads} threads > os.cpu_count(); it will use its default",
              file=sys.stderr)
    t0 = time.perf_counter()
    ocr = RapidOCR(**kwargs)
    load_s = time.perf_counter() - t0
    acc = {s: 0.0 for s in STAGES}

    def timed(stage: str, fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[stage] += time.perf_counter() - t
        return inner

    # RapidOCR's det/cls/rec calls timed: instance attributes shadow what its __call__ looks up as self.text_det etc.
    for stage in STAGES:
        setattr(ocr, f"text_{stage}", timed(stage, getattr(ocr, f"text_{stage}")))

    def call(path: str) -> CallOutput:
        acc.update({s: 0.0 for s in STAGES})
        result, _elapse = ocr(path)
        return CallOutput([str(r[1]) for r in result] if result else [], dict(acc))

    detail = (f"{name} {dist_version(name)} ({Path(pkg.__file__).parent.name}), "
              + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ", other settings default")
    return System(name, call, load_s, detail)
