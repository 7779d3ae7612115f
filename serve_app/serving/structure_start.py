"""How the document-structure models (serve_app/serving/structure_deployments.py)
are started on the first request that asks for structure, and the pipeline's
layout and table stage calls through them. No Ray import at module level.

In the per-stage profiles (deployments.yaml) LayoutDetector and
TableRecognizer are deployments at zero replicas (autoscaling min_replicas
0 in the Serve config), scaled on their backlog; the first stage call
starts both through the same seam as the further model sets
(StructureStarter over serve_app.serving.set_cache.DeploymentSets: a call
Serve must start a replica for), others join it, each waits up to
set_loading.load_wait_s, then gets a 503 with Retry-After naming
structure. With `recognizer.with_pipeline` (the light profile, `make
serve`) both are built as plain objects in the pipeline's process on the
first call (StructureInProcess over a SetCache of one entry, on its loader
thread), on the recogniser's cores. Either way a service nobody asks for
structure has the ready time and memory it has without it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Optional

from serve_app.core.errors import ModelLoading, ModelUnavailable
from serve_app.core.own_sets import SetLoading
from serve_app.flow.pipeline import Stages
from serve_app.serving.payloads import sized
from serve_app.serving.set_cache import DeploymentSets, SetCache

STRUCTURE = "structure"  # its name in the seam's catalogue (not a model set: never listed as one)
_NONE = ""  # the catalogue's first entry, the seam's always-loaded default: nothing here


def _started(e: Exception) -> Exception:
    """The seam's 503 said of structure, not of a model set (its Retry-After kept)."""
    if isinstance(e, ModelLoading):
        return ModelLoading(f"the document structure models are starting (the first request that asks for "
                            f"structure starts them); retry after {e.retry_after_s} s, or send the request "
                            f"without structure", retry_after_s=e.retry_after_s)
    if isinstance(e, ModelUnavailable):
        return ModelUnavailable("the document structure models could not be started (the service's log has why); "
                                "send the request without structure", retry_after_s=e.retry_after_s)
    return e


def structure_stages(stages: Stages, layout: Callable, table: Callable, ready: Callable) -> Stages:
    """`stages` with layout and table calls that first wait for the
    structure models (`await ready()`: started on the first call)."""
    async def layout_call(page, ctx):
        await ready()
        return await layout(page, ctx)

    async def table_call(crop, ctx):
        await ready()
        return await table(crop, ctx)

    return dataclasses.replace(stages, layout=layout_call, table=table_call)


class StructureStarter:
    """The per-stage profiles' seam: the two deployments' handles, started
    on the first request that asks (DeploymentSets, as a further model
    set's stages are), and the stage calls that go through them."""

    def __init__(self, layout: Any, table: Any, loading: SetLoading = SetLoading(),
                 running: Optional[Callable[[], dict[str, bool]]] = None):
        self.layout, self.table = layout, table
        self.sets = DeploymentSets((_NONE, STRUCTURE), self._probe, running or self._running, loading)

    async def _probe(self, _name: str) -> None:  # a call queued at zero replicas: Serve starts one of each
        await asyncio.gather(self.layout.ready.remote(), self.table.ready.remote())

    def _running(self) -> dict[str, bool]:
        """Both have a RUNNING replica (Serve's status; blocking: called on a thread)."""
        from ray import serve

        app = serve.status().applications[serve.get_replica_context().app_name].deployments
        names = (self.layout.deployment_name, self.table.deployment_name)
        return {STRUCTURE: all(n in app and app[n].replica_states.get("RUNNING", 0) > 0 for n in names)}

    async def ready(self) -> None:
        try:
            await self.sets.wait_loaded(STRUCTURE)
        except (ModelLoading, ModelUnavailable) as e:
            raise _started(e) from None

    def loaded(self) -> bool:
        return self.sets.loaded(STRUCTURE)

    def handles(self) -> dict[str, Any]:
        """The stages to probe for readiness and stats: only once started (a call would start them)."""
        return {"layout": self.layout, "table": self.table} if self.loaded() else {}

    def stages(self, stages: Stages) -> Stages:
        return structure_stages(
            stages,
            lambda page, ctx: sized(self.layout, page).layout.remote(page, ctx.deadline, ctx.lane),
            lambda crop, ctx: sized(self.table, crop).table.remote(crop, ctx.deadline, ctx.lane),
            self.ready)


class StructureInProcess:
    """The light profile's seam (recognizer.with_pipeline): both models built
    as plain objects in this process on the first request that asks (a
    SetCache of one entry, loaded on its thread, waited for up to
    set_loading.load_wait_s, then 503 with Retry-After), their batch queues
    as behind a handle."""

    def __init__(self, build: Callable[[], tuple[Any, Any]], loading: SetLoading = SetLoading()):
        """`build()`: the (layout, table) models, built and warmed (on the cache's loader thread)."""
        self.cache = SetCache((_NONE, STRUCTURE), lambda _name: build(), self._close, loading.model_copy(
            update={"max_loaded": max(loading.max_loaded, 1)}))

    @staticmethod
    def _close(models: tuple[Any, Any]) -> None:
        for m in models:
            m.close()

    async def _models(self) -> tuple[Any, Any]:
        try:
            async with self.cache.use(STRUCTURE) as models:
                return models
        except (ModelLoading, ModelUnavailable) as e:
            raise _started(e) from None

    def loaded(self) -> Optional[tuple[Any, Any]]:
        return self.cache.loaded.get(STRUCTURE)

    def stages(self, stages: Stages) -> Stages:
        async def layout(page, ctx):
            m, _ = await self._models()
            return await m.layout(page, ctx.deadline, ctx.lane)

        async def table(crop, ctx):
            _, t = await self._models()
            return await t.table(crop, ctx.deadline, ctx.lane)

        async def ready():
            return None

        return structure_stages(stages, layout, table, ready)
