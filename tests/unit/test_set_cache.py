"""The model-set cache of a replica (serve_app/serving/set_cache.py): the
default held from the start and never unloaded, another set loaded on its
first request (one load at a time, on a thread), a request that waits past
load_wait_s answered 503 with the load's expected remaining time, at most
further sets within memory_mb of measured PSS (the least recently used
idle ones unloaded, never one in use), at most one load that unloads
another per min_resident_s, a failed load answered 503 for retry_failed_s
while the default serves. Explicit steps: builds block on events the test
sets; a fake clock; a fake PSS that each build raises by its set's cost."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serve_app.core.errors import ModelLoading, ModelUnavailable
from serve_app.core.own_sets import SetLoading
from serve_app.serving.set_cache import SetCache

CATALOGUE = ("small", "v4", "tiny")


class Builds:
    """build/close callables whose builds wait for the test's go-ahead."""

    def __init__(self):
        self.gates: dict[str, threading.Event] = {}
        self.built: list[str] = []
        self.closed: list[str] = []
        self.fail: set[str] = set()
        self.cost = {"v4": 300.0, "tiny": 300.0}  # MB each build adds to the process's PSS
        self.pss = 1000.0

    def measure(self) -> float:
        return self.pss

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def build(self, name: str):
        self.gate(name).wait(10)
        if name in self.fail:
            raise RuntimeError(f"{name}: rec_model missing")
        self.built.append(name)
        self.pss += self.cost[name]
        return f"models of {name}"

    def close(self, obj) -> None:
        self.closed.append(obj)
        self.pss -= self.cost[obj.rsplit(" ", 1)[1]]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cache(builds: Builds, clock: Clock, **loading) -> SetCache:
    c = SetCache(CATALOGUE, builds.build, builds.close, SetLoading(**loading), clock=clock,
                 measure=builds.measure, available=lambda: 4000.0)
    c.add("small", "models of small", 5.0)
    return c


async def read(c: SetCache, name: str):
    async with c.use(name) as obj:
        return obj


def test_the_default_is_served_at_once_and_the_others_are_not_loaded():
    b, clock = Builds(), Clock()
    c = cache(b, clock)
    assert asyncio.run(read(c, "small")) == "models of small"
    assert c.states() == {"small": {"state": "loaded", "load_s": 5.0, "mb": None},
                          "v4": {"state": "not loaded", "load_s": None, "mb": None},
                          "tiny": {"state": "not loaded", "load_s": None, "mb": None}}
    assert c.budget_mb == 2000  # auto: half the 4000 MB available
    assert b.built == []


def test_a_first_request_loads_its_set_and_waits_for_it():
    b, clock = Builds(), Clock()
    c = cache(b, clock, load_wait_s=10)

    async def main():
        task = asyncio.ensure_future(read(c, "v4"))
        await asyncio.sleep(0.05)
        assert c.state("v4") == "loading"
        clock.t += 7
        b.gate("v4").set()
        return await task

    assert asyncio.run(main()) == "models of v4"
    assert c.states()["v4"] == {"state": "loaded", "load_s": 7.0, "mb": 300}
    assert b.built == ["v4"] and c.loads == 1


def test_past_load_wait_a_request_gets_503_with_the_remaining_time_and_the_load_goes_on():
    b, clock = Builds(), Clock()
    c = cache(b, clock, load_wait_s=0)

    async def main():
        with pytest.raises(ModelLoading) as e:
            await read(c, "tiny")
        assert e.value.status == 503 and "is loading" in e.value.message
        assert e.value.retry_after_s == 20  # a first load's guess, nothing elapsed
        clock.t += 15
        with pytest.raises(ModelLoading) as e:  # the retry joins the same load
            await read(c, "tiny")
        assert e.value.retry_after_s == 5
        b.gate("tiny").set()
        while c.state("tiny") != "loaded":
            await asyncio.sleep(0.01)
        return await read(c, "tiny")

    assert asyncio.run(main()) == "models of tiny"
    assert b.built == ["tiny"]  # loaded once


