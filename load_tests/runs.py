"""A benchmark run: its load points (each with its raw records) and its raw
JSON, written during the run and read back for the report (live and
--from-raw render the same document)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from load_tests.loadgen import log, now
from harness.service import MODEL_DEPLOYMENTS as STAGES, REPO
from load_tests.stats import Record, summarize

TIMING_KEYS = ("decode", "det", "cls", "rec", "total")
ALL_TARGETS = ("engine", "rapidocr", "simple", "http", "open", "handle", "jobs", "nobatch")
SERVICE_TARGETS = {"http", "open", "handle", "jobs", "nobatch"}
LABELS = {
    "engine": "engine, in-process",
    "rapidocr": "rapidocr-onnxruntime, in-process",
    "simple": "simple server, HTTP",
    "http": "service, HTTP",
    "open": "service, HTTP",
    "handle": "service, handle",
    "jobs": "service, HTTP jobs",
    "nobatch": "service, HTTP, batching off",
    "cold": "service, HTTP, first after ready",
}


@dataclass
class Point:
    target: str  # engine | rapidocr | simple | http | open | handle | jobs | nobatch | cold
    mode: str  # loop | closed | open | single
    load: float  # clients (closed), rate in img/s (open), 1 (loop)
    window: tuple[float, float]
    summary: dict
    batches: Optional[dict] = None
    loadavg: tuple = ()
    records: list = field(default_factory=list)
    cpu: Optional[dict] = None  # cores used in the window: machine, ours, others

    @property
    def label(self) -> str:
        return LABELS[self.target]

    def load_str(self) -> str:
        if self.mode == "closed":
            return f"{int(self.load)} client{'s' if self.load != 1 else ''}"
        if self.mode == "open":
            return f"{self.load:.2f}/s Poisson"
        return "1 at a time"

    def to_json(self) -> dict:
        return {"target": self.target, "label": self.label, "mode": self.mode, "load": self.load,
                "summary": self.summary, "batches": self.batches, "loadavg": self.loadavg, "cpu": self.cpu,
                "window_s": self.window[1] - self.window[0],
                "records": [r.to_json(self.window[0]) for r in self.records]}

    @classmethod
    def from_json(cls, pt: dict) -> "Point":
        # times are relative to the window's start; the summary is the one
        # computed during the run, from unrounded times
        return cls(pt["target"], pt["mode"], pt["load"], (0.0, pt["window_s"]), pt["summary"], pt.get("batches"),
                   tuple(pt.get("loadavg") or ()), [Record.from_json(r) for r in pt["records"]], pt.get("cpu"))


def dist_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def git_state() -> tuple[str, list[str]]:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "--", "serve_app", "deployments.yaml",
                                "deployments.gpu.yaml", "pyproject.toml"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
        return head, [d.strip() for d in dirty]
    except Exception:
        return "?", []


class Run:
    """What a run measured so far; `to_raw()` is all the report needs."""

    def __init__(self, args):
        self.args = args
        self.points: list[Point] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.cold: dict[str, Any] = {}
        self.probes: dict[str, Any] = {}
        self.images: list[str] = []
        self.t_start = now()
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.loadavg_start = os.getloadavg()
        self.loadavg_end: Optional[tuple] = None
        self.wall_s: Optional[float] = None
        self.git = git_state()
        self.machine = f"{platform.node()}, {platform.machine()}, os.cpu_count()={os.cpu_count()}, " \
                       f"affinity {sorted(os.sched_getaffinity(0))}"
        self.versions = (f"python {platform.python_version()}, ray {dist_version('ray')}, paddlepaddle "
                         f"{dist_version('paddlepaddle')}, onnxruntime {dist_version('onnxruntime')}, aiohttp "
                         f"{dist_version('aiohttp')}")

    def finish(self) -> None:
        if self.wall_s is None:
            self.wall_s = now() - self.t_start
            self.loadavg_end = os.getloadavg()

    def to_raw(self) -> dict:
        return {
            "argv": self.args.argv, "started": self.started, "wall_s": self.wall_s,
            "loadavg_start": self.loadavg_start, "loadavg_end": self.loadavg_end, "git": self.git,
            "machine": self.machine, "versions": self.versions, "cold": self.cold, "probes": self.probes,
            "notes": self.notes, "failures": self.failures, "images": self.images,
            "points": [p.to_json() for p in self.points],
        }

    @classmethod
    def from_raw(cls, args, raw: dict) -> "Run":
        """A finished run read back from its raw JSON."""
        run = cls.__new__(cls)
        run.args = args
        run.t_start = 0.0
        run.started, run.wall_s = raw["started"], raw.get("wall_s")
        run.loadavg_start = tuple(raw.get("loadavg_start") or ())
        run.loadavg_end = tuple(raw.get("loadavg_end") or ())
        run.git = tuple(raw.get("git") or ("?", []))
        run.machine, run.versions = raw.get("machine", "?"), raw.get("versions", "?")
        run.cold, run.probes = raw.get("cold", {}), raw.get("probes", {})
        run.notes, run.failures = list(raw.get("notes", [])), list(raw.get("failures", []))
        run.images = list(raw.get("images", []))
        run.points = [Point.from_json(pt) for pt in raw["points"]]
        return run

    def over_deadline(self, what: str) -> bool:
        if now() - self.t_start > self.args.deadline:
            note = f"{what} skipped: the run passed its --deadline of {self.args.deadline:.0f}s"
            log(note)
            self.notes.append(note)
            return True
        return False

    def add(self, target: str, mode: str, load: float, recs: list[Record], window, batches=None, cpu=None) -> Point:
        p = Point(target, mode, load, window, summarize(recs, window), batches, os.getloadavg(), recs, cpu)
        self.points.append(p)
        s = p.summary
        log(f"{p.label} [{p.load_str()}]: {s['requests']} req, {s['errors']} errors, {s['throughput']:.2f} img/s, "
            f"p50 {s['p50_ms']:.0f} p90 {s['p90_ms']:.0f} p99 {s['p99_ms']:.0f} ms"
            + (" | batch req det/cls/rec " + "/".join(f"{batches[st]['mean_requests']:.2f}" for st in STAGES)
               if batches else "")
            + (f" | others' CPU {cpu['others']:.2f} cores" if cpu else ""))
        return p

    def get(self, target: str, mode: Optional[str] = None) -> list[Point]:
        return [p for p in self.points if p.target == target and (mode is None or p.mode == mode)]
