"""The service under test, started the one way tests and benchmarks share:
a local Ray cluster of our own, Serve on a port, the applications of a Serve
config file deployed the way `serve deploy` does, readiness and replica
waits, stop. The only home of `_get_global_client().deploy_apps` (Ray Serve
has no public call that takes a whole config file in-process).

Tests reach them through harness.service (this module); SharedServices
lets test modules with the same config share one started service."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "deployments.yaml"
MODEL_DEPLOYMENTS = {"det": "TextDetector", "cls": "DirectionClassifier", "rec": "TextRecognizer"}


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held until all are chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def http_status(url: str, timeout: float = 5.0) -> int:
    """GET url's status; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


# The object store of a cluster started here: Ray's default is 30% of the
# machine's memory (~7 GB of /dev/shm on 24 GB); the service's objects are
# requests' bytes and decoded images (a 40 MP page is 120 MB), and beyond the
# bound Ray spills to disk rather than fail.
OBJECT_STORE_BYTES = 2 << 30


def start_ray(**init_kwargs) -> None:
    import ray

    ray.shutdown()
    # address="local": always a new cluster of our own, never one found running.
    init_kwargs = {"include_dashboard": False, "log_to_driver": False, "object_store_memory": OBJECT_STORE_BYTES,
                   **init_kwargs}
    # On a loaded 2-core machine a new cluster can miss Ray's start-up deadline
    # ("The current node timed out during startup": no raylet registered within
    # 30 s), sometimes twice in a row: up to START_TRIES tries, each after the
    # last one's processes are gone.
    tried(lambda: ray.init(address="local", **init_kwargs),
          lambda: (ray.shutdown(), kill_own_ray_leftovers(), wait_ray_gone()))


START_TRIES = 3


def tried(start: Callable[[], object], undo: Callable[[], object], tries: int = START_TRIES) -> None:
    """start(), up to `tries` times, undo() after each failure but the last (which raises)."""
    for attempt in range(1, tries + 1):
        try:
            start()
            return
        except Exception as e:
            if attempt == tries:
                raise
            print(f"ray.init failed ({e}); try {attempt + 1} of {tries}")
            undo()


def wait_ray_gone(timeout_s: float = 30.0, own_grace_s: float = 5.0) -> None:
    """Wait (bounded) until no Ray raylet or GCS process is left on this
    machine: a stopped local cluster's processes take a while to exit, and a
    new one started meanwhile competes with them for the cores. Those this
    process started (its children) get `own_grace_s` to exit, then are
    killed (kill_own_ray_leftovers); others' are only waited for."""
    t0 = time.monotonic()
    deadline, killed = t0 + timeout_s, False
    while time.monotonic() < deadline:
        left = ray_processes()
        if not left:
            return
        if not killed and time.monotonic() - t0 >= own_grace_s:
            killed = bool(kill_own_ray_leftovers())
        time.sleep(0.5)
    # Say which processes were left, in pytest's warnings summary.
    import warnings

    warnings.warn(f"Ray processes still running {timeout_s:.0f} s after the cluster was stopped: {left}",
                  RuntimeWarning)  # not a UserWarning: pyproject.toml filters those out


def kill_own_ray_leftovers() -> list[int]:
    """SIGKILL this process's child Ray processes (raylet, gcs_server and the
    head's Python daemons: dashboard, monitor, log monitor) while no cluster
    of this process's is up; returns their pids. A ray.init that fails part
    way leaves them running and ray.shutdown() knows nothing of them: seen in
    one `make test`, a GCS started with no raylet ever joining it (a loaded
    2-core machine; the retry then started a cluster that worked) lived to the
    end of the run, and eight later module teardowns each waited the whole
    30 s of wait_ray_gone for it."""
    import signal
    import sys

    ray = sys.modules.get("ray")  # not imported: no cluster of this process's is up
    if ray is not None and ray.is_initialized():
        return []
    me, killed = str(os.getpid()), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            state, ppid = _state_ppid(pid)
            if ppid != me or state == "Z":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"site-packages/ray/" not in f.read():
                    continue
            os.kill(int(pid), signal.SIGKILL)
            os.waitpid(int(pid), 0)  # reaped: not left as a zombie of this process
            killed.append(int(pid))
        except (OSError, ChildProcessError):
            pass
    return killed


