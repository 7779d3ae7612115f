"""The layout detector's conversion rewrite (serve_app.tools.legacy_rewrite.clip_constants):
x2paddle's clip with [1]-shaped constant tensors as bounds, which oneDNN and OpenVINO
answered NaN for, gets the numbers themselves; a clip whose bounds are not such
constants is left as it is."""

import pytest

from serve_app.tools.legacy_rewrite import clip_constants

pytestmark = pytest.mark.unit

CODE = """
        c_lo = paddle.full(dtype='float32', shape=[1], fill_value=0.0)
        c_hi = paddle.full(dtype='float32', shape=[1], fill_value=6.0)
        y = paddle.clip(x=a, min=c_lo, max=c_hi)
        z = paddle.clip(x=b, min=other, max=c_hi)
"""


def test_constant_bounds_become_numbers_and_others_stay():
    code, n = clip_constants(CODE)
    assert n == 1
    assert "y = paddle.clip(x=a, min=0.0, max=6.0)" in code
    assert "z = paddle.clip(x=b, min=other, max=c_hi)" in code
