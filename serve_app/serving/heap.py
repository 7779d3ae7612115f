"""glibc's heap in a model replica's process: one malloc arena, glibc's own
(rising) mmap threshold, and the heap trimmed after warm-up and whenever
the process has been idle a moment (`malloc_trim`); and its threads'
CPU priority: niceness a step over the front's (yield_to_front), and a CPU
predictor's threads in SCHED_IDLE (idle_on_cpu).

Why (the heap_settings benchmark, deleted once it had decided this; commit 4adefb1 has it): with a fixed mmap threshold
of 128 KiB every image-sized buffer (the decoded image, the detector's
input tensor, the engine's inputs and outputs) was mapped and unmapped on
every request: page faults, zeroing and, in a process with many threads,
TLB shoot-downs. It cost ~25 ms of the engine's ~75 ms median on the peer
set here. With glibc's rising threshold those buffers are reused from the
heap instead; one arena (MALLOC_ARENA_MAX=1: every thread allocates from
the one heap; the predictor threads take turns anyway) keeps the freed
pieces in one place, and `malloc_trim(0)` gives freed pages back: the
warm-up's once ready, a burst's once the process is idle for
`malloc_trim_idle_s`.

The arena limit is read once, at the process's first allocation (a
mallopt at the replica's build would only stop new arenas; threads Ray
started earlier keep theirs): its one home is MALLOC_ARENA_MAX in the model
deployments' runtime_env (every profile gives them 1), and a replica's
heap stats report it (`arena_max_env`).

No Ray import: unit-tested with a fake clock and a real glibc
(tests/unit/test_heap.py)."""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable, Optional

M_MMAP_THRESHOLD = -3


@functools.lru_cache(maxsize=1)
def libc() -> Any:
    """This process's C library (None if it cannot be opened)."""
    try:
        import ctypes

        return ctypes.CDLL(None)
    except OSError:
        return None


def _mallopt(param: int, value: int, lib: Any) -> bool:
    lib = libc() if lib is None else lib
    fn = getattr(lib, "mallopt", None)
    return fn is not None and fn(param, int(value)) == 1


def set_mmap_threshold(nbytes: Optional[int], lib: Any = None) -> bool:
    """glibc's mmap threshold for this process (mallopt M_MMAP_THRESHOLD):
    allocations above `nbytes` are mapped and unmapped when freed. Also
    stops glibc raising the threshold by itself. None, or a C library
    without mallopt (not glibc): nothing is changed, False."""
    if nbytes is None:
        return False
    return _mallopt(M_MMAP_THRESHOLD, nbytes, lib)


def trim(lib: Any = None) -> bool:
    """Give the heap's free pages back to the OS (malloc_trim(0): every
    arena, the middle of the heap too). False where there is no malloc_trim."""
    lib = libc() if lib is None else lib
    fn = getattr(lib, "malloc_trim", None)
    if fn is None:
        return False
    fn(0)
    return True


class IdleTrimmer:
    """Trims the heap once the process has been idle for `idle_s`: nothing
    in flight (`begin`/`end`) and nothing begun or ended for that long, and
    something ran since the last trim. `step` does one check (tests drive
    it with a fake clock); `start` runs it on a daemon thread."""

    def __init__(self, idle_s: float, clock: Callable[[], float] = time.monotonic,
                 trim_fn: Callable[[], Any] = trim):
        self.idle_s = float(idle_s)
        self.clock = clock
        self.trim_fn = trim_fn
        self.active = 0
        self.last = clock()
        self.dirty = False
        self.trims = 0
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def begin(self) -> None:
        with self._lock:
            self.active += 1
            self.last = self.clock()
            self.dirty = True

    def end(self) -> None:
        with self._lock:
            self.active -= 1
            self.last = self.clock()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn counted as work (begin/end around it), on whatever thread runs it."""
        def counted(*args: Any) -> Any:
            self.begin()
            try:
                return fn(*args)
            finally:
                self.end()

        return counted

    def step(self) -> bool:
        """Trim now if idle long enough since the last work; True if it did."""
        with self._lock:
            if not self.dirty or self.active > 0 or self.clock() - self.last < self.idle_s:
                return False
            self.dirty = False
        self.trim_fn()
        self.trims += 1
        return True

    def stats(self) -> dict[str, Any]:
        """The process's heap settings in force and the trims done so far."""
        return {"idle_s": self.idle_s, "trims": self.trims, "in_flight": self.active, "trim_pending": self.dirty,
                "arena_max_env": os.environ.get("MALLOC_ARENA_MAX")}

    def start(self) -> "IdleTrimmer":
        if self._thread is None:
            def loop() -> None:
                while True:
                    time.sleep(self.idle_s / 2)
                    self.step()

            self._thread = threading.Thread(target=loop, name="heap-trim", daemon=True)
            self._thread.start()
        return self


