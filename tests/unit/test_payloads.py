"""#29 item 6: under RAY_SERVE_THROUGHPUT_OPTIMIZED=1 a stage call is one
gRPC message of at most 4 MiB; arrays over 1 MiB go by reference instead
(handle.options(_by_reference=True)). The handle is stood in: it records the
options it was asked for."""

from __future__ import annotations

import numpy as np

from serve_app.serving.payloads import BY_REFERENCE_BYTES, payload_bytes, sized


class Handle:
    def __init__(self, opts=None):
        self.opts = opts or {}

    def options(self, **kw):
        return Handle({**self.opts, **kw})


def test_the_peer_receipt_goes_by_reference_and_a_word_does_not():
    receipt = np.zeros((1200, 1600, 3), np.uint8)  # 5.76 MB decoded: the 500 of the issue
    assert payload_bytes(receipt) == 5_760_000 > 4 * 1024 * 1024
    assert sized(Handle(), receipt).opts == {"_by_reference": True}
    word = np.zeros((48, 320, 3), np.uint8)
    h = Handle()
    assert sized(h, word) is h  # small calls keep the gRPC path


def test_crops_count_together():
    crops = [np.zeros((48, 640, 3), np.uint8)] * 12  # 1.1 MB of crops in one call
    assert payload_bytes(crops) == 12 * 48 * 640 * 3 > BY_REFERENCE_BYTES
    assert sized(Handle(), crops).opts == {"_by_reference": True}
    assert sized(Handle(), crops[:3]).opts == {}
    assert payload_bytes(b"x" * 10) == 10 and payload_bytes({"a": 1}) == 0
