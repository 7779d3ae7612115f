"""Mean batch size per model stage, from the model deployments' `stats()`
(each keeps its last 256 batches), sampled during a load window and diffed
per replica pid; and a live batch-size change that waits until every replica
has taken it."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from load_tests.loadgen import awaitable, log, now
from load_tests.stats import mean
from harness.service import MODEL_DEPLOYMENTS as STAGES, apply_config, with_batch_size


class BatchSampler:
    """Reads `stats()["recent_batches"]` (a deque of the last 256 batches) of
    every model deployment, `fanout` calls one after the other so that every
    replica is likely reached (the router picks one per call), and keeps per
    replica (pid) the batches that are new since the previous read.
    begin()/end() bracket a measurement window. The calls are sequential on
    purpose: concurrent reads of one replica can come back out of order, and
    a newer read diffed against an older one would count every batch again."""

    def __init__(self, app: str = "ocr", interval_s: float = 2.0, fanout: int = 4, call_timeout_s: float = 5.0):
        from ray import serve

        self.handles = {s: serve.get_deployment_handle(d, app_name=app) for s, d in STAGES.items()}
        self.interval_s, self.fanout, self.call_timeout_s = interval_s, fanout, call_timeout_s
        self.last: dict[str, dict[int, list]] = {s: {} for s in STAGES}
        self.acc: dict[str, list[dict]] = {s: [] for s in STAGES}
        self.pids: dict[str, set] = {s: set() for s in STAGES}
        self.info: dict[str, dict] = {}
        self.overflow = 0
        self.collecting = False
        self.t_read: dict[str, float] = {}
        self.t_begin: dict[str, float] = {}
        self._task: Optional[asyncio.Task] = None

    @staticmethod
    def new_batches(prev: list, cur: list) -> tuple[list, bool]:
        """The entries of `cur` appended since `prev` (two reads of the same
        bounded deque: cur = prev minus k dropped from the front, plus the
        new ones). The second value is True when no overlap is found, i.e.
        at least the deque's length of batches passed between the reads
        (some may be lost)."""
        if not prev:
            return cur, False
        for k in range(len(prev)):
            tail = prev[k:]
            if cur[: len(tail)] == tail:
                return cur[len(tail):], False
        return cur, True

    async def snapshot(self) -> None:
        for stage, h in self.handles.items():
            for _ in range(self.fanout):
                try:
                    st = await asyncio.wait_for(awaitable(h.stats.remote()), self.call_timeout_s)
                except Exception:
                    break  # that replica is stuck or gone: try again at the next snapshot
                if not isinstance(st, dict):
                    continue
                pid = st["pid"]
                cur = list(st.get("recent_batches", []))
                new, lost = self.new_batches(self.last[stage].get(pid, []), cur)
                self.last[stage][pid] = cur
                self.info[stage] = {k: st.get(k) for k in ("max_batch_size", "batch_wait_timeout_s")}
                self.info.setdefault(f"{stage}_replicas", {})[pid] = {
                    k: st.get(k) for k in ("load_seconds", "warm_seconds", "cpu_affinity")}
                if self.collecting:
                    self.pids[stage].add(pid)
                    self.acc[stage].extend(new)
                    self.overflow += int(lost)
            self.t_read[stage] = now()  # when this stage's batches were last read

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.snapshot()
            except Exception as e:  # sampling must never stop a load point
                log(f"stats sampling failed: {type(e).__name__}: {e}")

    async def begin(self) -> None:
        self.collecting = False
        await self.snapshot()
        self.acc = {s: [] for s in STAGES}
        self.pids = {s: set() for s in STAGES}
        self.overflow = 0
        self.collecting = True
        self.t_begin = dict(self.t_read)
        self._task = asyncio.create_task(self._loop())

    async def end(self) -> dict[str, Any]:
        if self._task:
            self._task.cancel()
        await self.snapshot()
        self.collecting = False
        out: dict[str, Any] = {}
        for s in STAGES:
            b = self.acc[s]
            out[s] = {
                "batches": len(b),
                "mean_requests": mean(x["requests"] for x in b),
                "mean_items": mean(x["items"] for x in b),
                "mean_batch_ms": mean(x["ms"] for x in b),
                "busy_s": float(sum(x["ms"] for x in b) / 1000.0),
                # the interval these batches were collected over (first read to last read of this stage)
                "sampled_s": self.t_read.get(s, 0.0) - self.t_begin.get(s, 0.0),
                "replicas": len(self.pids[s]),
                "max_batch_size": (self.info.get(s) or {}).get("max_batch_size"),
            }
        out["overflow"] = self.overflow
        return out


async def set_batching(config: dict, size: Optional[int], sampler: BatchSampler, timeout_s: float = 120) -> None:
    """Redeploy `config` with user_config max_batch_size = size for the three
    model deployments (None: the config file's values); wait until every
    replica reports it."""
    cfg, want = with_batch_size(config, size)
    apply_config(cfg)
    t0 = now()
    while now() - t0 < timeout_s:
        sizes = []
        for stage, dep in STAGES.items():
            got = await asyncio.gather(*(asyncio.wait_for(awaitable(sampler.handles[stage].stats.remote()), 15)
                                         for _ in range(sampler.fanout)), return_exceptions=True)
            sizes += [g.get("max_batch_size") == want.get(dep) for g in got if isinstance(g, dict)]
        if sizes and all(sizes):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"replicas did not take max_batch_size={size} in {timeout_s}s")
