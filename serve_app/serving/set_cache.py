"""The model sets a replica holds: the catalogue's default, loaded and
warmed before the replica is ready and never unloaded, and the others,
each loaded on its first request and unloaded again (least recently used,
only while idle) when another is wanted and would not fit.

What fits is memory, not a count: each further set's cost is the
process's PSS after its load less before it (measured on the loader
thread; before its first load, the largest cost measured so far, or
FIRST_LOAD_GUESS_MB), and the further sets held together stay within
`memory_mb` (auto: half the machine's MemAvailable when the cache is made,
after the default set loaded). Sets that fit are loaded at once. A load
that must unload another starts only `min_resident_s` after the previous
load ended: a client naming the catalogue's sets in turn gets 503 with
Retry-After meanwhile, not a load per request.

A load runs on a thread of its own, one at a time per replica (it is
mostly compiling and warming shapes, CPU the requests in flight share; it
never holds the event loop). The request that started it, and any other
for that set, waits up to `load_wait_s`; past that it gets 503
(ModelLoading) with a Retry-After of the load's expected remaining time,
and the load goes on, so the retry finds the set loaded. A load that fails
leaves the reason in the log and answers 503 (ModelUnavailable) for
`retry_failed_s`; the default set serves throughout. A set is in use from
the moment a request takes it until its read ends: it is never unloaded
under a request.

The seam (also for other on-demand models, e.g. structure stages): a
SetCache is made with the catalogue (names, the first the default, added
by the caller with `add`), `build(name) -> obj` and `close(obj)` (called on
the loader thread), and the SetLoading knobs; callers read through
`async with cache.use(name) as obj` and show `states()`. Nothing in it
knows what `obj` is.

No Ray import: unit-tested with plain objects and explicit steps
(tests/unit/test_set_cache.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Optional

from serve_app.core.errors import ConfigError, ModelLoading, ModelUnavailable
from serve_app.core.own_sets import SetLoading

log = logging.getLogger("ray.serve")

# A first load's expected time, before any load of the set was timed here (seconds;
# v6 tiny and v4 took 8-15 s on 2 shared cores: python -m load_tests memory footprint).
FIRST_LOAD_GUESS_S = 20.0
# A set's memory before any set was measured here (MB of PSS; ppocrv4_mobile added 750-855 MB
# in make serve's profile, ppocrv6_tiny 364: docs/performance.md).
FIRST_LOAD_GUESS_MB = 800.0
ANSWERED_S = 30.0  # DeploymentSets: how long a start's answer counts as "running" before Serve's status says so


def process_pss_mb() -> float:
    """This process's PSS in MB (/proc/self/smaps_rollup); NaN where unreadable."""
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")


