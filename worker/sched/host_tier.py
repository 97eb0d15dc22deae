"""`HostTier`: bookkeeping of the host-memory KV tier (`kv_offload_gib`). Plain Python.

Owns: which host block holds which prefix (by the same chained hash as `BlockAllocator`), the
LRU order of those cached blocks, the free host blocks, blocks *owned* by a swapped-out
request (not in the cache, never evicted), and *pinned* blocks, which nothing may evict or
overwrite: written by a swap-out this step (released at the next `begin_step`: the swap-outs
run in stream order before any later copy), or read by a swap-in ("load") still in flight
(released by `land(load)` once the scheduler learned that load finished; a load may span many
steps). The owned blocks of a resumed request are freed the same way, when its load lands
(`release(..., load=...)`); without a load id they are freed at the next `begin_step`.

Must never import torch: the tensors live in `worker/kv/copy.py` (`HostKVPool`); the scheduler
lists the copies in its `SchedulerOutput` and the runner performs them.
To extend (e.g. a disk tier below this one): take victims from `_evict_one`, which yields
the least recently used unpinned cached block; keep `check_invariants` true.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence


class HostTier:
    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"a host KV tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        # hash -> host block, in LRU order (front = least recently used); only cached blocks.
        self._lru: OrderedDict[int, int] = OrderedDict()
        self.hash_of: list[Optional[int]] = [None] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2...
        self.owned: set[int] = set()       # held by a swapped-out request
        self.pinned: dict[int, int] = {}   # block -> pins (a swap-out this step, loads in flight)
        self._step_pins: list[int] = []     # pins dropped at the next begin_step
        self._load_pins: dict[int, list[int]] = {}  # load id -> host blocks it reads
        self._release_next: list[int] = []  # owned blocks whose swap-in ran this step
        self._release_on: dict[int, list[int]] = {}  # load id -> owned blocks freed when it lands
        # counters for stats()
        self.num_stored_blocks = 0     # evicted device blocks copied here
        self.num_hit_blocks = 0        # cached blocks copied back on a prefix hit
        self.num_evicted_blocks = 0    # cached blocks dropped to make room
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # -- state ----------------------------------------------------------------------------------

    @property
    def num_cached_blocks(self) -> int:
        return len(self._lru)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def num_available(self) -> int:
        """Blocks that `take` could hand out now: free ones plus unpinned cached ones (every
        pinned block is cached: `store` and `pin_hits` pin only cached blocks, and nothing
        uncaches a pinned one), in O(1): it runs at every preemption."""
        return len(self._free) + len(self._lru) - len(self.pinned)

    def begin_step(self) -> None:
        """The previous step's copies are queued in order: drop its step pins, free the blocks of
        resumed requests released without a load id."""
        self._unpin(self._step_pins)
        self._step_pins = []
        for b in self._release_next:
            self._free.append(b)
        self._release_next.clear()

    def land(self, load: int) -> None:
        """Load `load` (a swap-in) has finished: its host blocks may be evicted and its resumed
        requests' blocks are free."""
        self._unpin(self._load_pins.pop(load, ()))
        self._free.extend(self._release_on.pop(load, ()))

    def land_all(self) -> None:
        for load in set(self._load_pins) | set(self._release_on):
            self.land(load)

    def _pin(self, block: int, load: Optional[int]) -> None:
        self.pinned[block] = self.pinned.get(block, 0) + 1
        (self._step_pins if load is None else self._load_pins.setdefault(load, [])).append(block)

    def _unpin(self, blocks) -> None:
        for b in blocks:
            left = self.pinned[b] - 1
            if left:
                self.pinned[b] = left
            else:
                del self.pinned[b]

    # -- prefix cache ---------------------------------------------------------------------------

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        """Host blocks holding the longest cached run of `block_hashes` (nothing changes)."""
        found = []
        for h in block_hashes:
            b = self._lru.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def pin_hits(self, blocks: Sequence[int], load: Optional[int] = None) -> None:
        """`blocks` (from `lookup`) are copied back by `load` (None: a copy of this step): mark
        them most recently used and keep them until it landed (`land`) or the step ended."""
        for b in blocks:
            self._lru.move_to_end(self.hash_of[b])
            self._pin(b, load)
        self.num_hit_blocks += len(blocks)

    def store(self, block_hash: int) -> Optional[int]:
        """A device block holding `block_hash` was evicted. Returns the host block to copy it
        into, or None when no copy is needed (already here: it becomes most recently used) or
        possible (every host block is pinned or owned)."""
        if block_hash in self._lru:
            self._lru.move_to_end(block_hash)
            return None
        block = self._take_one()
        if block is None:
            return None
        self.hash_of[block] = block_hash
        self._lru[block_hash] = block
        self._pin(block, None)  # written this step: no later store of the step may take it back
        self.num_stored_blocks += 1
        return block

    def reset_prefix_cache(self) -> None:
        for h, b in list(self._lru.items()):
            if b not in self.pinned:
                del self._lru[h]
                self.hash_of[b] = None
                self._free.append(b)

    # -- swapped-out requests -------------------------------------------------------------------

    def take(self, n: int) -> Optional[list[int]]:
        """`n` blocks for a preempted request's KV (evicting cached prefixes, least recently
        used first), or None, taking nothing, if fewer than `n` can be had."""
        if n > self.num_available():
            return None
        blocks = [self._take_one() for _ in range(n)]
        self.owned.update(blocks)
        self.num_swapped_out_blocks += n
        return blocks

    def release(self, blocks: Sequence[int], in_flight: bool, load: Optional[int] = None) -> None:
        """A swapped-out request's blocks are no longer needed: at once (it ended), or once its
        swap-in has read them (`in_flight`: when `load` lands, or after this step without one)."""
        for b in blocks:
            self.owned.remove(b)
        if in_flight:
            (self._release_next if load is None else self._release_on.setdefault(load, [])).extend(blocks)
            self.num_swapped_in_blocks += len(blocks)
        else:
            self._free.extend(blocks)

    # -- internals ------------------------------------------------------------------------------

    def _take_one(self) -> Optional[int]:
        if self._free:
            return self._free.pop()
        return self._evict_one()

    def _evict_one(self) -> Optional[int]:
        for h, b in self._lru.items():  # least recently used first
            if b not in self.pinned:
                del self._lru[h]
                self.hash_of[b] = None
                self.num_evicted_blocks += 1
                return b
        return None

    def stats(self) -> dict:
        return {"num_host_blocks": self.num_blocks, "num_host_used_blocks": self.num_used_blocks,
                "num_host_cached_blocks": self.num_cached_blocks,
                "host_hit_blocks": self.num_hit_blocks, "host_stored_blocks": self.num_stored_blocks,
                "host_evicted_blocks": self.num_evicted_blocks,
                "host_swapped_out_blocks": self.num_swapped_out_blocks,
                "host_swapped_in_blocks": self.num_swapped_in_blocks}

    @staticmethod
    def empty_stats() -> dict:
        """`stats()` of a replica without the tier."""
        return {"num_host_blocks": 0, "num_host_used_blocks": 0, "num_host_cached_blocks": 0,
                "host_hit_blocks": 0, "host_stored_blocks": 0, "host_evicted_blocks": 0,
                "host_swapped_out_blocks": 0, "host_swapped_in_blocks": 0}

    def check_invariants(self) -> None:
        free = set(self._free)
        cached = set(self._lru.values())
        releasing = set(self._release_next).union(*self._release_on.values())
        parts = [free, cached, self.owned, releasing]
        if sum(len(p) for p in parts) != self.num_blocks or len(set().union(*parts)) != self.num_blocks:
            raise AssertionError("host blocks: free / cached / owned / releasing do not partition the pool")
        for h, b in self._lru.items():
            if self.hash_of[b] != h:
                raise AssertionError(f"host block {b}: hash map out of sync")
        if not self.pinned.keys() <= cached:
            raise AssertionError(f"pinned host blocks {sorted(self.pinned.keys() - cached)} are not cached")
        for b in range(self.num_blocks):
            if self.hash_of[b] is not None and b not in cached:
                raise AssertionError(f"host block {b} keeps a hash but is not cached")
