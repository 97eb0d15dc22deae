"""`LoadTracker`: which host-tier swap-ins ("loads") are still in flight, and what they hold.
Plain Python.

Owns: one record per load (one per step that lists swap-ins, id = `SchedulerOutput.load_id`):
the device blocks it writes, the host blocks it reads (pinned in `HostTier`), the owned host
blocks of resumed requests it frees when done, and which requests wait for which loads.
While a load is in flight:
  * its device blocks hold one extra allocator reference, so a request that is aborted,
    preempted or finished meanwhile cannot hand them to another request (whose forward would
    write them while the copy still does); the reference is dropped when the load lands;
  * its host blocks stay pinned (never evicted or overwritten by a swap-out);
  * every request that needs one of its blocks (the loading request, and any prefix-cache hit
    on those blocks) is not scheduled for compute (`is_waiting`).
Readiness is injected: `loads_done(ids)` returns the ids of the given loads that have landed,
and must never block (on CUDA: `torch.cuda.Event.query()` on the copy stream's events, see
`HostKVPool.loads_done`); `wait_load(id)` blocks until one has landed (`event.synchronize()`),
used only when nothing else can run. Without a runner (CPU, tests) loads are done at once.
Must never import torch and never block except through `wait_load`.
To extend (e.g. loads from a disk tier): give them an id from `begin` and the same record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from .block_allocator import BlockAllocator
from .host_tier import HostTier

LoadsDone = Callable[[Sequence[int]], Iterable[int]]
WaitLoad = Callable[[int], None]


def _all_done(ids: Sequence[int]) -> Iterable[int]:
    return ids


def _no_wait(load_id: int) -> None:
    return None


@dataclass
class _Load:
    device_blocks: list[int] = field(default_factory=list)  # written; one allocator reference each
    host_pins: list[int] = field(default_factory=list)      # read, pinned cached host blocks
    host_release: list[int] = field(default_factory=list)   # read, owned blocks freed after


class LoadTracker:
    def __init__(self, loads_done: Optional[LoadsDone] = None, wait_load: Optional[WaitLoad] = None):
        self.loads_done = loads_done or _all_done
        self.wait_load = wait_load or _no_wait
        self._next_id = 0
        self._loads: dict[int, _Load] = {}          # in flight, oldest first
        self.block_load: dict[int, int] = {}        # device block -> the load writing it
        self._waiting: dict[str, set[int]] = {}     # request id -> loads it needs
        self.num_waits = 0                          # times `wait_oldest` blocked the host
        self.wait_seconds = 0.0                     # ... and for how long

    # -- state ----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> list[int]:
        return list(self._loads)

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def loads_of(self, blocks: Iterable[int]) -> set[int]:
        """The in-flight loads writing any of `blocks`."""
        bl = self.block_load
        return {bl[b] for b in blocks if b in bl} if bl else set()

    # -- building a step's load -----------------------------------------------------------------

    def begin(self) -> int:
        """A new load (the swap-ins of one step); returns its id."""
        load_id = self._next_id
        self._next_id += 1
        self._loads[load_id] = _Load()
        return load_id

    def add(self, load_id: int, allocator: BlockAllocator, device_blocks: Sequence[int],
            host_pins: Sequence[int] = (), host_release: Sequence[int] = ()) -> None:
        """`load_id` writes `device_blocks` (referenced now, released when it lands) from host
        blocks, `host_pins` (already pinned by `HostTier.pin_hits`) and `host_release`."""
        rec = self._loads[load_id]
        allocator.share(device_blocks)
        rec.device_blocks.extend(device_blocks)
        for b in device_blocks:
            self.block_load[b] = load_id
        rec.host_pins.extend(host_pins)
        rec.host_release.extend(host_release)

    def wait_for(self, request_id: str, load_ids: Iterable[int]) -> None:
        """`request_id` computes only once every load in `load_ids` has landed."""
        ids = set(load_ids)
        if ids:
            self._waiting.setdefault(request_id, set()).update(ids)

    def forget(self, request_id: str) -> None:
        """The request no longer waits (it ended or lost its blocks); its loads still run."""
        self._waiting.pop(request_id, None)

    # -- completion -----------------------------------------------------------------------------

    def poll(self, allocator: BlockAllocator, host: Optional[HostTier]) -> None:
        """Retire every load that has landed (asks `loads_done`, never blocks)."""
        if self._loads:
            self._retire(set(self.loads_done(list(self._loads))), allocator, host)

    def wait_oldest(self, allocator: BlockAllocator, host: Optional[HostTier]) -> None:
        """Block until the oldest load has landed, then retire what has."""
        oldest = next(iter(self._loads))
        t = time.perf_counter()
        self.wait_load(oldest)
        self.wait_seconds += time.perf_counter() - t
        self.num_waits += 1
        self._retire({oldest} | set(self.loads_done(list(self._loads))), allocator, host)

    def wait_all(self, allocator: BlockAllocator, host: Optional[HostTier]) -> None:
        """Block until every load has landed (before a resize or a fresh scheduler)."""
        for load_id in list(self._loads):
            self.wait_load(load_id)
        self._retire(set(self._loads), allocator, host)

    def _retire(self, done: set[int], allocator: BlockAllocator, host: Optional[HostTier]) -> None:
        done &= self._loads.keys()
        if not done:
            return
        for load_id in done:
            rec = self._loads.pop(load_id)
            for b in rec.device_blocks:
                if self.block_load.get(b) == load_id:
                    del self.block_load[b]
            allocator.free(rec.device_blocks)
            if host is not None:
                host.unpin(rec.host_pins)
                host.free_released(rec.host_release)
        for rid in [rid for rid, ids in self._waiting.items() if not ids.isdisjoint(done)]:
            ids = self._waiting[rid]
            ids -= done
            if not ids:
                del self._waiting[rid]
