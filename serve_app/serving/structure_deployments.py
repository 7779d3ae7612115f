"""The document-structure models as Ray Serve deployments (options.structure,
issue 58): LayoutDetector (PicoDet on CDLA: a page -> its layout regions)
and TableRecognizer (SLANet_plus: a table region's crop -> its structure),
thin as the OCR stages' (serve_app.serving.deployments): one `@serve.batch`
method each, so pages and table crops of several requests share a batch.

Neither is loaded before someone asks (serve_app/serving/structure_start.py:
started from zero replicas on the first request that asks in the per-stage
profiles, built in the pipeline's process in the light one)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np
from ray import serve

from serve_app.core.app_args import BATCH_DEFAULTS, LaneArgs, ModelArgs
from serve_app.core.engine_config import EngineConfig
from serve_app.core.lanes import lane_of
from serve_app.serving.autoscaling import backlog_stats
from serve_app.serving.batch_items import Timed, _expired, per_owner
from serve_app.serving.replica_calls import ReplicaCalls, stage_batch
from serve_app.serving.metrics import LaneMetrics
from serve_app.serving.replica import ModelReplica


class _StructureReplica(ReplicaCalls):
    """A structure model's replica: its ModelReplica, its runner, one batched call."""

    stage = ""
    what = ""

    def _build(self, engine: EngineConfig, args: ModelArgs, lanes: LaneArgs, runner: Callable) -> None:
        from serve_app.inference.weights import structure_files

        opts = engine.structure
        directory = opts.layout_model if self.stage == "layout" else opts.table_model
        self.replica = ModelReplica.build(self.stage, None, engine.predictor, args, BATCH_DEFAULTS[self.stage],
                                          None, None, files=structure_files(self.stage, directory))
        if lanes.enabled:  # interactive pages ahead of bulk ones in the batch queue
            self.replica.use_lanes(lanes.bulk_max_wait_s, LaneMetrics(self.stage))
        self.runner = runner(self.replica.predictor, opts)
        self.replica.warm(self.runner.warm_calls())  # one input shape: every batch size of it

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom-metrics hook: pages (tables) queued here (serve_app.serving.autoscaling)."""
        return backlog_stats(self.stage, self.replica.pending, self.replica.metrics)

    async def _run(self, fn: Callable[[list], list], items: list) -> list:
        now = time.time()
        live = [k for k, i in enumerate(items) if not i.expired(now)]
        out: list = [_expired(self.what) for _ in items]
        if live:
            t0 = time.perf_counter()
            got = await self.replica.isolated(fn, [[items[k].item] for k in live])
            for k, o in zip(live, got):
                out[k] = o if isinstance(o, Exception) else o[0]
            self.replica.record(len(live), len(live), time.perf_counter() - t0)
        return out


@serve.deployment(name="LayoutDetector")
class LayoutDetectorDeployment(_StructureReplica):
    stage, what = "layout", "layout detector"

    def __init__(self, engine: EngineConfig, args: ModelArgs, lanes: LaneArgs = LaneArgs()):
        from serve_app.inference.runners import LayoutDetector

        self._build(engine, args, lanes, LayoutDetector)

    def reconfigure(self, user_config: dict) -> None:
        self.replica.reconfigure(user_config, self._layout_batch)

    async def layout(self, page: np.ndarray, deadline: Optional[float] = None, lane: Optional[str] = None) -> list:
        """One BGR page's layout regions (serve_app.structure.LayoutBox, in
        its pixels), batched with other requests' pages; a page whose
        deadline (time.time()) passed before its batch ran is not run."""
        return await self.replica.queued(self._layout_batch, Timed(page, deadline, self), lane_of(lane))

    @stage_batch("layout")
    @per_owner
    async def _layout_batch(self, items: list) -> list:
        return await self._run(self.runner.detect, items)


@serve.deployment(name="TableRecognizer")
class TableRecognizerDeployment(_StructureReplica):
    stage, what = "table", "table recogniser"

    def __init__(self, engine: EngineConfig, args: ModelArgs, lanes: LaneArgs = LaneArgs()):
        from serve_app.inference.runners import TableRecognizer

        self._build(engine, args, lanes, TableRecognizer)

    def reconfigure(self, user_config: dict) -> None:
        self.replica.reconfigure(user_config, self._table_batch)

    async def table(self, crop: np.ndarray, deadline: Optional[float] = None, lane: Optional[str] = None) -> Any:
        """One table crop's structure (serve_app.structure.TableStructure),
        batched with other tables, this request's and others'."""
        return await self.replica.queued(self._table_batch, Timed(crop, deadline, self), lane_of(lane))

    @stage_batch("table")
    @per_owner
    async def _table_batch(self, items: list) -> list:
        return await self._run(self.runner.recognize, items)


def build_both(engine: EngineConfig, layout_args: ModelArgs, table_args: ModelArgs,
               lanes: LaneArgs) -> tuple[LayoutDetectorDeployment, TableRecognizerDeployment]:
    """Both as plain objects in this process (the light profile's StructureInProcess)."""
    layout = LayoutDetectorDeployment.func_or_class(engine, layout_args, lanes)
    try:
        return layout, TableRecognizerDeployment.func_or_class(engine, table_args, lanes)
    except BaseException:
        layout.close()
        raise
