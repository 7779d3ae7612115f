"""The stage-specific autoscaling policy (serve_app.serving.autoscaling) on
synthetic contexts shaped like Serve 2.60's AutoscalingContext."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serve_app.serving.autoscaling import BACKLOG_METRIC, BacklogPolicy, backlog_stats, desired_replicas


def ctx(metrics, current=1, target=1, lower=1, upper=2, state=None):
    return SimpleNamespace(aggregated_metrics=metrics, current_num_replicas=current, target_num_replicas=target,
                           capacity_adjusted_min_replicas=lower, capacity_adjusted_max_replicas=upper,
                           policy_state=state or {})


def test_recogniser_scales_on_crops_queued_not_requests():
    policy = BacklogPolicy(metric="queued_crops", target_per_replica=48)
    # Four dense pages queued at one replica: 4 requests, 160 crops.
    assert policy(ctx({"queued_crops": {"r1": 160.0}}, upper=4)) == (pytest.approx(160 / 48), {"backlog": 160.0})
    assert policy(ctx({"queued_crops": {"r1": 160.0}}, upper=2))[0] == 2  # capped at max
    # Many one-line images: 30 crops over two replicas -> one replica is enough.
    assert policy(ctx({"queued_crops": {"r1": 10.0, "r2": 20.0}}, current=2, target=2))[0] == 1


def test_detector_stays_put_while_images_queued_are_under_target():
    policy = BacklogPolicy(metric="queued_images", target_per_replica=4)
    assert policy(ctx({"queued_images": {"d1": 4.0}}))[0] == 1
    assert policy(ctx({"queued_images": {"d1": 9.0}}))[0] == 2


def test_idle_goes_to_the_lower_bound_and_no_report_keeps_the_target():
    policy = BacklogPolicy(metric="queued_crops", target_per_replica=48)
    assert policy(ctx({"queued_crops": {"r1": 0.0, "r2": 0.0}}, current=2, target=2, lower=1))[0] == 1
    assert policy(ctx({}, current=2, target=2)) == (2, {})  # just started: nothing reported yet
    assert policy(ctx(None, current=0, target=1)) == (1, {})
    assert policy(ctx({"queued_images": {"d1": 99.0}}, current=1, target=1))[0] == 1  # another stage's metric


def test_a_small_backlog_keeps_at_least_one_replica():
    assert desired_replicas(1, 48, current=1, lower=0, upper=2) == 1
    assert desired_replicas(0, 48, current=1, lower=0, upper=2) == 0


def test_bad_target_is_refused():
    with pytest.raises(ValueError, match="target_per_replica"):
        BacklogPolicy(metric="queued_crops", target_per_replica=0)


def test_replicas_report_their_stage_metric_and_set_the_gauge():
    class Gauge:
        def set(self, v):
            self.v = v

    m = SimpleNamespace(backlog=Gauge())
    assert backlog_stats("rec", 37, m) == {BACKLOG_METRIC["rec"]: 37.0} and m.backlog.v == 37
    assert backlog_stats("det", 2) == {"queued_images": 2.0}


def test_the_yaml_profiles_name_the_policy_with_each_stages_metric():
    import yaml

    from serve_app.core.app_args import AppArgs  # noqa: F401  (the module the policy path points into is importable)

    for path in ("deployments.yaml", "deployments.gpu.yaml"):
        deployments = {d["name"]: d for d in yaml.safe_load(open(path))["applications"][0]["deployments"]}
        for name, stage in (("TextDetector", "det"), ("TextRecognizer", "rec")):
            policy = deployments[name]["autoscaling_config"]["policy"]
            assert policy["policy_function"] == "serve_app.serving.autoscaling:BacklogPolicy"
            assert policy["policy_kwargs"]["metric"] == BACKLOG_METRIC[stage]
            BacklogPolicy(**policy["policy_kwargs"])
