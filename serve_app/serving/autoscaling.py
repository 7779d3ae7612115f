"""Stage-specific autoscaling: the detector scales on the images queued at
its replicas, the recogniser on the crops queued at its replicas (a 200-line
page is 200 crops of work, not one request). No Ray import.

Each model replica reports its backlog through Serve's custom-metrics hook
(a `record_autoscaling_stats` method on the deployment: Serve 2.60 calls it
every `look_back_period_s * 0.2` s, at most every `metrics_interval_s`, and
averages it over `look_back_period_s`); BacklogPolicy, named in the
deployment's `autoscaling_config.policy` in deployments.yaml, turns the
reports into a replica count. Serve applies the delays, the up/down-scaling
factors and min/max_replicas around it as for its default policy."""

from __future__ import annotations

from typing import Any

# The custom metric each stage reports (record_autoscaling_stats).
BACKLOG_METRIC = {"det": "queued_images", "rec": "queued_crops", "layout": "queued_pages", "table": "queued_tables"}


def backlog_stats(stage: str, queued: int, metrics: Any = None) -> dict[str, float]:
    """What a replica's record_autoscaling_stats returns (and the
    ocr_autoscaling_backlog gauge it sets)."""
    if metrics is not None:
        metrics.backlog.set(queued)
    return {BACKLOG_METRIC[stage]: float(queued)}


def desired_replicas(backlog: float, target_per_replica: float, current: int, lower: int, upper: int) -> float:
    """Replicas that would hold `backlog` at `target_per_replica` each,
    within [lower, upper]; never below 1 while there is a backlog."""
    want = backlog / target_per_replica
    if backlog > 0:
        want = max(want, 1.0)
    return float(min(max(want, lower), upper)) if upper >= lower else float(current)


class BacklogPolicy:
    """A Serve custom autoscaling policy (a class: Serve builds it once
    with `policy_kwargs` and calls it every control-loop tick with an
    AutoscalingContext). Desired replicas = total backlog over the running
    replicas / target_per_replica. Before any replica has reported (just
    started), it keeps the current target."""

    def __init__(self, metric: str, target_per_replica: float):
        if target_per_replica <= 0:
            raise ValueError(f"BacklogPolicy target_per_replica must be > 0, got {target_per_replica}")
        self.metric = metric
        self.target = float(target_per_replica)

    def __call__(self, ctx: Any) -> tuple[float, dict]:
        reports = (ctx.aggregated_metrics or {}).get(self.metric) or {}
        if ctx.current_num_replicas == 0 or not reports:
            return float(ctx.target_num_replicas), {}
        backlog = float(sum(reports.values()))
        state = {"backlog": backlog}
        return desired_replicas(backlog, self.target, ctx.current_num_replicas,
                                ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas), state
