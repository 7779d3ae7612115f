"""#29 item 6: Ray Serve's throughput-optimized mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1).
Its stage calls are gRPC messages of at most 4 MiB; the peer set's 1600x1200
receipt (5.76 MB decoded) was a 500. Serve reads the mode when it is
imported, in every process of the cluster, so the service runs in a child
process with its own cluster (load_tests/throughput_mode.py's child, the
benchmark's set-up): real Ray, real models, real HTTP, and a synchronous
handle call from another plain driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_big_image_is_read_in_throughput_optimized_mode(tmp_path):
    out = tmp_path / "throughput.json"
    env = {**os.environ, "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "load_tests.throughput_mode", "--child", "throughput",
                           "--out", str(out), "--seconds", "2", "--clients", "2", "--repeats", "1",
                           "--handle-loops", "1"],  # the router in its own loop: the documented way (asserted below)
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=800)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["grpc_between_deployments"] is True  # the mode was on in the service's processes
    assert r["receipt_status"] == 200, r["receipt_texts"]
    assert "SAFEWAY" in r["receipt_texts"] and "703-777-5833" in r["receipt_texts"]
    assert r["one_receipt"]["codes"] == [200] and set(r["saturation"]["codes"]) == {"200"}, r
    # A sync handle from a plain driver: documented to need the router in its own loop (docs/deploy.md).
    assert r["handle_sep1"]["ok"] and r["handle_sep1"]["lines"] > 20, r["handle_sep1"]
