"""deployments.redis.yaml is the cluster profile with the job book on Redis:
deployments.yaml's stages, and what a cluster needs besides (Serve's proxy
on every node, listening beyond loopback, a bearer token, the book on Redis
shared by two JobStore replicas, no journal file); nothing else differs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.app import check_token_present
from serve_app.core.app_args import AppArgs
from serve_app.core.errors import ConfigError
from serve_app.http.headers import check_exposure

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_the_redis_profile_is_the_cpu_profile_made_a_cluster_with_the_book_on_redis():
    cpu, red = load("deployments.yaml"), load("deployments.redis.yaml")
    (app_cpu,), (app_red,) = cpu["applications"], red["applications"]
    args_cpu, args_red = AppArgs(**app_cpu["args"]), AppArgs(**app_red["args"])
    assert args_red.jobs.backend == "redis" and args_red.jobs.redis_url_env == "OCR_REDIS_URL"
    assert args_red.jobs.redis_fsync == "always" and args_cpu.jobs.backend == "sqlite"
    assert args_red.jobs.journal is None  # no file a store on another node could not reach
    assert args_red.ingress.auth_token_env == "OCR_AUTH_TOKEN" and not args_red.ingress.allow_anonymous
    assert args_cpu.model_copy(update={"jobs": args_red.jobs, "ingress": args_red.ingress}) == args_red
    assert args_cpu.ingress.model_copy(update={"auth_token_env": "OCR_AUTH_TOKEN"}) == args_red.ingress
    deps_cpu = {d["name"]: d for d in app_cpu["deployments"]}
    deps_red = {d["name"]: d for d in app_red["deployments"]}
    assert deps_red.pop("JobStore").pop("num_replicas") == 2
    assert "num_replicas" not in deps_cpu.pop("JobStore")  # the sqlite book: one replica
    assert deps_cpu == deps_red
    assert (red["proxy_location"], red["http_options"]) == ("EveryNode", {"host": "0.0.0.0", "port": 8000})
    assert (cpu["proxy_location"], cpu["http_options"]["host"]) == ("HeadOnly", "127.0.0.1")


def test_the_redis_profile_does_not_start_without_its_token():
    red = load("deployments.redis.yaml")
    args = AppArgs.model_validate(red["applications"][0]["args"])
    with pytest.raises(ConfigError, match="OCR_AUTH_TOKEN"):
        check_token_present(args.ingress, environ={})
    check_token_present(args.ingress, environ={"OCR_AUTH_TOKEN": "s3cret"})
    with pytest.raises(ConfigError, match="allow_anonymous"):
        check_exposure(red["http_options"]["host"], has_token=False, allow_anonymous=args.ingress.allow_anonymous)
