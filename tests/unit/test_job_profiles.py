"""deployments.redis.yaml is deployments.yaml with the job book on Redis:
the same application args except `jobs`, the same deployments except the
JobStore's replicas, and its jobs block a valid JobArgs for the Redis backend."""

from __future__ import annotations

from pathlib import Path

import yaml

from serve_app.core.app_args import AppArgs

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_the_redis_profile_is_the_cpu_profile_with_the_book_on_redis():
    cpu, red = load("deployments.yaml"), load("deployments.redis.yaml")
    (app_cpu,), (app_red,) = cpu["applications"], red["applications"]
    args_cpu, args_red = AppArgs(**app_cpu["args"]), AppArgs(**app_red["args"])
    assert args_red.jobs.backend == "redis" and args_red.jobs.redis_url_env == "OCR_REDIS_URL"
    assert args_red.jobs.redis_fsync == "always" and args_cpu.jobs.backend == "sqlite"
    assert args_cpu.model_copy(update={"jobs": args_red.jobs}) == args_red
    deps_cpu = {d["name"]: d for d in app_cpu["deployments"]}
    deps_red = {d["name"]: d for d in app_red["deployments"]}
    assert deps_red.pop("JobStore").pop("num_replicas") == 2
    assert "num_replicas" not in deps_cpu.pop("JobStore")  # the sqlite book: one replica
    assert deps_cpu == deps_red
    assert {k: v for k, v in cpu.items() if k != "applications"} == {
        k: v for k, v in red.items() if k != "applications"}
