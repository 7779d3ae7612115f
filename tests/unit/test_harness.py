"""The test harness's own rules that need no cluster: which tests share a
started service and in what order they run, when two configs count as the
same, and that nothing in tests/ or load_tests/ edits sys.path."""

from __future__ import annotations

import ast
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


def sys_path_edits(source: str) -> list[int]:
    """Lines of code that change sys.path: sys.path.insert/append/extend(...),
    sys.path[...] = ..., sys.path = / += ... (text that only names it, in a
    docstring or a comment, is not an edit)."""
    def is_sys_path(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value)
                and node.func.attr in ("insert", "append", "extend")):
            lines.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_sys_path_check_sees_edits_and_not_mentions():
    assert sys_path_edits("import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path += ['z']\n") == [2, 3, 4]
    assert sys_path_edits('"""sys.path.insert(0, x) is not done here"""\n# sys.path[:0] = []\nprint(1)\n') == []


def test_no_sys_path_edits_in_tests_or_load_tests():
    found = [f"{p.relative_to(REPO)}:{n}" for folder in ("tests", "load_tests", "harness")
             for p in sorted((REPO / folder).rglob("*.py")) for n in sys_path_edits(p.read_text())]
    assert found == []


def test_the_netns_cluster_fails_naming_what_is_missing_and_why(monkeypatch):
    """Without euid 0, the capabilities, or iproute2's `ip` the separate-address
    cluster test fails (the fixture turns this RuntimeError into a failure),
    saying what to get and why it needs it; nothing is created first."""
    import harness.netns_cluster as nc

    all_caps = (1 << nc.CAP_NET_ADMIN) | (1 << nc.CAP_SYS_ADMIN)
    # CapEff as the kernel writes it: root with every capability, and a plain user's none.
    assert nc.effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n") & all_caps == all_caps
    assert nc.effective_caps("CapEff:\t0000000000000000\n") == 0
    monkeypatch.setattr(nc.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(nc, "effective_caps", lambda: 0)
    monkeypatch.setattr(nc.shutil, "which", lambda name: None)
    monkeypatch.setattr(nc, "_ip", lambda *a, **k: pytest.fail(f"ip {a} run before the check"))
    with pytest.raises(RuntimeError) as e:
        nc.setup()
    assert "euid 0 (running as uid 1000" in str(e.value) and "apt-get install iproute2" in str(e.value)
    assert "ip netns add" in str(e.value) and "CAP_NET_ADMIN" in str(e.value)  # why root
    monkeypatch.setattr(nc.os, "geteuid", lambda: 0)
    with pytest.raises(RuntimeError, match=r"needs CAP_NET_ADMIN and CAP_SYS_ADMIN \(root here, without them\)"):
        nc.setup()  # root in a container started without them
    monkeypatch.setattr(nc, "effective_caps", lambda: all_caps)
    with pytest.raises(RuntimeError, match=r"needs iproute2's `ip`"):
        nc.setup()


def test_the_wait_for_ray_to_exit_sees_a_running_raylet_and_not_a_zombie_one():
    """wait_ray_gone waits for raylet/gcs_server processes that still run
    (they take the cores a new cluster needs), not for an exited one whose
    parent has not reaped it (seen after `serve run` stopped): a zombie
    would make every later teardown wait its whole timeout."""
    import signal
    import subprocess
    import sys
    import time

    from harness.service import ray_processes

    named = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'raylet', 0, 0, 0); "
             "print(flush=True); time.sleep(float(sys.argv[1]))")  # 15: PR_SET_NAME
    running = subprocess.Popen([sys.executable, "-c", named, "60"], stdout=subprocess.PIPE)
    exiting = subprocess.Popen([sys.executable, "-c", named, "0"], stdout=subprocess.PIPE)
    try:
        running.stdout.readline(), exiting.stdout.readline()
        for _ in range(100):  # until the second has exited (a zombie: not waited for yet)
            with open(f"/proc/{exiting.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        pids = {int(p.split()[0]) for p in ray_processes()}
        assert running.pid in pids and exiting.pid not in pids, ray_processes()
    finally:
        running.send_signal(signal.SIGKILL)
        running.wait()
        exiting.wait()


def test_a_cluster_start_is_tried_three_times_each_after_the_last_ones_processes_are_gone():
    from harness.service import tried

    calls, fails = [], [RuntimeError("The current node timed out during startup")] * 2

    def start():
        calls.append("init")
        if fails:
            raise fails.pop()

    tried(start, lambda: calls.append("shutdown, gone"))
    assert calls == ["init", "shutdown, gone", "init", "shutdown, gone", "init"]
    fails[:], calls[:] = [RuntimeError("a")] * 3, []
    with pytest.raises(RuntimeError):  # a start that keeps failing still fails the module
        tried(start, lambda: calls.append("shutdown, gone"))
    assert calls.count("init") == 3


def test_a_stopped_clusters_leftover_ray_processes_of_this_process_are_killed_and_others_are_left(monkeypatch):
    """A ray.init that fails part way leaves its GCS (and the head's Python
    daemons) running as this process's children, unknown to ray.shutdown():
    wait_ray_gone kills them after its grace instead of waiting its whole
    timeout (and warning) for them; a child that is not Ray's is left alone.
    Only this test's processes count as running Ray here (another cluster on
    the machine would be waited for, rightly)."""
    import signal
    import subprocess
    import sys
    import warnings

    import harness.service as hs

    named = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
             "print(flush=True); time.sleep(60)")  # 15: PR_SET_NAME
    gcs = subprocess.Popen([sys.executable, "-c", named, "gcs_server", "/venv/lib/site-packages/ray/core/gcs_server"],
                           stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", named, "raylet", "not-ray's-own-path"], stdout=subprocess.PIPE)
    try:
        gcs.stdout.readline(), other.stdout.readline()
        mine = {gcs.pid}
        assert mine <= {int(p.split()[0]) for p in hs.ray_processes()}
        every = hs.ray_processes
        monkeypatch.setattr(hs, "ray_processes", lambda: [p for p in every() if int(p.split()[0]) in mine])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            hs.wait_ray_gone(timeout_s=60, own_grace_s=0.2)
        assert not [w for w in seen if "still running" in str(w.message)], [str(w.message) for w in seen]
        assert not (Path("/proc") / str(gcs.pid)).exists()  # killed and reaped
        assert other.poll() is None  # its command line is not Ray's: left running
        assert hs.kill_own_ray_leftovers() == []
    finally:
        for p in (gcs, other):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
