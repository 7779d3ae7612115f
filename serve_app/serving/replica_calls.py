"""What every model deployment shares (serve_app.serving.deployments,
structure_deployments): `@serve.batch` with its stage's default knobs, and
the calls each answers from its ModelReplica (health, readiness, stats,
close)."""

from __future__ import annotations

from typing import Any, Optional

from ray import serve

from serve_app.core.app_args import BATCH_DEFAULTS
from serve_app.serving.replica import ModelReplica


def stage_batch(stage: str, **kw):
    """`@serve.batch` with the stage's default knobs (user_config replaces them)."""
    return serve.batch(**BATCH_DEFAULTS[stage].model_dump(), **kw)


class ReplicaCalls:
    """The calls every model deployment answers, from its ModelReplica."""

    replica: ModelReplica

    async def check_health(self) -> None:
        await self.replica.check_health_async()  # warmed, and the canary (serve_app.serving.canary) passes

    def ready(self) -> bool:
        return self.replica.ready_at is not None

    def stats(self, stage: Optional[str] = None) -> dict[str, Any]:
        return self.replica.stats()  # (stage: for a replica of two stages, serve_app/serving/stages_in_one_process.py)

    def close(self) -> None:
        """Its predictor closed (a model set unloaded: serve_app/serving/set_cache.py); no call may follow."""
        deferred = getattr(self.replica, "deferred", None)
        if deferred is not None and deferred.task is not None:  # (called from a loader thread)
            deferred.task.get_loop().call_soon_threadsafe(deferred.task.cancel)
        self.replica.canary = self.replica._probe = None
        self.replica.predictor.close()
