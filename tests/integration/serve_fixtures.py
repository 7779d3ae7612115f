"""Starting real Ray and Serve for a test module (once per module)."""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray(**init_kwargs):
    import ray

    ray.shutdown()
    # address="local": always a new cluster of our own, never one found running.
    ray.init(address="local", include_dashboard=False, log_to_driver=False, **init_kwargs)


def load_config(path: Path = REPO / "deployments.yaml") -> dict:
    """The config file, with each application's job journal (if it has one)
    moved to a fresh temporary file: a test's service never picks up another
    run's jobs."""
    config = yaml.safe_load(path.read_text())
    for app in config["applications"]:
        jobs = app.get("args", {}).get("jobs")
        if jobs and jobs.get("journal"):
            jobs["journal"] = str(Path(tempfile.mkdtemp(prefix="ocr-jobs-")) / "jobs.sqlite")
    return config


def deploy_config(config: dict, port: int, timeout_s: float = 300, all_replicas: bool = True) -> str:
    """Deploy a Serve config file's applications the way `serve deploy` does
    (same schema, same controller call), HTTP on `port`; wait for /readyz."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    config = dict(config)
    config.pop("http_options", None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout_s)
    if all_replicas:
        wait_replicas(config, timeout_s)
    return url


def wait_replicas(config: dict, timeout_s: float = 300) -> None:
    """/readyz is 200 once each stage has one ready replica; tests that look
    at every replica wait for each deployment's starting count."""
    from ray import serve

    want = {}
    for app in config["applications"]:
        for d in app.get("deployments", []):
            n = d.get("num_replicas") or (d.get("autoscaling_config") or {}).get("min_replicas", 1)
            want[(app["name"], d["name"])] = n if isinstance(n, int) else 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        apps = serve.status().applications
        if all(a in apps and name in apps[a].deployments
               and apps[a].deployments[name].replica_states.get("RUNNING", 0) >= n
               for (a, name), n in want.items()):
            return
        time.sleep(1)
    raise TimeoutError(f"replicas not all running after {timeout_s}s: {want}")


def wait_ready(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


def stop_all():
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def replica_stats(handle, n: int, tries: int = 200) -> dict:
    """pid -> stats() of up to n replicas behind a deployment handle (the
    router picks one replica per call, so call until n have answered)."""
    seen: dict = {}
    for _ in range(tries):
        st = handle.stats.remote().result()
        seen[st["pid"]] = st
        if len(seen) >= n:
            break
    return seen
