"""The bounded pool that writes answers as text/hOCR/ALTO
(serve_app.flow.render_pool): off the loop and, as the service runs it, in
a child process (the loop's GIL and memory are not the render's), a stored
result's bytes parsed there, at most workers + max_waiting at once (then
503), a slot held until its render ends even when its request has left.
No Ray."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

from serve_app.core.errors import Overloaded
from serve_app.flow import render_pool
from serve_app.flow.render_pool import RenderPool

BODY = {"request_id": "r", "image": {"width": 100, "height": 40},
        "results": [{"text": "HELLO", "score": 0.99, "box": [[0, 0], [90, 0], [90, 30], [0, 30]]}]}


def test_a_result_dict_or_its_stored_bytes_render_the_same_off_the_loop():
    async def go():
        pool = RenderPool(renderer=render_pool.render_here)
        loop_thread = threading.get_ident()
        seen = []
        real = render_pool.render

        def where(body, fmt):
            seen.append(threading.get_ident())
            return real(body, fmt)

        render_pool.render = where
        try:
            a = await pool.render(BODY, "hocr")
            b = await pool.render(json.dumps(BODY).encode(), "hocr")
        finally:
            render_pool.render = real
            pool.close()
        return a, b, seen, loop_thread

    a, b, seen, loop_thread = asyncio.run(go())
    from serve_app.flow.formats import MEDIA_TYPES

    assert a == b and a[1] == MEDIA_TYPES["hocr"] and b">HELLO</span>" in a[0]
    assert seen and all(t != loop_thread for t in seen)


def test_the_service_renders_in_a_child_process_the_same_bytes_and_a_bad_format_is_a_400():
    """The default renderer: a child (serve_app.flow.render_child) started
    when first needed, reused, and its answer what this process writes."""
    from serve_app.core.errors import BadRequest

    async def go():
        pool = RenderPool()
        try:
            got = [await pool.render(BODY, fmt) for fmt in ("hocr", "alto", "text")]
            children = [c.proc.pid for c in pool.renderer._all]
            with pytest.raises(BadRequest):
                await pool.render(BODY, "pdf")
            again = await pool.render(json.dumps(BODY).encode(), "text")
            same = [c.proc.pid for c in pool.renderer._all]
        finally:
            pool.close()
        return got, children, again, same

    got, children, again, same = asyncio.run(go())
    assert [g for g in got] == [render_pool.render_here(BODY, f) for f in ("hocr", "alto", "text")]
    assert len(children) == 1 and children[0] != os.getpid() and same == children  # one child, kept
    assert again == got[2] and again[0].strip() == b"HELLO"


def test_past_workers_and_waiting_a_render_is_a_503_and_a_left_request_keeps_its_slot():
    async def go():
        pool = RenderPool(workers=1, max_waiting=1, renderer=render_pool.render_here)
        gate = threading.Event()
        real = render_pool.render

        def slow(body, fmt):
            gate.wait(30)
            return real(body, fmt)

        render_pool.render = slow
        try:
            first = asyncio.ensure_future(pool.render(BODY, "text"))
            second = asyncio.ensure_future(pool.render(BODY, "text"))
            await asyncio.sleep(0)
            with pytest.raises(Overloaded) as full:
                await pool.render(BODY, "text")
            second.cancel()  # its client left: the render is still queued, its slot still held
            await asyncio.gather(second, return_exceptions=True)
            with pytest.raises(Overloaded):
                await pool.render(BODY, "text")
            gate.set()
            text = await first
            while pool.held:  # the left one's render ends too (an explicit step, not a race)
                await asyncio.sleep(0.005)
            after = await pool.render(BODY, "text")
        finally:
            render_pool.render = real
            pool.close()
        return full.value, text, after

    full, text, after = asyncio.run(go())
    assert full.status == 503 and full.retry_after_s == 5 and "format=json" in full.message
    assert text[0].strip() == b"HELLO" and after == text


def test_large_result_reads_are_gated_and_small_ones_pass():
    async def go():
        pool = RenderPool(large_bytes=1000, max_large_reads=1, renderer=render_pool.render_here)
        async with pool.reading(10_000):
            async with pool.reading(10):  # small: not counted
                pass
            with pytest.raises(Overloaded):
                async with pool.reading(5000):
                    pass
        async with pool.reading(5000):  # released
            pass
        pool.close()

    asyncio.run(go())
