"""A Ray cluster whose nodes have their own network addresses, on one
machine: one network namespace per node (ocr26-head, ocr26-w1, ocr26-w2 at
10.77.0.1, .2, .3), each joined by a veth pair to a bridge in the root
namespace (10.77.0.254, where the test process, and redis-server, live).

Why namespaces and not loopback aliases (127.0.0.2, ...): Serve binds every
node's proxy to the one `http_options` host:port (0.0.0.0:8000 for
`proxy_location: EveryNode`), and so do Ray's per-node agents with their
default ports; in one namespace the second node's proxy cannot bind. Each
namespace has its own port space, so every node listens on :8000 at its own
address, as on separate machines.

Needs root and iproute2's `ip`; without them setup() raises RuntimeError
naming what is missing (the tests fail, never skip). Every name it makes
(namespaces, links, the temporary folder /tmp/ocr26-*) starts with ocr26,
and `clean()` removes them all (and kills what runs inside), first, so a
crashed earlier run leaves nothing in the way. Used by
tests/integration/test_cluster_netns.py."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

PREFIX = "ocr26"
BRIDGE = f"{PREFIX}br"
HOST_IP = "10.77.0.254"
NODES = {"head": "10.77.0.1", "w1": "10.77.0.2", "w2": "10.77.0.3"}
BIN = Path(sys.executable).parent


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
WHY_ROOT = ("it makes network namespaces (`ip netns add`, which mounts them under /run/netns: CAP_SYS_ADMIN), "
            "a bridge and veth pairs (CAP_NET_ADMIN), and runs each node's `ray start` inside one "
            "(`ip netns exec`): run `make test` as root with those capabilities, as CI does")


def effective_caps(status: str = "") -> int:
    """This process's effective capability bits (/proc/self/status CapEff)."""
    if not status:
        with open("/proc/self/status") as f:
            status = f.read()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_for_netns(euid: int, caps: int, has_ip: bool) -> list[str]:
    """What this process lacks to build the test's network namespaces."""
    missing = []
    if euid != 0:
        missing.append(f"euid 0 (running as uid {euid})")
    else:
        lacking = [name for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
                   if not caps >> bit & 1]
        if lacking:  # root in a container started without them
            missing.append(f"{' and '.join(lacking)} (root here, without them)")
    if not has_ip:
        missing.append("iproute2's `ip` (Debian: apt-get install iproute2; make test-system installs it)")
    return missing


def require_root_and_ip() -> None:
    missing = missing_for_netns(os.geteuid(), effective_caps(), shutil.which("ip") is not None)
    if missing:
        raise RuntimeError("the separate-address cluster test needs " + " and ".join(missing) + ": " + WHY_ROOT)


def namespace(node: str) -> str:
    return f"{PREFIX}-{node}"


