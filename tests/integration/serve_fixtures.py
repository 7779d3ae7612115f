"""Starting real Ray and Serve for a test module (once per module): the
functions of load_tests/service.py, which the benchmarks use too (one way to
start Ray, deploy a config file as `serve deploy` does, and wait)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from load_tests.service import (  # noqa: E402
    apply_config,
    deploy_config,
    free_port,
    free_ports,
    load_config,
    replica_stats,
    start_ray,
    stop_all,
    wait_ready,
    wait_replicas,
)

__all__ = ["REPO", "apply_config", "deploy_config", "free_port", "free_ports", "load_config", "replica_stats",
           "start_ray", "stop_all", "wait_ready", "wait_replicas"]