def test_one_load_at_a_time_another_set_meanwhile_is_told_to_come_back():
    b, clock = Builds(), Clock()
    c = cache(b, clock, load_wait_s=0, max_loaded=3)

    async def main():
        with pytest.raises(ModelLoading):
            await read(c, "tiny")
        with pytest.raises(ModelLoading) as e:
            await read(c, "v4")
        assert "another set ('tiny') is loading" in e.value.message
        assert e.value.retry_after_s == 40  # tiny's remaining 20 + its own 20
        b.gate("tiny").set()
        while c.state("tiny") != "loaded":
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert c.state("v4") == "not loaded"


def test_max_loaded_unloads_the_least_recently_used_idle_set_never_the_default_nor_one_in_use():
    b, clock = Builds(), Clock()
    for name in CATALOGUE:
        b.gate(name).set()
    c = cache(b, clock, load_wait_s=10, max_loaded=2, min_resident_s=0)

    async def main():
        assert await read(c, "v4") == "models of v4"
        assert list(c.loaded) == ["small", "v4"]
        assert await read(c, "tiny") == "models of tiny"  # v4 out: the default stays
        assert b.closed == ["models of v4"] and list(c.loaded) == ["small", "tiny"]
        async with c.use("tiny"):  # tiny in use: v4 cannot be loaded meanwhile
            with pytest.raises(ModelLoading) as e:
                await read(c, "v4")
            assert "in use" in e.value.message and e.value.retry_after_s == 5
        assert list(c.loaded) == ["small", "tiny"]
        assert await read(c, "v4") == "models of v4"  # tiny idle again: it goes
        assert b.closed == ["models of v4", "models of tiny"]

    asyncio.run(main())
    assert c.states()["small"]["state"] == "loaded" and c.unloads == 2


def test_a_failed_load_is_503_for_retry_failed_s_and_the_default_keeps_serving():
    b, clock = Builds(), Clock()
    b.fail.add("v4")
    b.gate("v4").set()
    c = cache(b, clock, load_wait_s=10, retry_failed_s=60)

    async def main():
        with pytest.raises(ModelUnavailable) as e:
            await read(c, "v4")
        assert e.value.status == 503 and e.value.retry_after_s == 60
        assert "could not be loaded" in e.value.message and "rec_model missing" not in e.value.message
        assert c.state("v4") == "failed"
        assert await read(c, "small") == "models of small"
        clock.t += 30
        with pytest.raises(ModelUnavailable) as e:  # no second try yet
            await read(c, "v4")
        assert e.value.retry_after_s == 30
        b.fail.clear()
        clock.t += 31
        return await read(c, "v4")  # tried again, and it loads

    assert asyncio.run(main()) == "models of v4"
    assert c.state("v4") == "loaded"


def test_per_stage_sets_start_on_their_first_request_and_503_past_load_wait():
    """DeploymentSets (deployments.yaml: a further set's stages scaled from zero by Serve): the
    first request starts them (a call Serve must start a replica for) and waits up to load_wait_s;
    later requests join that start; once it answered, the set is loaded; the default never waits."""
    from serve_app.serving.set_cache import DeploymentSets

    clock = Clock()
    up: dict[str, bool] = {}
    started: list[str] = []

    async def main():
        answered = asyncio.Event()

        async def probe(name: str) -> None:
            started.append(name)
            await answered.wait()

        sets = DeploymentSets(CATALOGUE, probe, lambda: dict(up), SetLoading(load_wait_s=0), clock=clock)
        await sets.wait_loaded("small")  # the default: at once, nothing started
        assert (await sets.states())["v4"]["state"] == "not loaded" and started == []
        with pytest.raises(ModelLoading) as e:
            await sets.wait_loaded("v4")
        assert e.value.retry_after_s == 20 and "is starting" in e.value.message
        assert (await sets.states())["v4"]["state"] == "loading"
        clock.t += 12
        with pytest.raises(ModelLoading) as e:
            await sets.wait_loaded("v4")
        assert e.value.retry_after_s == 8 and started == ["v4"]  # joined, not started twice
        answered.set()
        await asyncio.sleep(0.01)
        await sets.wait_loaded("v4")  # answered: loaded, no wait
        assert (await sets.states())["v4"] == {"state": "loaded", "load_s": 12.0}
        assert (await sets.states())["tiny"]["state"] == "not loaded"

    asyncio.run(main())


