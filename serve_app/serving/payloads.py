"""Stage payloads too big for a gRPC message go by reference.

Under Ray Serve's throughput-optimized mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1,
which turns on RAY_SERVE_USE_GRPC_BY_DEFAULT) a handle call between
deployments is one gRPC message with a 4 MiB limit
(RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH): a decoded image over it (the
1600x1200 receipt of the peer set is 5.76 MB; any phone photo) failed with
RESOURCE_EXHAUSTED, a 500. Ray Serve's own way around it is the handle option
`_by_reference=True` (ray/serve/handle.py: the call goes as a Ray actor call,
its arguments through the object store, as in the default mode). So a stage
call whose arrays pass BY_REFERENCE_BYTES is sent by reference; smaller ones
keep the gRPC path. In the default mode every call is by reference already
and nothing changes. No Ray import: the handle is passed in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# Well under the 4 MiB message: room for pickling and the other arguments.
BY_REFERENCE_BYTES = 1 << 20


def payload_bytes(x: Any) -> int:
    """Bytes of the arrays (and raw bytes) in a stage call's argument."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return len(x)
    if isinstance(x, (list, tuple)):
        return sum(payload_bytes(i) for i in x)
    return 0


def sized(handle: Any, payload: Any, limit: int = BY_REFERENCE_BYTES) -> Any:
    """The handle to call with `payload`: by reference when it is big."""
    if payload_bytes(payload) > limit:
        return handle.options(_by_reference=True)
    return handle


async def arrived(upload: Any) -> Any:
    """An Upload (serve_app.flow.upload) whose bytes came as an object
    reference (the ingress puts a large body into the object store off its
    event loop: Front.handle_upload), with its bytes; anything else as it is."""
    from ray import ObjectRef

    data = getattr(upload, "data", None)
    if not isinstance(data, ObjectRef):
        return upload
    return dataclasses.replace(upload, data=await data)
