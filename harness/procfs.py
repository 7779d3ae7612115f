"""The one /proc reader of the tests and load_tests: a process's memory (RSS, shared
pages, private = RSS - RssShmem), the machine's free memory, CPU seconds
(the machine's and a process tree's). Linux only; every reader returns
NaN, None or zeros where /proc cannot be read, never raises."""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
from typing import Optional, Union

Pid = Union[int, str]


def status_kb(pid: Pid = "self", keys: tuple[str, ...] = ("VmRSS", "RssShmem")) -> dict[str, int]:
    """Fields of /proc/<pid>/status in kB (those present); {} if unreadable."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k in keys:
                    out[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def memory_mb(pid: Pid = "self") -> Optional[dict[str, float]]:
    """{"rss", "shared", "private"} in MB: shared = RssShmem (for a Ray
    worker, pages of the object store it has touched: Ray's memory, not the
    process's), private = RSS - shared. None if the process is gone."""
    st = status_kb(pid)
    if "VmRSS" not in st:
        return None
    rss, shm = st["VmRSS"] / 1024, st.get("RssShmem", 0) / 1024
    return {"rss": rss, "shared": shm, "private": rss - shm}


def rss_mb(pid: Pid = "self") -> float:
    m = memory_mb(pid)
    return m["rss"] if m else float("nan")


def rss_gb(pid: Pid = "self") -> float:
    return rss_mb(pid) / 1024


def mem_available_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")


def _tick() -> int:
    return os.sysconf("SC_CLK_TCK")


def process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used: utime + stime) for every process."""
    tick, out = _tick(), {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
    return out


def start_time(pid: int) -> Optional[int]:
    """A process's start time (/proc/<pid>/stat field 22, clock ticks after
    boot), None if gone: with the pid, it names one process (pids are reused)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def cmdline(pid: int, width: int = 90) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            return fh.read().replace("\0", " ")[:width]
    except OSError:
        return ""


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / _tick()


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds used by this
    process and its descendants: the simple server, Ray's processes and
    replicas). Their difference over a window is what other users' work took
    from the same cores. (0, 0) where /proc is not readable."""
    try:
        busy, table = machine_busy_seconds(), process_table()
        ours, me = 0.0, os.getpid()
        for pid, (_, t) in table.items():
            q, hops = pid, 0
            while q and q != me and hops < 64:
                q, hops = table.get(q, (0, 0.0))[0], hops + 1
            if q == me:
                ours += t
        return busy, ours
    except Exception:
        return 0.0, 0.0


def cpu_share(c0: tuple[float, float], c1: tuple[float, float], seconds: float) -> Optional[dict]:
    """Cores in use over a window: all, ours, and others' (machine minus ours)."""
    if seconds <= 0 or not c0[0] or not c1[0]:
        return None
    machine, ours = (c1[0] - c0[0]) / seconds, (c1[1] - c0[1]) / seconds
    return {"machine": machine, "ours": ours, "others": max(0.0, machine - ours)}


# --------------------------------------------------------------------------
# a process's heap and a watchdog on the machine's free memory (bench_engine.py)


def trim_heap() -> bool:
    """Hand freed heap memory back to the OS (glibc). rapidocr-paddle leaves
    gigabytes freed-but-held after its first pass over new shapes; without
    this the next system runs on top of it (the first full run here was
    OOM-killed that way). Called between passes only, never inside timing."""
    from serve_app.serving.heap import trim

    gc.collect()
    return trim()


class MemoryWatch:
    """Samples the process RSS every 0.1 s and keeps the peak per system.
    If the machine's MemAvailable falls under `min_free_gb`, exits at once
    with a clear message (the kernel's OOM killer would otherwise pick this
    process, or worse, a neighbour's)."""

    def __init__(self, min_free_gb: float):
        self.min_free_gb = min_free_gb
        self.current: Optional[str] = None
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memwatch", daemon=True)

    def start(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            r = rss_gb()
            if self.current is not None and not math.isnan(r):
                self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), r)
            avail = mem_available_gb()
            if self.min_free_gb > 0 and avail < self.min_free_gb:
                msg = (f"ABORTED: MemAvailable {avail:.2f} GiB < --min-free-gb {self.min_free_gb} "
                       f"while {self.current} ran (process RSS {r:.2f} GiB); no results written")
                print(msg, flush=True)
                print(msg, file=sys.stderr, flush=True)
                os._exit(3)



def set_mmap_threshold(nbytes: int) -> bool:
    from serve_app.serving.heap import set_mmap_threshold as set_threshold

    return set_threshold(nbytes)


def smaps_rollup_kb(pid: Pid = "self") -> dict[str, int]:
    """Fields of /proc/<pid>/smaps_rollup in kB (Rss, Pss, Pss_Anon,
    Pss_File, Pss_Shmem, ...); {} if unreadable (gone, or not ours)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                parts = v.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[k.strip()] = int(parts[0])
    except (OSError, ValueError):
        return {}
    return out


def pss_mb(pid: Pid = "self") -> Optional[dict[str, float]]:
    """{"pss", "rss", "anon", "file", "shmem"} in MB from smaps_rollup: PSS
    shares each page among the processes mapping it, so a sum over
    processes is what they hold together (RSS counts shared libraries once
    per process). None if the process is gone."""
    r = smaps_rollup_kb(pid)
    if "Pss" not in r:
        return None
    return {"pss": r["Pss"] / 1024, "rss": r.get("Rss", 0) / 1024, "anon": r.get("Pss_Anon", 0) / 1024,
            "file": r.get("Pss_File", 0) / 1024, "shmem": r.get("Pss_Shmem", 0) / 1024}


def descendants(root: int, table: Optional[dict[int, tuple[int, float]]] = None) -> list[int]:
    """Pids of root's descendants (not root), from one process table."""
    table = process_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return sorted(out)


def load_line(start, end=None) -> str:
    """The one load-average line of a benchmark's report: the 1, 5 and
    15-minute load averages at its start and at its end (`end` None: now),
    so a reader sees what else ran beside the figures."""
    def fmt(v) -> str:
        return "/".join(f"{x:.1f}" for x in v) if v else "n/a"

    return f"load average (1/5/15 min) {fmt(start)} at start, {fmt(os.getloadavg() if end is None else end)} at end"