def counted_calls(predictor: Any, trimmer: Optional[IdleTrimmer]) -> None:
    """Every call on the predictor's thread (its call_async: batches, shape
    builds, the canary) counted as the process's work by `trimmer`."""
    if trimmer is None:
        return
    call_async = predictor.call_async

    async def counted(fn: Callable[..., Any], *args: Any) -> Any:
        return await call_async(trimmer.wrap(fn), *args)

    predictor.call_async = counted


_process_trimmer: Optional[IdleTrimmer] = None
_process_lock = threading.Lock()


def process_trimmer(idle_s: Optional[float]) -> Optional[IdleTrimmer]:
    """This process's one trimmer (started on first use; the first caller's
    idle_s holds), or None when idle_s is None and none runs yet."""
    global _process_trimmer
    with _process_lock:
        if _process_trimmer is None and idle_s is not None:
            _process_trimmer = IdleTrimmer(idle_s).start()
        return _process_trimmer


# A model replica's threads run this much nicer than the process started
# (Ray starts every worker, the proxy and the ingress too, at nice 15): its
# inference threads keep every core busy under load by design, and the
# front's processes must win the CPU for /healthz and the next request's door.
MODEL_NICE_STEP = 4
_yielded: list[int] = []  # the niceness set, once per process


def yield_to_front(step: int = MODEL_NICE_STEP) -> None:
    """Every thread of this process (and those created later, which inherit
    it) `step` nicer than this thread was, at most 19, once per process
    (a process of several stages does not stack it; niceness is per thread)."""
    if not _yielded:
        _yielded.append(min(19, os.getpriority(os.PRIO_PROCESS, 0) + step))
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < _yielded[0]:
                os.setpriority(os.PRIO_PROCESS, int(tid), _yielded[0])
        except OSError:  # a thread that ended meanwhile
            pass


def idle_on_cpu(predictor: Any) -> bool:
    """A predictor's thread_init (serve_app.inference.predictor): on the
    CPU, its thread in SCHED_IDLE before the engine is built, so that the
    engine's threads it starts inherit it (idle_threads); on a GPU its
    threads feed the device and keep their priority. True if set."""
    if predictor.options.device != "cpu":
        return False
    return idle_threads({threading.get_native_id()}) == 1


def idle_threads(tids: set[int]) -> int:
    """Put these threads in SCHED_IDLE (threads they create later inherit
    it): they get the CPU only when no normal thread wants it, and a normal
    thread that wakes (the proxy's, the ingress's loop, a health check)
    takes the core from them at once. Linux lets a process do this to its
    own threads unprivileged; niceness alone leaves a model thread at nice
    19 with ~1/2.4 of a nice-15 front thread's weight. Measured with
    `python -m load_tests hostile front` (docs/operations.md): on a quiet
    box /healthz p99 49 vs 61 ms beside `probes`, 31 vs 51 ms beside
    `layout`, the normal request's worst time unchanged; other load on a
    shared box moves both more than this. Returns how many were set (0
    off Linux)."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return 0
    done = 0
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            done += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return done
