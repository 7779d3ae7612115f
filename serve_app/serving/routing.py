"""The recogniser's request router (Ray Serve's public request-router API,
`ray.serve.request_router`): the parts of one fanned-out page go to distinct
replicas; every other call is routed as Serve's default router does (two
random replicas, the shorter queue wins, same-node replicas first).

Why: Serve's default router fills its pending requests in FIFO order from
whichever replica a routing task picked, and two parts sent together see the
same cached queue lengths, so both halves of a dense page landed on one
replica about half the time (the fan_out benchmark, deleted once it had decided this; commit 4adefb1 has it). Each recogniser call
carries a routing tag as its multiplexed model id (serve_app/flow/pipeline.py,
route_tag): `part:{offset}:{k}` for part k of a page, `whole` otherwise.
Part k prefers the replica at (offset + k) mod n of the replicas in a fixed
order, so the parts of one page are on distinct replicas whenever there are
as many replicas as parts, and the random offset spreads pages evenly. The
preferred replica is only the first rank: when its queue is full the others
are tried. FIFOMixin hands a chosen replica to the oldest pending call with
the same tag, so a routing decision made for a part serves that part (the
base router's exact matching cannot be used: calls made while a replica
serves one request share that request's internal id).

MultiplexMixin is here for its matching by tag, not its routing (which
choose_replicas does not call): Serve indexes every pending call by its
multiplexed model id and removes the done ones only in that mixin's lookup,
so a router without it keeps every tagged call (its crops included) in the
caller's memory for good. That leak was seen in the soak (the OcrPipeline
replica +15% in 90 s) before the mixin was added.

Loaded by Serve in each process that holds a handle to the recogniser, from
deployments.yaml (`request_router_config.request_router_class`)."""

from __future__ import annotations

import random
from typing import List, Optional

from ray.serve.request_router import (
    FIFOMixin, LocalityMixin, MultiplexMixin, PendingRequest, RequestRouter, RunningReplica,
)

from serve_app.flow.fan_out import parse_route_tag, preferred_replica


class PartSpreadingRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        part = parse_route_tag(pending_request.metadata.multiplexed_model_id) if pending_request else None
        if part is not None and len(candidate_replicas) > 1:
            ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
            first = ordered[preferred_replica(len(ordered), *part)]
            return [[first], [r for r in ordered if r is not first]]
        ids = list(self.apply_locality_routing(pending_request=pending_request))
        replicas = self.curr_replicas
        chosen = [replicas[i] for i in random.sample(ids, min(2, len(ids))) if i in replicas]
        return [chosen] if chosen else []