def _state_ppid(pid: str) -> tuple[str, str]:
    """A process's state letter and parent pid, from /proc (OSError if it is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
    return state, ppid


def ray_processes() -> list[str]:
    """`pid comm state ppid` of every raylet and gcs_server process on this
    machine, less zombies: an exited one its parent has not reaped yet (seen
    after `serve run` stopped) holds no CPU, which is all the wait is for."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
                if comm in ("raylet", "gcs_server"):
                    state, ppid = _state_ppid(pid)
                    if state != "Z":
                        out.append(f"{pid} {comm} {state} {ppid}")
            except OSError:
                pass
    return out


def load_config(path: Path = DEFAULT_CONFIG, cache: bool = False, model_sets: bool = False) -> dict:
    """The config file, with each application's job journal (if it has one)
    moved to a fresh temporary file: a test's or a benchmark's service never
    picks up another run's jobs. Unless `cache`, the ingress's result cache
    and in-flight sharing are off: tests and benchmarks send the same images
    again and again to make work, and must get it done. Unless `model_sets`,
    an application serves only its default model set (the first of
    `models`; further sets' deployment blocks dropped): the profiles serve
    three, and loading and warming the v6 sets in every test service would
    cost each a minute and ~3 GB; the tests of the sets ask for them."""
    config = yaml.safe_load(Path(path).read_text())
    for app in config["applications"]:
        if not cache and app.get("import_path") == "serve_app.app:build_app":
            app.setdefault("args", {})["cache"] = {"max_bytes": 0, "share_in_flight": False}
        sets = app.get("args", {}).get("models") or []
        if not model_sets and len(sets) > 1:
            app["args"]["models"] = sets[:1]
            further = {f"{kind}_{name}" for name in sets[1:] for kind in ("TextDetector", "TextRecognizer")}
            app["deployments"] = [d for d in app.get("deployments", []) if d["name"] not in further]
        jobs = app.get("args", {}).get("jobs")
        if jobs and jobs.get("journal"):
            jobs["journal"] = str(Path(tempfile.mkdtemp(prefix="ocr-jobs-")) / "jobs.sqlite")
    return config


def start_serve(port: int) -> str:
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return f"http://127.0.0.1:{port}"


