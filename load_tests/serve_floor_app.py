"""A Serve application with no model and no imports of ours: one replica
that answers every path (GET /readyz included) with 200. What `serve run`
costs before any of the OCR service's own work (load_tests/serve_phases.py)."""

from __future__ import annotations

from ray import serve
from starlette.responses import PlainTextResponse


@serve.deployment(ray_actor_options={"num_cpus": 0.05})
class Floor:
    async def __call__(self, request):
        return PlainTextResponse("ok")


def build(args: dict):
    """Serve's app builder; the args (footprint's temporary paths) are not used."""
    return Floor.bind()
