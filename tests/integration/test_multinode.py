"""A real two-node Ray cluster on one machine (separate raylets started with
`ray start`), deployed with `serve deploy` as the README shows; then the
second node is stopped under load."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from harness.peer import PEER
from harness.service import REPO, free_port, load_config, wait_ready

BIN = Path(sys.executable).parent
ENV = {**os.environ, "RAY_AUTH_MODE": "token"}


def ray_cmd(*args, **kw):
    return subprocess.run([str(BIN / "ray"), *args], env=ENV, capture_output=True, text=True, timeout=180, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gcs, dash = free_port(), free_port()
    head = ray_cmd("start", "--head", f"--port={gcs}", "--num-cpus=2", "--resources={\"head\": 1}",
                   "--include-dashboard=true", f"--dashboard-port={dash}", "--disable-usage-stats")
    assert head.returncode == 0, head.stderr[-2000:]
    log = open(tmp_path_factory.mktemp("worker") / "worker.log", "w")
    worker = subprocess.Popen([str(BIN / "ray"), "start", f"--address=127.0.0.1:{gcs}", "--num-cpus=2",
                               "--num-gpus=1", "--block"], env=ENV, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "token"  # this driver joins a `ray start` cluster, which checks tokens
    try:
        import ray

        ray.init(address=f"127.0.0.1:{gcs}", log_to_driver=False)
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield {"gcs": gcs, "dashboard": f"http://127.0.0.1:{dash}", "worker": worker}
    finally:
        import ray

        ray.shutdown()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        ray_cmd("stop")  # only this test's cluster runs under `ray start` here
        log.close()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def cluster_config(port: int) -> dict:
    cfg = load_config()
    cfg["http_options"]["port"] = port
    app = cfg["applications"][0]
    for d in app["deployments"]:
        if d["name"] == "JobStore":  # state stays on the head, which is not stopped
            d["ray_actor_options"]["resources"] = {"head": 0.01}
        if d["name"] in ("TextDetector", "TextRecognizer"):
            d.pop("autoscaling_config", None)
            d["num_replicas"] = 2
            d["max_replicas_per_node"] = 1  # one on each node (Serve may otherwise pack them)
    return cfg


def test_serve_deploy_spreads_over_nodes_and_survives_losing_one(cluster, tmp_path):
    from ray import serve

    port = free_port()
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump(cluster_config(port)))
    out = subprocess.run([str(BIN / "serve"), "deploy", str(config), "-a", cluster["dashboard"]],
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, 300)

    # /readyz needs one ready replica per stage; wait for both replicas of each before checking spread.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        deps = serve.status().applications["ocr"].deployments
        if all(deps[n].replica_states.get("RUNNING", 0) == 2 for n in ("TextDetector", "TextRecognizer")):
            break
        time.sleep(2)
    deps = serve.status().applications["ocr"].deployments
    assert all(deps[n].replica_states.get("RUNNING", 0) == 2 for n in ("TextDetector", "TextRecognizer")), \
        {n: deps[n].replica_states for n in ("TextDetector", "TextRecognizer")}

    from ray.util.state import list_actors

    placed: dict[str, set[str]] = {}
    for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000):
        for name in ("TextDetector", "TextRecognizer"):
            if a.class_name == f"ServeReplica:ocr:{name}":
                placed.setdefault(name, set()).add(a.node_id)
    assert set(placed) == {"TextDetector", "TextRecognizer"}, placed
    assert all(len(v) == 2 for v in placed.values()), f"replicas did not spread over both nodes: {placed}"

    data = (PEER / "rapidocr_ch_en_num.jpg").read_bytes()
    first = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)
    assert first.status_code == 200 and first.json()["results"][0]["text"] == "正品促销"
    expected = first.json()["results"]

    # Under load, stop the second node.
    stop = threading.Event()
    outcomes: list[tuple[float, int]] = []

    def client():
        while not stop.is_set():
            try:
                r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)
                outcomes.append((time.monotonic(), r.status_code))
            except requests.RequestException:
                outcomes.append((time.monotonic(), -1))

    jobs = [requests.post(f"{url}/v1/ocr/jobs", data=data, headers={"Content-Type": "image/jpeg"},
                          timeout=60).json()["job_id"] for _ in range(10)]
    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(5)
    killed_at = time.monotonic()
    os.killpg(cluster["worker"].pid, signal.SIGTERM)
    cluster["worker"].wait(timeout=60)
    time.sleep(40)
    stop.set()
    for t in threads:
        t.join()

    failed = [t - killed_at for t, code in outcomes if t > killed_at and code != 200]
    print(f"after the node stopped: {len(failed)} failed requests, the last {max(failed, default=0):.1f} s after")
    late = [code for t, code in outcomes if t > killed_at + 25]
    assert late and set(late) == {200}, outcomes[-20:]
    statuses = serve.status().applications["ocr"].deployments
    assert statuses["TextRecognizer"].replica_states.get("RUNNING", 0) >= 1
    deadline = time.monotonic() + 300
    done = {}
    while len(done) < len(jobs) and time.monotonic() < deadline:
        for j in jobs:
            body = requests.get(f"{url}/v1/ocr/jobs/{j}", timeout=30).json()
            if body["status"] in ("succeeded", "failed"):
                done[j] = body
        time.sleep(1)
    assert [done[j]["status"] for j in jobs] == ["succeeded"] * len(jobs)
    assert all(done[j]["results"] == expected for j in jobs)