def netns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def kill_namespace(ns: str, sig: int = signal.SIGKILL) -> list[int]:
    """Every process inside the namespace (a node's raylet, its workers, the
    replicas, a driver): what a machine's crash does to them."""
    pids = netns_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def clean() -> None:
    """Remove every ocr26 namespace (after killing what runs in it), veth and
    the bridge: this run's, or a crashed earlier run's."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        ns = line.split(" ")[0]
        if ns.startswith(PREFIX + "-"):
            kill_namespace(ns)
            deadline = time.monotonic() + 10
            while netns_pids(ns) and time.monotonic() < deadline:
                time.sleep(0.1)
            _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX):
            _ip("link", "del", name, check=False)
    for folder in Path("/tmp").glob(f"{PREFIX}-*"):
        shutil.rmtree(folder, ignore_errors=True)


def setup() -> None:
    require_root_and_ip()
    clean()
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for node, addr in NODES.items():
        ns, host_end = namespace(node), f"{PREFIX}{node}"
        _ip("netns", "add", ns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host_end, "master", BRIDGE)
        _ip("link", "set", host_end, "up")
        for args in (("link", "set", "lo", "up"), ("addr", "add", f"{addr}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"),
                     # A default route, so that Ray's node-IP discovery (a UDP
                     # socket "connected" outward, nothing sent) picks eth0's address.
                     ("route", "add", "default", "via", HOST_IP)):
            _ip("-n", ns, *args)


class NetnsCluster:
    """`ray start` on each node's namespace: a head with num-cpus 0 (GCS,
    dashboard, Serve's controller, a proxy; no replica, as on KubeRay) and
    two workers. Token auth on, with a token of its own. `env` goes to every
    Ray process (the replicas inherit it)."""

    def __init__(self, env: dict, worker_cpus: float = 2, log_dir: Optional[Path] = None):
        """setup() first (the bridge's address must exist before a server,
        e.g. redis-server, binds it)."""
        self.token = secrets.token_hex(32)
        self.env = {**os.environ, **env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    # A dead node is declared dead after ~3 missed 1 s health checks, not 5 x 3 s.
                    "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
        # Short: Ray's Unix socket paths live under it (limit 107 bytes).
        self.temp_dir = tempfile.mkdtemp(prefix=f"{PREFIX}-", dir="/tmp")
        self.log_dir = Path(log_dir or self.temp_dir)
        self.procs: dict[str, subprocess.Popen] = {}
        self.gcs = f"{NODES['head']}:6379"
        self.dashboard = f"http://{NODES['head']}:8265"
        try:
            self._start("head", "--head", "--port=6379", "--num-cpus=0", "--dashboard-host=0.0.0.0",
                        "--dashboard-port=8265", "--include-dashboard=true")
            self.wait_nodes(1)
            # One after another (and each node in a folder of its own): two
            # raylets started at once in one folder took the same socket name.
            self.worker_cpus = worker_cpus
            for n, node in enumerate(("w1", "w2"), start=2):
                self.start_worker(node)
                self.wait_nodes(n)
        except BaseException:
            self.close()
            raise

    def start_worker(self, node: str) -> None:
        """(Again, after crash(): a new raylet at the same address.)"""
        old = self.procs.pop(node, None)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{node} is still running")
        self._start(node, f"--address={self.gcs}", f"--num-cpus={self.worker_cpus}", f"--resources={{\"{node}\": 1}}")

    def _start(self, node: str, *args: str) -> None:
        log = open(self.log_dir / f"ray-{node}.log", "w")
        self.procs[node] = subprocess.Popen(
            ["ip", "netns", "exec", namespace(node), str(BIN / "ray"), "start", *args,
             f"--node-ip-address={NODES[node]}", f"--temp-dir={self.temp_dir}/{node}", "--disable-usage-stats",
             "--block"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def log(self, node: str) -> str:
        p = self.log_dir / f"ray-{node}.log"
        return p.read_text()[-3000:] if p.exists() else ""

    def alive_nodes(self) -> list[dict]:
        req = urllib.request.Request(f"{self.dashboard}/nodes?view=summary",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
        return [n for n in body["data"]["summary"] if n["raylet"]["state"] == "ALIVE"]

    def wait_nodes(self, n: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            for node, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"`ray start` on {node} exited ({p.returncode}): {self.log(node)}")
            try:
                alive = self.alive_nodes()
                if len(alive) == n:
                    return
                last = [a["raylet"]["nodeManagerAddress"] for a in alive]
            except Exception as e:  # the dashboard is not up yet
                last = e
            time.sleep(1)
        raise RuntimeError(f"{n} nodes not alive after {timeout_s}s (last: {last}); head: {self.log('head')}")

    def run_in(self, node: str, *cmd: str, **kw) -> subprocess.Popen:
        """A process inside a node's namespace, with the cluster's env."""
        return subprocess.Popen(["ip", "netns", "exec", namespace(node), *cmd], env=self.env, **kw)

    def crash(self, node: str) -> list[int]:
        """SIGKILL every process of the node (raylet, workers, replicas)."""
        pids = kill_namespace(namespace(node))
        self.procs[node].wait(timeout=30)
        return pids

    def close(self) -> None:
        for node in reversed(list(self.procs)):
            kill_namespace(namespace(node))
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        clean()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
