"""Who submitted a job, for its share of the result store
(serve_app.jobs.results): the bearer token it presented, else its address.
A token is kept only as a short hash (the store never holds a secret). No
Ray import."""

from __future__ import annotations

import hashlib
from typing import Any, Optional


def client_of(authorization: Optional[str], address: Optional[str]) -> str:
    """`token:<hash>` for an `Authorization: Bearer ...` header, else
    `addr:<host>`; `addr:?` when neither is known (a handle call)."""
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return "token:" + hashlib.sha256(token.strip().encode()).hexdigest()[:16]
    return f"addr:{address}" if address else "addr:?"


def client_of_request(request: Any) -> str:
    """client_of for a Starlette request."""
    peer = getattr(request, "client", None)
    return client_of(request.headers.get("authorization"), getattr(peer, "host", None))
