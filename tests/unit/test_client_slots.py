"""The ingress's in-flight slots by client (serve_app.http.policies.slots):
a client alone holds all but one slot, so another client arriving is taken
at once; once another is about, each is held to its fair share; a refused
request takes nothing; the handle API (no client) is not counted."""

from __future__ import annotations

import pytest

from serve_app.core.app_args import AdmissionArgs
from serve_app.core.errors import Overloaded
from serve_app.http.policies.admission import Admission
from serve_app.http.policies.slots import ClientSlots


def setup(max_in_flight=8):
    now = [1000.0]  # the admission's clock, stepped by the test
    return ClientSlots(retry_after_s=1), Admission(AdmissionArgs(client_window_s=10.0), clock=lambda: now[0],
                                                   max_requests=max_in_flight), now


def fill(slots, admission, client) -> tuple[int, Overloaded]:
    n = 0
    while True:
        try:
            slots.take(client, admission)
        except Overloaded as e:
            return n, e
        n += 1


def test_a_client_alone_keeps_one_slot_free_for_the_next_and_then_gets_its_fair_share():
    slots, adm, now = setup(8)
    n, refusal = fill(slots, adm, "addr:10.0.0.1")
    assert n == 7 and "one is kept for another client" in str(refusal) and refusal.retry_after_s == 1
    assert slots.take("addr:10.0.0.2", adm) == "addr:10.0.0.2"  # the newcomer is taken at once
    # a's requests end one by one; while b is about, a is held to half of the 8
    for _ in range(3):
        slots.give("addr:10.0.0.1")
    with pytest.raises(Overloaded, match="fair share while other clients are served"):
        slots.take("addr:10.0.0.1", adm)
    assert slots.held == {"addr:10.0.0.1": 4, "addr:10.0.0.2": 1}  # the refusal took nothing
    slots.give("addr:10.0.0.1")
    slots.take("addr:10.0.0.1", adm)
    # b leaves and is not seen again for the client window: a alone again, all but one
    slots.give("addr:10.0.0.2")
    now[0] += 11
    assert fill(slots, adm, "addr:10.0.0.1")[0] == 3 and slots.held == {"addr:10.0.0.1": 7}
    assert adm.refused["client_share"] == 3


def test_requests_naming_no_client_are_not_counted_and_a_single_slot_is_usable():
    slots, adm, _ = setup(1)
    assert slots.take(None, adm) is None and slots.held == {}
    assert slots.take("addr:10.0.0.1", adm) == "addr:10.0.0.1"  # one slot in all: a client may hold it
    slots.give("addr:10.0.0.1")
    slots.give(None)
    assert slots.held == {}
