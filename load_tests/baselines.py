"""The systems the service is compared with, measured in the same run on the
same images: the in-process engine, RapidOCR on onnxruntime (in-process),
and the simple server (load_tests/simple_server.py, one process, one engine
behind a lock) as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from load_tests.images import Img
from load_tests.loadgen import loop_baseline, now
from load_tests.runs import dist_version
from load_tests.service import REPO, http_status, wait_ready


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

