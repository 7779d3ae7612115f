"""Fan-out: one image's crops read by several recogniser replicas at once
(dealt in width order, answers merged back in order), and the routing tag
that tells the recogniser's request router (serve_app/serving/routing.py)
which part of which page a call is, so that a page's parts go to distinct
replicas. Used by the pipeline (serve_app/flow/pipeline.py). No Ray import."""

from __future__ import annotations

import asyncio
import random
from typing import Awaitable, Callable, Optional

import numpy as np

from serve_app.core.request_context import RequestContext
from serve_app.core.results import Recognition
from serve_app.flow.pipeline import Recognize


# -- fan-out: one image's crops read by several recogniser replicas ----------


def fan_out_parts(n_crops: int, fan_out: int, min_items: int) -> int:
    """How many calls an image of n_crops is read in: 1 below min_items,
    else up to fan_out, each with at least about min_items / 2 crops."""
    if n_crops < min_items:
        return 1
    return max(1, min(fan_out, n_crops // max(1, min_items // 2)))


def deal_by_width(crops: list[np.ndarray], parts: int) -> list[list[int]]:
    """Crop indices dealt out in aspect-ratio order, so each part costs
    about the same and holds crops of every width bucket."""
    order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
    return [order[k::parts] for k in range(parts)]


def merge_shares(shares: list[list[int]], answers: list[list], n: int) -> list:
    """The parts' answers back in the crops' order."""
    out: list = [None] * n
    for idx, part in zip(shares, answers):
        if len(part) != len(idx):
            raise RuntimeError(f"a recogniser answered {len(part)} readings for {len(idx)} crops")
        for i, r in zip(idx, part):
            out[i] = r
    return out


# A fanned-out page's parts start at a random offset below this (few distinct
# routing tags: Serve's routers keep a set of the tags they have seen).
PART_OFFSETS = 60


def route_tag(part: Optional[tuple[int, int]]) -> str:
    """The routing tag a recogniser call carries (as its multiplexed model id,
    read by serve_app/serving/routing.py): `part:{offset}:{k}` for part k of a
    fanned-out page, `whole` for any other call. Every call carries one so
    that Serve's FIFO matching pairs a routing decision with a call of the
    same tag only (a whole image never takes a part's replica)."""
    return "whole" if part is None else f"part:{part[0]}:{part[1]}"


def parse_route_tag(tag: str) -> Optional[tuple[int, int]]:
    """(offset, k) of a part's tag; None for anything else."""
    kind, _, rest = (tag or "").partition(":")
    offset, _, k = rest.partition(":")
    if kind != "part" or not offset.isdigit() or not k.isdigit():
        return None
    return int(offset), int(k)


def preferred_replica(n_replicas: int, offset: int, k: int) -> int:
    """Which of n replicas (in a fixed order) part k of a page whose parts
    start at `offset` prefers: distinct for up to n parts of one page, and
    with a random offset per page each replica is first for as many parts."""
    return (offset + k) % n_replicas


def fanned_out(recognize: Callable[..., Awaitable[list[Recognition]]], fan_out: int, min_items: int,
               tag_parts: bool = False) -> Recognize:
    """`recognize`, but a text-dense image is sent as up to `fan_out` calls
    at once (spread over replicas). With tag_parts each call also gets
    `part=(offset, k)`, a routing hint (serve_app/serving/routing.py) that puts the
    parts of one page on distinct replicas. Answers are the same either
    way: crops are batched by width bucket wherever they are read."""

    async def call(crops: list[np.ndarray], ctx: Optional[RequestContext] = None) -> list[Recognition]:
        parts = fan_out_parts(len(crops), fan_out, min_items)
        if parts <= 1:
            return await recognize(crops, ctx=ctx)
        shares = deal_by_width(crops, parts)
        offset = random.randrange(PART_OFFSETS)
        answers = await asyncio.gather(*(
            recognize([crops[i] for i in idx], ctx=ctx, **({"part": (offset, k)} if tag_parts else {}))
            for k, idx in enumerate(shares)))
        return merge_shares(shares, list(answers), len(crops))

    return call