def available_mb() -> float:
    """The machine's MemAvailable in MB; NaN where unreadable."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")


def budget_mb(loading: SetLoading, available: Callable[[], float] = available_mb) -> float:
    """The further sets' memory budget: memory_mb, or with auto half of what the machine has available now
    (FIRST_LOAD_GUESS_MB where that cannot be read)."""
    if loading.memory_mb != "auto":
        return float(loading.memory_mb)
    free = available()
    return FIRST_LOAD_GUESS_MB if math.isnan(free) else max(FIRST_LOAD_GUESS_MB / 2, free / 2)


def one_replica(num_replicas: Optional[int], max_replicas: Optional[int]) -> None:
    """The one-process profile runs one replica: each would load its own copies of the sets and a
    request for a set could reach a replica without it. ConfigError naming the per-stage profile."""
    n = max(num_replicas or 1, max_replicas or 1)
    if n > 1:
        raise ConfigError(
            f"OcrPipeline with recognizer.with_pipeline holds the models in one replica; {n} replicas (num_replicas "
            "or autoscaling max_replicas) would each load their own model sets, and a request for a set could reach "
            "one without it: set num_replicas: 1, or serve more replicas with the per-stage profile "
            "(deployments.yaml, `serve run deployments.yaml`), whose stages scale on their own")


class SetCache:
    def __init__(self, catalogue: tuple[str, ...], build: Callable[[str], Any], close: Callable[[Any], None],
                 loading: SetLoading = SetLoading(), clock: Callable[[], float] = time.monotonic,
                 executor: Optional[ThreadPoolExecutor] = None, after_unload: Optional[Callable[[], Any]] = None,
                 measure: Callable[[], float] = process_pss_mb, available: Callable[[], float] = available_mb):
        self.catalogue = tuple(catalogue)
        self.default = self.catalogue[0]
        self.loading_args = loading
        self.budget_mb = budget_mb(loading, available)
        self._build, self._close, self._clock, self._measure = build, close, clock, measure
        self._after_unload = after_unload
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="set-load")
        self.loaded: OrderedDict[str, Any] = OrderedDict()  # least recently used first
        self.in_use: Counter = Counter()
        self.load_s: dict[str, float] = {}  # the last load's seconds, per set
        self.mb: dict[str, float] = {}  # the last load's PSS added, per further set
        self.loaded_at: dict[str, float] = {}
        self.last_load_end = -math.inf  # when the last further set's load ended (the churn bound)
        self.failed: dict[str, tuple[str, float]] = {}  # reason, when
        self._load: Optional[tuple[str, float, asyncio.Future]] = None  # set, started, its future
        self.loads = self.unloads = 0

    def add(self, name: str, obj: Any, load_s: Optional[float] = None) -> None:
        """A set built by the caller (the default, before ready)."""
        self.loaded[name] = obj
        self.loaded_at[name] = self._clock()
        if load_s is not None:
            self.load_s[name] = load_s

    def state(self, name: str) -> str:
        if name in self.loaded:
            return "loaded"
        if self._load is not None and self._load[0] == name:
            return "loading"
        return "failed" if name in self.failed else "not loaded"

    def states(self) -> dict[str, dict[str, Any]]:
        """name -> {"state", "load_s", "mb"} for every catalogued set, the default first (mb: the PSS its
        last load added; None for the default and a set not loaded yet)."""
        return {name: {"state": self.state(name), "load_s": round(self.load_s[name], 2) if name in self.load_s else None,
                       "mb": round(self.mb[name]) if name in self.mb else None}
                for name in self.catalogue}

    def held_mb(self) -> float:
        """The further sets' memory held now (their measured costs)."""
        return sum(self.mb.get(n, 0.0) for n in self.loaded if n != self.default)

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Any]:
        """The set `name`, loaded (waiting for its load, bounded) and held
        while the block runs. ModelLoading / ModelUnavailable (503) when
        it cannot be had in time."""
        obj = self.loaded.get(name)
        if obj is None:
            obj = await self._wait_loaded(name)
        self.loaded.move_to_end(name)
        self.in_use[name] += 1
        try:
            yield obj
        finally:
            self.in_use[name] -= 1

    def _unavailable(self, name: str, left: float) -> ModelUnavailable:
        return ModelUnavailable(f"model set {name!r} could not be loaded (the service's log has why); retry after "
                                f"{math.ceil(left)} s, or use the default set {self.default!r}",
                                retry_after_s=max(1, math.ceil(left)))

    async def _wait_loaded(self, name: str) -> Any:
        failed = self.failed.get(name)
        if failed is not None:
            left = self.loading_args.retry_failed_s - (self._clock() - failed[1])
            if left > 0:
                raise self._unavailable(name, left)
        if self._load is None:
            self._start_load(name)
        load_name, started, future = self._load
        if load_name != name:  # one load at a time: this one after it
            left = self._expected_left(load_name, started) + self._expected(name)
            raise ModelLoading(f"model set {name!r} is not loaded and another set ({load_name!r}) is loading; "
                               f"retry after {math.ceil(left)} s", retry_after_s=max(1, math.ceil(left)))
        try:
            await asyncio.wait_for(asyncio.shield(future), self.loading_args.load_wait_s)
        except asyncio.TimeoutError:
            left = self._expected_left(name, started)
            raise ModelLoading(f"model set {name!r} is loading (its first request, or it was unloaded); retry "
                               f"after {math.ceil(left)} s", retry_after_s=max(1, math.ceil(left))) from None
        except Exception:
            pass  # the load's failure is recorded by _loaded; answered below
        if name not in self.loaded:  # this load failed: answered now, tried again only after retry_failed_s
            raise self._unavailable(name, self.loading_args.retry_failed_s)
        return self.loaded[name]

    def _expected(self, name: str) -> float:
        return self.load_s.get(name, FIRST_LOAD_GUESS_S)

    def _expected_left(self, name: str, started: float) -> float:
        return max(1.0, self._expected(name) - (self._clock() - started))

    def expected_mb(self, name: str) -> float:
        """What loading `name` is expected to add: its last measured cost, else the largest measured, else a guess."""
        return self.mb.get(name, max(self.mb.values(), default=FIRST_LOAD_GUESS_MB))

    def _start_load(self, name: str) -> None:
        victims = self._room_for(name)
        loop = asyncio.get_running_loop()
        started = self._clock()
        future = loop.run_in_executor(self._executor, self._unload_then_build, victims, name)
        self._load = (name, started, future)
        future.add_done_callback(lambda f: self._loaded(name, started, f))

    def _room_for(self, name: str) -> list[tuple[str, Any]]:
        """The sets to unload so that `name` fits (taken out of `loaded`
        now, so no request takes them meanwhile), least recently used
        first; ModelLoading when they are in use or the churn bound holds,
        ModelUnavailable when it cannot fit at all."""
        need, budget, args = self.expected_mb(name), self.budget_mb, self.loading_args
        if need > budget:
            raise ModelUnavailable(
                f"model set {name!r} needs about {need:.0f} MB, more than set_loading.memory_mb allows "
                f"({budget:.0f} MB) for all further sets together; raise memory_mb, or use the default set "
                f"{self.default!r}", retry_after_s=max(1, math.ceil(args.retry_failed_s)))
        further = [n for n in self.loaded if n != self.default]
        idle = [n for n in further if not self.in_use[n]]  # least recently used first

        def fits(gone: list[str]) -> bool:
            kept = [n for n in further if n not in gone]
            return (len(kept) + 2 <= args.max_loaded
                    and sum(self.mb.get(n, 0.0) for n in kept) + need <= budget)

        k = next((k for k in range(len(idle) + 1) if fits(idle[:k])), None)
        if k == 0:
            return []
        what = (f"{len(self.loaded)} model sets are loaded ({self.held_mb():.0f} MB of set_loading.memory_mb "
                f"{budget:.0f} for the further ones, max_loaded {args.max_loaded})")
        if k is None:
            raise ModelLoading(f"{what} and in use; retry shortly", retry_after_s=5)
        victims = idle[:k]
        # Churn bound: a load that unloads another starts min_resident_s after the previous load ended.
        wait = args.min_resident_s - (self._clock() - self.last_load_end)
        if wait > 0:
            raise ModelLoading(f"{what}; loading {name!r} would unload another, which is done at most once per "
                               f"{args.min_resident_s:g} s: retry after {math.ceil(wait)} s",
                               retry_after_s=max(1, math.ceil(wait)))
        return [(n, self.loaded.pop(n)) for n in victims]

    def _unload_then_build(self, victims: list[tuple[str, Any]], name: str) -> tuple[Any, float]:
        unloaded = bool(victims)
        while victims:
            victim, obj = victims.pop(0)
            log.info("model set %s: unloading (least recently used) to load %s", victim, name)
            self._close(obj)
            self.unloads += 1
            del obj
        if unloaded:  # the predictors' memory back to the OS before the next set's
            gc.collect()
            if self._after_unload is not None:
                self._after_unload()
        log.info("model set %s: loading on its first request", name)
        before = self._measure()
        obj = self._build(name)
        added = self._measure() - before
        return obj, (self.expected_mb(name) if math.isnan(added) else max(0.0, added))

    def _loaded(self, name: str, started: float, future: asyncio.Future) -> None:
        self._load = None
        if future.cancelled():
            return
        e = future.exception()
        if e is not None:
            self.failed[name] = (f"{type(e).__name__}: {e}", self._clock())
            log.error("model set %s failed to load: %s: %s", name, type(e).__name__, e)
            return
        self.failed.pop(name, None)
        self.loaded[name], self.mb[name] = future.result()
        self.loaded_at[name] = self.last_load_end = self._clock()
        self.load_s[name] = self._clock() - started
        self.loads += 1
        log.info("model set %s: loaded in %.1f s, %.0f MB (further sets: %.0f MB of %.0f)", name,
                 self.load_s[name], self.mb[name], self.held_mb(), self.budget_mb)

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def stage_states(deployments: list[Any]) -> str:
    """One set's stages' Serve statuses (DeploymentStatusOverview: status, message, replica_states) as one state."""
    running = [d.replica_states.get("RUNNING", 0) > 0 for d in deployments]
    if deployments and all(running):
        return "running"
    if any(not up and (str(d.status).endswith("DEPLOY_FAILED") or "failed to start" in (d.message or ""))
           for d, up in zip(deployments, running)):
        return "failed"
    return "stopped"


