"""The README's start command, `serve run deployments.yaml`, as a user runs
it: a fresh local Ray, the real config file (only the port changed, so a
service already on 8000 is left alone), real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from peer import PEER

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from load_tests.service import free_port  # noqa: E402


def test_serve_run_deployments_yaml(tmp_path):
    cfg = yaml.safe_load((REPO / "deployments.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    config = tmp_path / "deployments.yaml"
    config.write_text(yaml.safe_dump(cfg))
    serve_bin = Path(sys.executable).parent / "serve"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(serve_bin), "run", str(config)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if requests.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        else:
            raise AssertionError("not ready in 300 s:\n" + (tmp_path / "serve.log").read_text()[-3000:])
        with open(PEER / "rapidocr_ch_en_num.jpg", "rb") as f:
            r = requests.post(f"{url}/v1/ocr", files={"file": f}, timeout=120)
        assert r.status_code == 200
        body = r.json()
        assert body["results"][0]["text"] == "正品促销"
        from serve_app.engine import OcrEngine

        with OcrEngine() as eng:
            assert body["results"] == [l.to_dict() for l in eng.read(PEER / "rapidocr_ch_en_num.jpg").lines]
    finally:
        # `serve run` from a non-interactive shell ignores SIGINT; SIGTERM makes
        # it shut down the local Ray it started (and nothing else).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
