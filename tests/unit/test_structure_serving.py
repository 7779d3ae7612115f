"""The structure models' on-demand start (serve_app/serving/structure_start.py):
per-stage, the LayoutDetector and TableRecognizer deployments are started by
the first stage call that needs them (DeploymentSets, as a further model
set's), joined by the others, a 503 with Retry-After past load_wait_s that
names structure; in-process (the light profile) built once on the first
call; a read without structure starts nothing. No Ray: stand-in handles,
explicit steps and a fake clock."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from harness.front import Method
from serve_app.core.errors import ModelLoading
from serve_app.core.own_sets import SetLoading
from serve_app.core.request_context import RequestContext
from serve_app.flow.pipeline import Stages
from serve_app.serving.structure_start import StructureInProcess, StructureStarter


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def _none(*_a, **_k):
    return None


PLAIN = Stages(detect=_none, classify=None, recognize=_none)
CTX = RequestContext("r", None, "interactive")


def stand_in(answered: asyncio.Event, started: list, calls: list):
    async def ready():
        started.append(1)
        await answered.wait()
        return True

    def stage(name):
        async def run(item, deadline, lane):
            calls.append((name, item.shape))
            return [name]
        return run

    def handle(name):
        return types.SimpleNamespace(ready=Method(ready), options=lambda **_: handle(name), deployment_name=name,
                                     **{name: Method(stage(name))})
    return handle("layout"), handle("table")


def test_the_first_structure_call_starts_both_models_and_others_join_it():
    clock, started, calls = Clock(), [], []

    async def main():
        answered = asyncio.Event()
        layout, table = stand_in(answered, started, calls)
        starter = StructureStarter(layout, table, SetLoading(load_wait_s=0), running=lambda: {"structure": False})
        starter.sets._clock = clock
        stages = starter.stages(PLAIN)
        assert stages.detect is PLAIN.detect and starter.handles() == {}  # nothing started by being built
        page = np.zeros((8, 8, 3), np.uint8)
        with pytest.raises(ModelLoading) as e:
            await stages.layout(page, ctx=CTX)
        assert "document structure models are starting" in e.value.message and e.value.retry_after_s == 20
        clock.t += 5
        with pytest.raises(ModelLoading) as e:
            await stages.table(page, ctx=CTX)
        assert e.value.retry_after_s == 15 and len(started) == 2  # joined: both models started once
        answered.set()
        await asyncio.sleep(0.01)
        assert await stages.layout(page, ctx=CTX) == ["layout"]
        assert await stages.table(page, ctx=CTX) == ["table"]
        assert calls == [("layout", (8, 8, 3)), ("table", (8, 8, 3))] and set(starter.handles()) == {"layout", "table"}

    asyncio.run(main())


def test_in_process_the_models_are_built_once_on_the_first_call_that_asks():
    built = []

    class Part:
        def __init__(self, name):
            self.name = name

        async def layout(self, page, deadline, lane):
            return ["regions"]

        async def table(self, crop, deadline, lane):
            return "structure"

        def close(self):
            pass

    def build():
        built.append(1)
        return Part("layout"), Part("table")

    async def main():
        here = StructureInProcess(build, SetLoading(load_wait_s=5))
        stages = here.stages(PLAIN)
        assert here.loaded() is None and built == []
        page = np.zeros((4, 4, 3), np.uint8)
        got = await asyncio.gather(stages.layout(page, ctx=CTX), stages.table(page, ctx=CTX))
        assert got == [["regions"], "structure"] and built == [1]
        assert await stages.layout(page, ctx=CTX) == ["regions"] and built == [1]
        assert here.loaded() is not None

    asyncio.run(main())