class DeploymentSets:
    """The per-stage profile's catalogue (deployments.yaml): each further
    set's detector and recogniser are deployments of their own
    (TextDetector_{set}, TextRecognizer_{set}) that Serve keeps at zero
    replicas until a request comes (autoscaling min_replicas 0) and takes
    back to zero after downscale_delay_s without one: a set's memory is a
    replica process of its own, all of it returned when that process exits.
    Serve starts a replica for the first call a handle queues; here the
    first request for a set makes that call (its stages' `ready`, which a
    replica answers once warmed) and waits for it up to load_wait_s, then
    503 (ModelLoading) with the remaining time, as SetCache does; other
    requests for the set join the same wait. `running()`: set -> "running"
    (both its stages have a running replica), "failed" (a stage's replica
    failed to start and none runs) or anything else (True / False: running
    or not; Serve's status, read
    on a thread, at most once a second: /readyz and the stats page list a
    set's stages a second or two after Serve runs them). A failed set is
    shown `failed` and its requests, waiting ones included, get 503
    (ModelUnavailable) with Retry-After retry_failed_s at once (Serve's
    status is read again each second of a wait); the default is never
    called on its account."""

    def __init__(self, catalogue: tuple[str, ...], probe: Callable[[str], Any], running: Callable[[], dict[str, str]],
                 loading: SetLoading = SetLoading(), clock: Callable[[], float] = time.monotonic):
        self.catalogue = tuple(catalogue)
        self.default = self.catalogue[0]
        self.loading_args = loading
        self._probe, self._running, self._clock = probe, running, clock
        self._seen: dict[str, str] = {}
        self._seen_at = -1e9
        self._loads: dict[str, tuple[float, asyncio.Future]] = {}
        self._answered: dict[str, float] = {}  # set -> when its stages last answered a start
        self.load_s: dict[str, float] = {}
        self.poll_s = 1.0  # a wait reads Serve's status again this often

    async def refresh(self) -> dict[str, str]:
        if len(self.catalogue) > 1 and self._clock() - self._seen_at >= 1.0:  # else: no status to read
            self._seen_at = self._clock()
            try:
                seen = {k: "running" if v is True else "stopped" if v is False else v  # True/False: up or not
                        for k, v in (await asyncio.to_thread(self._running)).items()}
            except Exception as e:  # Serve's status unreadable: nothing is known to be up
                log.warning("model sets: Serve's status could not be read: %s", e)
                seen = {}
            # Serve's status names a replica RUNNING a moment after it has answered: a set whose stages
            # answered within the last ANSWERED_S is loaded whatever the status says yet.
            for name, at in self._answered.items():
                if self._clock() - at < ANSWERED_S:
                    seen[name] = "running"
            self._seen = seen
        return self._seen

    def loaded(self, name: str) -> bool:
        return name == self.default or self._seen.get(name) == "running"

    def failed(self, name: str) -> bool:
        return name != self.default and self._seen.get(name) == "failed"

    def state(self, name: str) -> str:
        if self.loaded(name):
            return "loaded"
        return "failed" if self.failed(name) else "loading" if name in self._loads else "not loaded"

    async def states(self) -> dict[str, dict[str, Any]]:
        await self.refresh()
        return {name: {"state": self.state(name), "load_s": round(self.load_s[name], 2) if name in self.load_s else None}
                for name in self.catalogue}

    def _unavailable(self, name: str) -> ModelUnavailable:
        return ModelUnavailable(f"model set {name!r} could not be started (a replica of its stages failed to start: "
                                f"the service's log and `serve status` have why); use the default set {self.default!r}",
                                retry_after_s=max(1, math.ceil(self.loading_args.retry_failed_s)))

    async def wait_loaded(self, name: str) -> None:
        """Return once `name`'s stages run (at once for the default or a running set); ModelLoading past load_wait_s."""
        if name == self.default:
            return
        await self.refresh()
        if self.loaded(name):  # its stages run (a start still waited for by others is theirs to end)
            return
        if self.failed(name):
            raise self._unavailable(name)
        if name not in self._loads:
            started = self._clock()
            future = asyncio.ensure_future(self._probe(name))
            self._loads[name] = (started, future)
            future.add_done_callback(lambda f: self._loaded(name, started, f))
        started, future = self._loads[name]
        waited = 0.0
        try:
            while True:  # in steps of a second: Serve's status may say the start failed meanwhile
                step = min(self.poll_s, self.loading_args.load_wait_s - waited)
                try:
                    await asyncio.wait_for(asyncio.shield(future), max(0.0, step))
                    break
                except asyncio.TimeoutError:
                    waited += step
                    await self.refresh()
                    if self.failed(name):
                        raise self._unavailable(name) from None
                    if waited >= self.loading_args.load_wait_s:
                        raise
        except asyncio.TimeoutError:
            left = max(1.0, self.load_s.get(name, FIRST_LOAD_GUESS_S) - (self._clock() - started))
            raise ModelLoading(f"model set {name!r} is starting (its first request, or it was scaled to zero); "
                               f"retry after {math.ceil(left)} s", retry_after_s=max(1, math.ceil(left))) from None
        except ModelUnavailable:
            raise
        except Exception as e:
            raise self._unavailable(name) from e

    def _loaded(self, name: str, started: float, future: asyncio.Future) -> None:
        self._loads.pop(name, None)
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                log.error("model set %s could not be started: %s", name, future.exception())
            return
        self.load_s[name] = self._clock() - started
        self._seen[name] = "running"
        self._answered[name] = self._clock()
        log.info("model set %s: its stages answered after %.1f s", name, self.load_s[name])
