"""`InFlightBook`: what the `Scheduler` must keep while work it scheduled is not done yet.
Plain Python; the `Scheduler` (worker/sched/scheduler.py) extends it.

Owns: per request, the scheduled steps not yet collected (`_busy`), the blocks of ended
requests that such a step may still write (`_deferred`, freed by `settle` once the last one is
collected), the requests whose next collected token is dropped (`_rewind`), and the host-tier
loads in flight (`loads`, worker/sched/host_loads.py) with the runner's two hooks: `loads_landed(ids)` ->
the ids that finished (never blocks) and `wait_load(id)` (blocks until one did). A request
waiting for a load counts as busy, so the same deferral covers a load that still writes.

Steps in flight (async scheduling, worker/engine/inflight.py): `schedule` advances
`num_computed_tokens` and counts the token a sampled row will produce as pending
(`Request.num_pending`); `update` later appends the real id. A request whose last token is
pending is scheduled as a one-token decode row marked `pending_input` (its input id is filled
on the device from the previous step's draw), unless that token surely ends it (max_tokens,
max_model_len). While another step is uncollected, `schedule(can_preempt=False)` never
preempts: it stops at the first request that needs blocks it cannot get and sets `blocked`, and
the engine settles before the next schedule. A request that ends while a step that computes it
is uncollected keeps its blocks until that step's `update` (the device may still write them).
Pipeline micro-batches (`schedule(group=n)`, worker/sched/microbatch.py): at most n sequences, none
with an uncollected step, so the groups in flight are disjoint; with async scheduling the
engine names the requests of the oldest step in flight (`pending_on`), whose draw it has
queued, and those may be scheduled once more as `pending_input` rows (the group's next step).
`rewind(id)`: the request's pending input in the uncollected step was wrong (the sampler redid
the previous token): that step's `update` drops its token and takes back the position it
computed (`num_computed_tokens`), so the next schedule recomputes it with the right id; the
engine schedules nothing before that update. No block holding that position is registered.

The attributes the methods read from the scheduler: `allocator`, `host`, `requests`.
To extend (another kind of work in flight): count it in `_busy` and settle it like a step.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from infer_cluster.worker.sched.host_loads import Loads
from infer_cluster.worker.sched.request import Request


def _all_landed(load_ids: list[int]) -> list[int]:
    return load_ids  # no runner with a copy stream (CPU, tests): copies are done when issued


def _no_wait(load_id: int) -> None:
    return None


class InFlightBook:
    def _init_in_flight(self, loads_landed: Optional[Callable[[list[int]], Iterable[int]]],
                        wait_load: Optional[Callable[[int], None]]) -> None:
        self.loads_landed = loads_landed or _all_landed
        self.wait_load = wait_load or _no_wait
        self.loads = Loads()  # host-tier loads in flight
        self._busy: dict[str, int] = {}  # request id -> scheduled steps not yet collected
        self._deferred: dict[str, list[int]] = {}  # blocks of ended requests a busy step may write
        self._rewind: set[str] = set()  # requests whose next collected token is dropped (`rewind`)

    # -- steps in flight ------------------------------------------------------------------------

    def settle(self, request_id: str) -> None:
        """One scheduled step of the request was collected (or abandoned); blocks of an ended
        request are freed once no uncollected step computes it."""
        left = self._busy.get(request_id, 0) - 1
        if left > 0:
            self._busy[request_id] = left
            return
        self._busy.pop(request_id, None)
        blocks = self._deferred.pop(request_id, None)
        if blocks:
            self.allocator.free(blocks)

    def rewind(self, request_id: str) -> None:
        """The uncollected step that computes the request used a wrong pending input: its
        `update` drops the request's token and position (see the module docstring)."""
        if request_id in self.requests and self._busy.get(request_id):
            self._rewind.add(request_id)

    def settle_all(self) -> None:
        """Every uncollected step is gone (a failure): forget the loads in flight and free every
        deferred block."""
        self._rewind.clear()
        self.loads.clear()
        if self.host is not None:
            self.host.land_all()
        for rid in list(self._busy):
            self._busy[rid] = 1
            self.settle(rid)

    # -- loads (host-tier swap-ins in flight) ---------------------------------------------------

    @property
    def has_loads(self) -> bool:
        return bool(self.loads)

    def land_all_loads(self) -> None:
        """Block until every load in flight landed (before a resize, or a preemption of a
        request that waits for one)."""
        for load in list(self.loads.members):
            self.wait_load(load)
        self._land(list(self.loads.members))

    def _poll_loads(self) -> None:
        if self.loads:
            self._land(self.loads_landed(list(self.loads.members)))

    def _land(self, landed) -> None:
        for load, members in self.loads.land(landed):
            if self.host is not None:
                self.host.land(load)
            for rid in members:
                self.settle(rid)

    def _wait_for(self, req: Request, loads: set[int]) -> None:
        """`req` computes only once every load in `loads` landed; until then it counts as busy
        (an end meanwhile defers freeing its blocks, which a load may still write)."""
        self.loads.wait(req.request_id, loads)
        self._busy[req.request_id] = self._busy.get(req.request_id, 0) + len(loads)