def apply_config(config: dict) -> None:
    """Deploy (or redeploy: a changed user_config is applied live) a Serve
    config file's applications, as `serve deploy` does: same schema, same
    controller call. Serve must be running; `http_options` is ignored."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    config = dict(config)
    config.pop("http_options", None)
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))


def deploy_config(config: dict, port: int, timeout_s: float = 300, all_replicas: bool = True) -> str:
    """Start Serve with HTTP on `port`, deploy `config`, wait for /readyz
    (and, with all_replicas, every deployment's starting replica count)."""
    url = start_serve(port)
    apply_config(config)
    wait_ready(url, timeout_s)
    if all_replicas:
        wait_replicas(config, timeout_s)
    return url


@contextlib.contextmanager
def served(config: dict, port: Optional[int] = None, timeout_s: float = 300, **ray_init) -> Iterator[str]:
    """A benchmark's service: start Ray (`ray_init` to ray.init), deploy
    `config` on `port` (a free one by default) and wait for every replica;
    yield its URL; stop Serve and Ray however the block ends (no drain:
    everything was measured)."""
    start_ray(**ray_init)
    try:
        yield deploy_config(config, port or free_port(), timeout_s)
    finally:
        stop_all(graceful=False)


def wait_ready(url: str, timeout_s: float = 300, proc: Optional[subprocess.Popen] = None,
               every_s: float = 0.25) -> float:
    """Seconds until GET url/readyz answers 200; TimeoutError after
    timeout_s, RuntimeError if `proc` (a server subprocess) exits first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it was ready")
        if http_status(f"{url}/readyz", timeout=5) == 200:
            return time.monotonic() - t0
        time.sleep(every_s)
    raise TimeoutError(f"{url}/readyz not 200 after {timeout_s:.0f}s")


def wait_replicas(config: dict, timeout_s: float = 300) -> None:
    """/readyz is 200 once each stage has one ready replica; callers that
    look at every replica wait for each deployment's starting count."""
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


def stop_all(graceful: bool = True) -> None:
    """Stop Serve and Ray. graceful=False skips serve.shutdown()'s drain (a
    local cluster's ray.shutdown() stops all of it anyway, without the ~10 s
    of draining that a test or benchmark does not need) but still stops this
    process's Serve handles first (shutdown_cached_handles)."""
    import ray

    try:
        if graceful:
            from ray import serve

            serve.shutdown()
        else:
            shutdown_cached_handles()
    finally:
        ray.shutdown()
        # Serve keeps its controller's handle in this process; the next
        # cluster's first driver has the same job id, so Serve would take
        # the dead handle for a live one (serve.status(): "Can't find actor").
        from ray.serve.context import _set_global_client

        _set_global_client(None)
        wait_ray_gone()


def config_key(config: dict) -> str:
    """A config's identity for sharing: the config as JSON, less what
    load_config makes fresh on every call (each job journal's temporary path)."""
    import json

    cfg = copy.deepcopy(config)
    for app in cfg.get("applications", []):
        jobs = (app.get("args") or {}).get("jobs")
        if isinstance(jobs, dict) and jobs.get("journal"):
            jobs["journal"] = "<fresh>"
    return json.dumps(cfg, sort_keys=True)


HARDENED = "deployments.yaml, hardened"
HARDENED_TOKEN = "hardened-test-token"
HARDENED_LIMITS = {"max_in_flight": 16, "body_timeout_s": 3.0, "page_timeout_s": 2.0,
                   "jobs_capacity": 100, "jobs_max_finished": 200}


def hardened_config() -> dict:
    """deployments.yaml behind a bearer token (HARDENED_TOKEN), with limits
    tight enough that each hostile case bites quickly (HARDENED_LIMITS: 16
    in-flight slots, a 3 s body deadline, a 2 s page budget, 100 queued and
    200 finished jobs). The hostile-client and reliability modules share it
    as SharedServices' HARDENED (one start instead of two). test_hostile_costs
    keeps a service of its own: its cases are priced by admission, and a
    cost model taught by the hostile clients' bursts refused some of them
    with 503 at the door before the check that gives their 4xx."""
    cfg = load_config()
    app = cfg["applications"][0]
    lim = HARDENED_LIMITS
    app["runtime_env"] = {"env_vars": {"OCR_TEST_TOKEN": HARDENED_TOKEN}}
    app["args"]["ingress"] = {**app["args"].get("ingress", {}), "auth_token_env": "OCR_TEST_TOKEN",
                              "max_in_flight": lim["max_in_flight"], "body_timeout_s": lim["body_timeout_s"]}
    app["args"]["jobs"] = {**app["args"]["jobs"], "capacity": lim["jobs_capacity"],
                           "max_finished": lim["jobs_max_finished"]}
    engine = app["args"].setdefault("engine", {})
    engine["documents"] = {**engine.get("documents", {}), "page_timeout_s": lim["page_timeout_s"]}
    return cfg


class SharedServices:
    """Started services by name, one at a time, for test modules that can
    share one: `get(name, config)` answers the running service when it was
    started under `name` (its config must then be the same, less the journal
    paths), else stops the running one and starts `config` (a new local Ray
    cluster, Serve on a free port, the config deployed and all replicas up).
    tests/conftest.py keeps the modules that share a name next to each other
    and stops the service after the last of them; a module with a config of
    its own starts and stops its own service as before."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.url: Optional[str] = None
        self.config: Optional[dict] = None
        self.starts = 0

    def get(self, name: str, config: dict, timeout_s: float = 300) -> tuple[str, dict]:
        if self.name == name:
            if config_key(config) != config_key(self.config):
                raise ValueError(f"test modules sharing the service {name!r} must build the same config; "
                                 "give the one that differs a service of its own")
            return self.url, self.config
        self.stop()
        start_ray()
        self.name, self.config = name, config  # set first: stop() cleans up a deploy that failed
        self.url = deploy_config(config, free_port(), timeout_s)
        self.starts += 1
        return self.url, self.config

    def stop(self) -> None:
        if self.name is not None:
            self.name = self.url = self.config = None
            stop_all(graceful=False)


def grouped(items: list, shared: Callable[[Any], Optional[str]], own: Callable[[Any], Any]) -> list:
    """`items` (tests, in their order) with those whose `shared(item)` name is
    the same moved next to the first of them; the others stay grouped by
    `own(item)` (their module) in their place, and each group keeps its order."""
    groups: dict = {}
    for item in items:
        name = shared(item)
        groups.setdefault(("shared", name) if name is not None else ("own", own(item)), []).append(item)
    return [item for group in groups.values() for item in group]


def shutdown_cached_handles() -> None:
    """Stop this process's Serve handles (their routers and metrics pushers),
    as serve.shutdown() does first. Left running past ray.shutdown(), a
    handle's metrics pusher calls into Ray again, and a Ray call with Ray
    shut down starts a new default local cluster in this process (seen: one
    with a dashboard, started under the next module's own, which then failed
    to start; and one left running under the modules that need no cluster)."""
    from ray.serve import context

    client = context._global_client
    if client is None:
        return
    try:
        client.shutdown_cached_handles()
    except Exception as e:  # a dead controller or router: nothing left to stop
        print(f"shutting down Serve handles: {type(e).__name__}: {e}")


def replica_stats(handle, n: int, tries: int = 200, get: Optional[Callable[[], dict]] = None) -> dict:
    """pid -> stats() of up to n replicas behind a deployment handle (the
    router picks one replica per call, so call until n have answered).
    get: one call's stats (default handle.stats.remote().result())."""
    get = get or (lambda: handle.stats.remote().result())
    seen: dict = {}
    for _ in range(tries):
        st = get()
        seen[st["pid"]] = st
        if len(seen) >= n:
            break
    return seen


def shapes_left(url: str) -> Optional[int]:
    """The recogniser's input shapes still to build after ready, as GET
    url/v1/stats shows them (the live view's figure): None when every one
    was warmed before ready, or the stats could not be read."""
    try:
        with urllib.request.urlopen(f"{url}/v1/stats", timeout=30) as r:
            return json.loads(r.read())["stages"]["rec"].get("shapes_left")
    except Exception:  # noqa: BLE001 - no figure
        return None


def wait_shapes_built(timeout_s: float = 180.0, app: str = "ocr", url: Optional[str] = None) -> Optional[float]:
    """Wait until every recogniser replica has built the shapes it left for
    after ready (recognizer.warm: core, serve_app/serving/shapes_after_ready.py;
    stats()["deferred_shapes"]["finished_at"]). Until then the builds take
    CPU from every other process: a module whose tests hold the service to
    tight deadlines (a 3 s body deadline) starts from a built service, as
    with warm: full. With recognizer.with_pipeline the recogniser is in the
    OcrPipeline replicas (its stats under "rec"). TimeoutError after timeout_s.

    With `url` (a service this process did not start: `serve run`, no Ray
    driver here) it polls url/v1/stats instead and returns the seconds it
    waited, None if no shape was left to build; past timeout_s it returns."""
    if url is not None:
        t0 = time.monotonic()
        if not shapes_left(url):
            return None
        while shapes_left(url) and time.monotonic() - t0 < timeout_s:
            time.sleep(0.2)
        return time.monotonic() - t0
    from ray import serve

    deployments = serve.status().applications[app].deployments
    name = "TextRecognizer" if "TextRecognizer" in deployments else "OcrPipeline"
    handle = serve.get_deployment_handle(name, app_name=app)
    get = None
    if name == "OcrPipeline":  # PipelineWithModels.stats -> {"rec": [this replica's recogniser stats], ...}
        get = lambda: handle.stats.remote({"rec": 1}).result()["rec"][0]  # noqa: E731
    deadline = time.monotonic() + timeout_s
    while True:
        n = serve.status().applications[app].deployments[name].replica_states.get("RUNNING", 1)
        building = {pid: s["deferred_shapes"] for pid, s in replica_stats(handle, n, get=get).items()
                    if s.get("deferred_shapes") and s["deferred_shapes"].get("finished_at") is None}
        if not building:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"recogniser shapes still building after {timeout_s:.0f}s: {building}")
        time.sleep(1)


