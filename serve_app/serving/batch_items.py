"""What a model deployment's batch queue holds: an item with its request's
deadline (and lane), and the object whose predictor runs it; and the rule
that runs each item on that object (per_owner)."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any, Optional

from serve_app.core.errors import DeadlineExceeded
from serve_app.core.lanes import INTERACTIVE
from serve_app.serving.replica import Crops


@dataclass(frozen=True)
class Timed:
    """A batched item and its request's deadline (time.time(); None: none).
    `owner`: the replica object whose predictor runs it (see per_owner)."""

    item: Any
    deadline: Optional[float] = None
    owner: Any = field(default=None, compare=False, repr=False)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline


@dataclass(frozen=True)
class TimedCrops(Crops):
    deadline: Optional[float] = None
    lane: str = INTERACTIVE
    owner: Any = field(default=None, compare=False, repr=False)
    client: Optional[str] = None  # whose turn its crops take (serve_app.serving.crop_scheduler)


def per_owner(body):
    """A batch method's body run per owner: Serve keeps one batch queue per
    decorated method and process, not per object, and runs a batch on its
    first item's object. Several objects of one class in one process (each
    model set's detector and recogniser beside the pipeline:
    serve_app/serving/stages_in_one_process.py) would otherwise have one
    set's items run on another set's predictor; each item names its owner
    (the object whose method queued it) and each owner runs its own."""

    @functools.wraps(body)
    async def run(self, items: list) -> list:
        owners = [getattr(i, "owner", None) or self for i in items]
        if all(o is self for o in owners):
            return await body(self, items)
        groups: dict[int, tuple[Any, list[int]]] = {}
        for k, o in enumerate(owners):
            groups.setdefault(id(o), (o, []))[1].append(k)
        answers = await asyncio.gather(*(body(o, [items[k] for k in ks]) for o, ks in groups.values()))
        out: list = [None] * len(items)
        for (_, ks), got in zip(groups.values(), answers):
            for k, g in zip(ks, got):
                out[k] = g
        return out

    return run


def _expired(where: str) -> DeadlineExceeded:
    return DeadlineExceeded(f"the request's deadline passed while it waited for the {where}; it was not run")