def test_a_per_stage_set_whose_replica_cannot_start_is_failed_and_answered_503_at_once():
    """deployments.yaml: a further set's replica fails to start (Serve's status says so, none runs).
    A request waiting for its start is answered 503 model_unavailable with Retry-After as soon as the
    status says so, not after load_wait_s; later requests at once, without a wait or another start;
    /v1/models shows it failed; the default is never held up. Once a replica runs, it is loaded."""
    from serve_app.serving.set_cache import DeploymentSets

    clock = Clock()
    up = {"v4": "stopped", "tiny": "stopped"}
    started: list[str] = []

    async def main():
        never = asyncio.Event()

        async def probe(name: str) -> None:  # a call queued at a deployment whose replica never starts
            started.append(name)
            await never.wait()

        def running() -> dict:
            clock.t += 1  # each read a second later (load_wait_s is 600: only the status can end the wait)
            return dict(up)

        sets = DeploymentSets(CATALOGUE, probe, running, SetLoading(load_wait_s=600, retry_failed_s=30), clock=clock)
        sets.poll_s = 0.01
        waiting = asyncio.ensure_future(sets.wait_loaded("v4"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and (await sets.states())["v4"]["state"] == "loading"
        up["v4"] = "failed"
        with pytest.raises(ModelUnavailable) as e:
            await asyncio.wait_for(waiting, 60)  # answered at the next status read, not after 600 s
        assert e.value.status == 503 and e.value.code == "model_unavailable" and e.value.retry_after_s == 30
        assert "could not be started" in e.value.message and "'small'" in e.value.message
        with pytest.raises(ModelUnavailable):
            await asyncio.wait_for(sets.wait_loaded("v4"), 1)  # at once
        assert (await sets.states())["v4"]["state"] == "failed" and started == ["v4"]
        await sets.wait_loaded("small")
        assert (await sets.states())["tiny"]["state"] == "not loaded"
        up["v4"] = "running"
        clock.t += 1
        await sets.wait_loaded("v4")
        assert (await sets.states())["v4"]["state"] == "loaded"

    asyncio.run(main())


def test_serves_status_of_a_sets_stages_is_read_as_running_failed_or_stopped():
    from types import SimpleNamespace as D

    from serve_app.serving.set_cache import stage_states

    up = D(status="HEALTHY", message="", replica_states={"RUNNING": 1})
    starting = D(status="UPSCALING", message="", replica_states={"STARTING": 1})
    retrying = D(status="UPSCALING", message="A replica failed to start with exception. Retrying 2 more time(s).",
                 replica_states={"STARTING": 1})
    gave_up = D(status="DEPLOY_FAILED", message="The deployment failed to start 3 times in a row.", replica_states={})
    assert stage_states([up, up]) == "running"
    assert stage_states([up, starting]) == "stopped" and stage_states([]) == "stopped"
    assert stage_states([up, retrying]) == "failed" and stage_states([gave_up, up]) == "failed"


def test_a_client_naming_the_sets_in_turn_makes_at_most_one_load_per_min_resident_s():
    """The hostile case: v4, tiny, v4, tiny ... once a second for ten minutes, the two not fitting
    memory_mb together: each request would be a load (seconds of CPU every other request shares). A
    load that must unload another starts min_resident_s after the previous load ended: meanwhile 503
    with the time left, and nothing is unloaded or loaded."""
    b, clock = Builds(), Clock()
    for name in CATALOGUE:
        b.gate(name).set()
    b.cost = {"v4": 500.0, "tiny": 500.0}
    c = cache(b, clock, load_wait_s=10, memory_mb=900, min_resident_s=120)

    async def main():
        assert await read(c, "v4") == "models of v4"
        clock.t += 30
        with pytest.raises(ModelLoading) as e:
            await read(c, "tiny")
        assert e.value.retry_after_s == 90 and "at most once per 120 s" in e.value.message
        assert "500 MB of set_loading.memory_mb 900" in e.value.message
        assert await read(c, "v4") == "models of v4"  # the loaded one serves meanwhile
        answered = 0
        for k in range(600):
            clock.t += 1
            try:
                await read(c, ("tiny", "v4")[k % 2])
                answered += 1
            except ModelLoading as e:
                assert 1 <= e.retry_after_s <= 120
        return answered

    answered = asyncio.run(main())
    assert c.loads <= 1 + (30 + 600) // 120 and c.loads == len(b.built) and answered >= 300
    assert c.held_mb() <= 900 and len(c.loaded) == 2


def test_further_sets_that_fit_memory_mb_are_loaded_at_once_each_by_its_measured_pss():
    """make serve's profile: a user asks for v4, then tiny. Both fit the budget together, so tiny is
    loaded on its first request, v4 kept, no churn wait (before the budget: max_loaded 2 held tiny
    back 120 s behind v4). A third that does not fit unloads the least recently used idle one."""
    b, clock = Builds(), Clock()
    for name in CATALOGUE:
        b.gate(name).set()
    b.cost = {"v4": 750.0, "tiny": 350.0}
    c = cache(b, clock, load_wait_s=10, memory_mb=2000, min_resident_s=120)

    async def main():
        assert await read(c, "v4") == "models of v4"
        clock.t += 1
        assert await read(c, "tiny") == "models of tiny"  # 750 held + as much again for tiny fit 2000: at once
        assert list(c.loaded) == ["small", "v4", "tiny"] and b.closed == []
        assert c.states()["v4"]["mb"] == 750 and c.states()["tiny"]["mb"] == 350 and c.held_mb() == 1100
        assert await read(c, "v4") == "models of v4" and await read(c, "small") == "models of small"

    asyncio.run(main())
    assert b.built == ["v4", "tiny"] and c.loads == 2


def test_a_set_is_judged_by_its_measured_cost_and_before_its_first_load_by_the_largest_measured():
    b, clock = Builds(), Clock()
    for name in CATALOGUE:
        b.gate(name).set()
    b.cost = {"v4": 900.0, "tiny": 200.0}
    c = cache(b, clock, load_wait_s=10, memory_mb=1000, min_resident_s=0)

    async def main():
        assert c.expected_mb("v4") == 800  # nothing measured yet: the guess
        assert await read(c, "v4") == "models of v4"
        assert c.expected_mb("tiny") == 900  # unmeasured: as large as the largest measured
        assert await read(c, "tiny") == "models of tiny"  # 900 + 900 > 1000: v4 goes first
        assert b.closed == ["models of v4"] and c.mb["tiny"] == 200 and c.expected_mb("tiny") == 200

    asyncio.run(main())


def test_a_set_larger_than_memory_mb_is_refused_naming_it_and_nothing_is_unloaded():
    b, clock = Builds(), Clock()
    b.gate("v4").set()
    c = cache(b, clock, load_wait_s=10, memory_mb=500, retry_failed_s=30)

    async def main():
        with pytest.raises(ModelUnavailable) as e:
            await read(c, "v4")  # the first-load guess, 800 MB, over 500
        assert e.value.status == 503 and e.value.retry_after_s == 30
        assert "set_loading.memory_mb" in e.value.message and "500 MB" in e.value.message
        assert await read(c, "small") == "models of small"

    asyncio.run(main())
    assert b.built == [] and b.closed == []


def test_auto_memory_mb_is_half_the_available_memory():
    from serve_app.serving.set_cache import budget_mb

    assert budget_mb(SetLoading(), lambda: 6000.0) == 3000
    assert budget_mb(SetLoading(memory_mb=1500), lambda: 6000.0) == 1500
    assert budget_mb(SetLoading(), lambda: float("nan")) == 800  # unreadable: one set's guess


def test_max_loaded_1_and_retry_failed_s_0_are_refused_with_what_to_set():
    """max_loaded 1 held the default alone (every further set refused for ever); retry_failed_s 0 made
    a failed load retry itself in a recursion. Both are refused where the config is read."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        SetLoading(max_loaded=1)
    assert "holds the default set alone" in str(e.value) and "memory_mb" in str(e.value)
    with pytest.raises(ValidationError) as e:
        SetLoading(retry_failed_s=0)
    assert "retry_failed_s" in str(e.value)
    with pytest.raises(ValidationError) as e:
        SetLoading(memory_mb=50)
    assert "memory_mb 50" in str(e.value)


def test_a_failed_load_is_answered_once_not_retried_by_the_request_that_waited():
    b, clock = Builds(), Clock()
    b.fail.add("v4")
    b.gate("v4").set()
    c = cache(b, clock, load_wait_s=10, retry_failed_s=1)

    async def main():
        with pytest.raises(ModelUnavailable) as e:
            await read(c, "v4")
        assert e.value.retry_after_s == 1

    asyncio.run(main())
    assert c.state("v4") == "failed" and c.loads == 0 and b.built == []


def test_the_per_stage_sets_read_serves_status_at_most_once_a_second_and_never_for_the_default_alone():
    """Serve's status (a call to its controller) is read at most once a second, whoever asks (requests,
    /readyz's probes, the stats page); a catalogue of the default set alone never reads it."""
    from serve_app.serving.set_cache import DeploymentSets

    clock = Clock()
    up = {"v4": "stopped"}
    reads = []

    def running() -> dict:
        reads.append(clock.t)
        return dict(up)

    async def main():
        sets = DeploymentSets(CATALOGUE, lambda name: asyncio.sleep(0), running, clock=clock)
        assert await sets.refresh() == {"v4": "stopped"}
        up["v4"] = "running"
        clock.t += 0.5
        assert await sets.refresh() == {"v4": "stopped"} and not sets.loaded("v4")  # within the second: as read
        clock.t += 0.5
        assert await sets.refresh() == {"v4": "running"} and sets.loaded("v4")
        assert reads == [1000.0, 1001.0]

        def unread() -> dict:
            raise AssertionError("a catalogue of the default alone has no status to read")

        alone = DeploymentSets(CATALOGUE[:1], lambda name: asyncio.sleep(0), unread, clock=clock)
        assert await alone.refresh() == {} and alone.loaded(CATALOGUE[0])

    asyncio.run(main())


def test_the_one_process_profile_refuses_more_than_one_replica_naming_the_per_stage_profile():
    """Each replica of the light profile's OcrPipeline would load its own copies of the sets, and a
    request for a set could reach a replica without it: refused where the replica starts."""
    from serve_app.core.errors import ConfigError
    from serve_app.serving.set_cache import one_replica

    one_replica(1, None)
    one_replica(None, None)  # outside Serve
    one_replica(1, 1)
    for n, most in ((2, None), (1, 3)):
        with pytest.raises(ConfigError) as e:
            one_replica(n, most)
        assert "deployments.yaml" in e.value.message and "num_replicas: 1" in e.value.message


def test_a_running_callable_may_answer_true_or_false_as_well():
    """Other on-demand users of the seam (a stage pair of their own) may say only up or not."""
    from serve_app.serving.set_cache import DeploymentSets

    async def main():
        sets = DeploymentSets(CATALOGUE, lambda name: asyncio.sleep(0), lambda: {"v4": True, "tiny": False})
        assert await sets.refresh() == {"v4": "running", "tiny": "stopped"}
        assert sets.loaded("v4") and not sets.loaded("tiny") and not sets.failed("tiny")

    asyncio.run(main())
