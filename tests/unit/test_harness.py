"""The test harness's own rules that need no cluster: which tests share a
started service and in what order they run, when two configs count as the
same, and that nothing in tests/ or load_tests/ edits sys.path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.service import SharedServices, config_key, grouped, load_config

REPO = Path(__file__).resolve().parents[2]


def test_modules_sharing_a_service_run_next_to_each_other_the_rest_in_place():
    # (module, test, shared service or None), in collection order
    items = [("a", 1, None), ("b", 1, "yaml"), ("b", 2, "yaml"), ("c", 1, None), ("d", 1, "redis"),
             ("e", 1, "yaml"), ("e", 2, "yaml"), ("f", 1, "redis"), ("g", 1, None)]
    out = grouped(items, lambda i: i[2], lambda i: i[0])
    assert [(m, n) for m, n, _ in out] == [("a", 1), ("b", 1), ("b", 2), ("e", 1), ("e", 2), ("c", 1),
                                           ("d", 1), ("f", 1), ("g", 1)]
    assert sorted(out) == sorted(items)  # nothing lost, nothing twice


def test_a_config_is_the_same_whatever_journal_file_load_config_gave_it():
    a, b = load_config(), load_config()
    journal = lambda c: c["applications"][0]["args"]["jobs"]["journal"]  # noqa: E731
    assert journal(a) != journal(b)  # a fresh file per call: a service never picks up another's jobs
    assert config_key(a) == config_key(b)
    b["applications"][0]["args"]["ingress"] = {"max_in_flight": 3}
    assert config_key(a) != config_key(b)


def test_a_second_module_under_the_same_name_must_bring_the_same_config():
    services = SharedServices()
    services.name, services.url, services.config = "deployments.yaml", "http://127.0.0.1:1", load_config()
    assert services.get("deployments.yaml", load_config()) == ("http://127.0.0.1:1", services.config)
    other = load_config()
    other["applications"][0]["args"]["ingress"] = {"max_in_flight": 3}
    with pytest.raises(ValueError, match="must build the same config"):
        services.get("deployments.yaml", other)


def test_no_sys_path_edits_in_tests_or_load_tests():
    edits = re.compile(r"sys\.path\s*(\.insert|\.append|\.extend|\[[^\]]*\]\s*=|\+=|=)")
    found = [f"{p.relative_to(REPO)}:{n}" for folder in ("tests", "load_tests", "harness")
             for p in sorted((REPO / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if edits.search(line)]
    assert found == []
