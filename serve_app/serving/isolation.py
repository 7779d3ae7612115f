"""One way to keep a bad input from failing its neighbours in a batch.

Used by every model deployment and by the recogniser's crop scheduler. No Ray
import: unit-tested with plain functions."""

from __future__ import annotations

from typing import Awaitable, Callable, Optional, Sequence, Union


async def run_isolated(
    run: Callable[[list], Awaitable[list]],
    groups: Sequence[Sequence],
    on_error: Optional[Callable[[BaseException], None]] = None,
) -> list[Union[list, Exception]]:
    """`run` over the items of every group at once, one result per item;
    each group gets its slice back. If that batch fails, each group runs
    alone, and a group that still fails gets its exception in its slot
    (the others their results), so one caller's bad input fails that caller
    only. `on_error` is told of each group that failed alone."""
    flat = [x for g in groups for x in g]
    try:
        results = await run(flat) if flat else []
    except Exception:
        out: list = []
        for g in groups:
            try:
                out.append(list(await run(list(g))) if g else [])
            except Exception as e:
                if on_error is not None:
                    on_error(e)
                out.append(e)
        return out
    out, i = [], 0
    for g in groups:
        out.append(list(results[i : i + len(g)]))
        i += len(g)
    return out
