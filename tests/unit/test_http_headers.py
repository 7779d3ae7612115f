"""The request headers the ingress reads (serve_app.http.headers): deadline,
idempotency key, bearer token. No Ray."""

from __future__ import annotations

import pytest

from serve_app.core.errors import BadRequest
from serve_app.http.headers import bearer_matches, deadline_s, idempotency_key
from serve_app.core.app_args import IngressArgs

ARGS = IngressArgs(default_timeout_s=120, max_timeout_s=600)


def test_the_deadline_is_the_header_or_the_default():
    assert deadline_s({}, ARGS) == 120
    assert deadline_s({"x-request-timeout": "0.05"}, ARGS) == 0.05
    assert deadline_s({"x-request-timeout": "600"}, ARGS) == 600


@pytest.mark.parametrize("raw,needle", [("soon", "must be a number of seconds, got 'soon'"),
                                        ("0", "must be in (0, 600.0]"), ("-1", "must be in (0, 600.0]"),
                                        ("601", "must be in (0, 600.0]"), ("nan", "must be in"), ("inf", "must be in")])
def test_a_bad_deadline_is_400(raw, needle):
    with pytest.raises(BadRequest) as e:
        deadline_s({"x-request-timeout": raw}, ARGS)
    assert needle in e.value.message


def test_idempotency_key():
    assert idempotency_key({}) is None
    assert idempotency_key({"idempotency-key": "abc-1"}) == "abc-1"
    for bad in ("", "k" * 201):
        with pytest.raises(BadRequest, match="Idempotency-Key must be 1 to 200 characters"):
            idempotency_key({"idempotency-key": bad})


@pytest.mark.parametrize("header,ok", [
    ("Bearer tok", True), ("bearer tok", True), ("Bearer  tok ", True),
    (None, False), ("", False), ("tok", False), ("Bearer wrong", False), ("Basic tok", False), ("Bearer", False),
])
def test_bearer_token(header, ok):
    assert bearer_matches(header, b"tok") is ok
