"""The render child (`python -m serve_app.flow.render_child`, started and fed
by serve_app/flow/render_pool.py): text, hOCR and ALTO written from a
result's JSON bytes in a process of its own, so that a long document's
seconds of pure-Python XML building hold neither the serving process's
GIL (its event loop answers /healthz meanwhile) nor its memory (the
element tree of a 60-page hOCR is hundreds of MB, given back when the
child has written it).

One framed request at a time (serve_app.flow.pdf_worker's frames): the
header {"fmt"}, the payload the result's JSON bytes; the answer
{"media_type"} and the document's UTF-8 bytes, or {"error": "bad_request"
| "internal", "message"}. Nothing is unpickled either way. Dies with its
parent. No Ray import."""

from __future__ import annotations

import json
import os
import sys

from serve_app.flow.pdf_worker import _read_frame_blocking, _write_frame


def handle(req: dict, payload: bytes) -> tuple[dict, bytes]:
    from serve_app.core.errors import OcrError
    from serve_app.flow.formats import render

    try:
        text, media = render(json.loads(payload), str(req.get("fmt")))
    except OcrError as e:
        return {"error": "bad_request", "message": e.message}, b""
    except MemoryError:
        return {"error": "internal", "message": "out of memory writing the answer"}, b""
    except Exception as e:  # a stored result that is not a result body
        return {"error": "internal", "message": f"{type(e).__name__}: {e}"}, b""
    return {"media_type": media}, text.encode()


def main() -> None:
    from serve_app.flow.pdf_child import _die_with_parent

    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return
    out = os.fdopen(os.dup(1), "wb")  # the protocol owns the real stdout; anything printed goes to stderr
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb")
    try:
        os.nice(10)  # the serving processes' loops (and /healthz) first; a render takes the CPU left over
    except OSError:
        pass
    import serve_app.flow.formats  # noqa: F401  (imported once, before the first request is timed)

    _write_frame(out, {"ready": True})
    while True:
        try:
            req, payload = _read_frame_blocking(inp)
        except EOFError:
            return
        header, body = handle(req, payload)
        del payload
        _write_frame(out, header, body)
        del body


if __name__ == "__main__":
    main()
    sys.exit(0)