def replica_pids(deployments: list[str]) -> dict[str, list[int]]:
    """deployment name -> pids of its live replica actors (any application)."""
    import os

    import ray

    out: dict[str, list[int]] = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        for name in deployments:
            if f"#{name}#" in a["name"]:
                try:
                    actor = ray.get_actor(a["name"], namespace=a["namespace"])
                    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30)
                except Exception:
                    continue  # replaced or stopping: the next read finds its successor
                out.setdefault(name, []).append(pid)
    return out


def with_batch_size(config: dict, size: Optional[int]) -> tuple[dict, dict[str, Any]]:
    """A copy of config whose model deployments' user_config has
    max_batch_size = size (None: as in the file); and deployment -> that size."""
    cfg = copy.deepcopy(config)
    want = {}
    for app in cfg["applications"]:
        for d in app.get("deployments", []):
            if d["name"] in MODEL_DEPLOYMENTS.values():
                uc = dict(d.get("user_config") or {})
                if size is not None:
                    uc["max_batch_size"] = size
                d["user_config"] = uc
                want[d["name"]] = uc.get("max_batch_size")
    return cfg, want


class Service:
    """The service for a benchmark: start() records the cold-start times."""

    def __init__(self, config_path: Path, port: int):
        self.config = load_config(config_path)
        self.config.pop("http_options", None)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.started = False
        self.cold: dict[str, Any] = {}

    def start(self, ready_timeout_s: float) -> None:
        t = time.perf_counter()
        start_ray()
        self.started = True
        self.cold["ray_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        start_serve(self.port)
        self.cold["serve_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        apply_config(self.config)
        self.cold["deploy_call_s"] = time.perf_counter() - t
        self.cold["deploy_to_ready_s"] = (time.perf_counter() - t) + wait_ready(self.url, ready_timeout_s)

    def stop(self) -> float:
        """Seconds it took (0 if it was not started)."""
        if not self.started:
            return 0.0
        t = time.perf_counter()
        stop_all(graceful=False)
        self.started = False
        return time.perf_counter() - t


def parse_config(spec: str) -> tuple[str, list[tuple[list[str], object]]]:
    """`FILE+a.b=v+...` -> (FILE, [(["a", "b"], v), ...]), v read as YAML:
    a config with overrides of its application args, for ServeRun."""
    path, *rest = spec.strip().split("+")
    out = []
    for item in rest:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} of {spec!r}: write key.path=value")
        out.append((key.split("."), yaml.safe_load(value)))
    return path, out


def apply_overrides(args: dict, overrides: list[tuple[list[str], object]]) -> None:
    for keys, value in overrides:
        node = args
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value


class ServeRun:
    """`serve run` of a temporary copy of a config (as a user starts it; with
    parse_config's overrides): a free port, a temporary journal and compile
    cache; started in its own session; stop() leaves none of its processes."""

    def __init__(self, config: Path, work: Path, cache_dir: Path, overrides: Optional[list] = None):
        cfg = yaml.safe_load(config.read_text())
        for app in cfg["applications"]:
            args = app.setdefault("args", {})
            apply_overrides(args, overrides or [])
            if args.get("jobs", {}).get("journal"):
                args["jobs"]["journal"] = str(work / "jobs.sqlite")
            args.setdefault("engine", {}).setdefault("predictor", {})["cache_dir"] = str(cache_dir)
        self.cfg = cfg
        self.path = work / "config.yaml"
        self.log_path = work / "serve.log"
        self.url = ""
        self.proc: Optional[subprocess.Popen] = None
        self.pids: dict[int, Optional[int]] = {}  # pid -> its start time (clock ticks after boot)

    def _remember(self, pids: list[int]) -> None:
        from harness.procfs import start_time

        for p in pids:
            self.pids.setdefault(p, start_time(p))

    def start(self, timeout_s: float) -> float:
        """Seconds from `serve run` to /readyz 200, on a port of its own
        (so nothing left of an earlier start can answer for it)."""
        port = free_port()
        self.cfg.setdefault("http_options", {})["port"] = port
        self.path.write_text(yaml.safe_dump(self.cfg))
        self.url = f"http://127.0.0.1:{port}"
        serve_bin = Path(sys.executable).parent / "serve"
        log = open(self.log_path, "a")
        t = time.perf_counter()
        self.proc = subprocess.Popen([str(serve_bin), "run", str(self.path)], cwd=REPO, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        log.close()
        try:
            wait_ready(self.url, timeout_s, proc=self.proc, every_s=0.1)
        except Exception as e:
            self.stop()
            raise RuntimeError(f"{e}:\n{self.log_path.read_text()[-3000:]}") from e
        return time.perf_counter() - t

    def processes(self) -> list[dict]:
        """Every live process of the service (`serve run` and its
        descendants): pid, command line and harness.procfs.pss_mb's figures."""
        from harness.procfs import cmdline, descendants, pss_mb

        assert self.proc is not None
        out = []
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        self._remember(pids)
        for pid in pids:
            m = pss_mb(pid)
            if m:
                out.append({"pid": pid, "cmd": cmdline(pid, 200), **m})
        return out

    def pss_mb(self) -> float:
        """The PSS of all its processes, MB."""
        return sum(p["pss"] for p in self.processes())

    def stop(self) -> None:
        from harness.procfs import descendants, start_time

        if self.proc is None:
            return
        self._remember([self.proc.pid, *descendants(self.proc.pid)])
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # `serve run` stops the local Ray it started
            self.proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
        # Ray's workers outlive the CLI by a few seconds: wait for every
        # process this service had, then SIGKILL what is left of them.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(t is not None and start_time(p) == t for p, t in self.pids.items()):
            time.sleep(0.2)
        for p, started in self.pids.items():
            if started is not None and start_time(p) == started:  # still that process, not a reused pid
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.pids = {}
        wait_ray_gone()
