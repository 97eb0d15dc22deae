"""`BlockAllocator`: KV-cache block bookkeeping with a chained-hash prefix cache. Plain Python.

Owns: reference counts, the free list (kept in LRU order), and the map from a full block's
content hash to the block holding it. A full block's hash chains its parent's:
`hash(parent_hash, token_ids)` (xxh3-64), so equal hashes mean equal whole prefixes. A freed
block keeps its hash and stays reusable until the allocator hands it out again (eviction,
least recently freed first).

Must never import torch: block ids are ints and the tensors live in `DynamicContext`.
To extend (e.g. a swap tier): keep the invariants `ref_count[b] == 0  <=>  b in free list`
and `hash_of[b] is not None  =>  block_of_hash[hash_of[b]] == b`; tests check them.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Iterable, Optional, Sequence

import xxhash

NO_PARENT = 0


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Chained content hash of one full block: xxh3-64 of the parent's hash (8 bytes, little
    endian) followed by the block's ids as int64."""
    return xxhash.xxh3_64_intdigest(parent_hash.to_bytes(8, "little") + array("q", token_ids).tobytes())


def hash_full_blocks(token_ids: Sequence[int], block_size: int, known: Sequence[int] = ()) -> list[int]:
    """Hashes of every full block of `token_ids`, reusing the already-known leading ones (the
    same values as `hash_block` chained; the ids are packed once, not per block)."""
    hashes = list(known)
    parent = hashes[-1] if hashes else NO_PARENT
    first, last = len(hashes), len(token_ids) // block_size
    if last <= first:
        return hashes
    packed = array("q", token_ids[first * block_size:last * block_size]).tobytes()
    width = block_size * 8
    digest = xxhash.xxh3_64_intdigest
    for j in range(last - first):
        parent = digest(parent.to_bytes(8, "little") + packed[j * width:(j + 1) * width])
        hashes.append(parent)
    return hashes


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[Optional[int]] = [None] * num_blocks
        self.block_of_hash: dict[int, int] = {}
        # Insertion order = eviction order: the front is the least recently freed block.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.num_evictions = 0
        # (block, hash) of every cached block `allocate` evicted, when a host tier wants them
        # (the scheduler drains it after each allocation); None: not recorded.
        self.evicted: Optional[list[tuple[int, int]]] = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks (evicting their cached hashes). Raises if too few are free."""
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            if self.evicted is not None and self.hash_of[block] is not None:
                self.evicted.append((block, self.hash_of[block]))
            self._forget_hash(block)
            self.ref_count[block] = 1
            out.append(block)
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block. Blocks are given in table order; the tail of a
        sequence is the least likely to be shared, so it goes to the free list first and is
        evicted first."""
        for block in reversed(list(block_ids)):
            if self.ref_count[block] <= 0:
                raise RuntimeError(f"block {block} freed more often than allocated")
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._free[block] = None

    # -- prefix cache -------------------------------------------------------------------------

    def lookup_prefix(self, block_hashes: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached run of `block_hashes` (not yet referenced)."""
        if not self.enable_prefix_caching:
            return []
        found = []
        for h in block_hashes:
            block = self.block_of_hash.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def share(self, block_ids: Iterable[int]) -> None:
        """Add a reference to cached blocks found by `lookup_prefix` (reviving freed ones)."""
        for block in block_ids:
            if self.ref_count[block] == 0:
                del self._free[block]
            self.ref_count[block] += 1

    def register(self, block_id: int, block_hash: int) -> None:
        """Record that a now-full block holds the prefix with `block_hash`. If another block
        already holds the same prefix, that one stays the canonical copy."""
        if not self.enable_prefix_caching or self.hash_of[block_id] is not None:
            return
        if block_hash in self.block_of_hash:
            return
        self.hash_of[block_id] = block_hash
        self.block_of_hash[block_hash] = block_id

    def reset_prefix_cache(self) -> None:
        self.block_of_hash.clear()
        self.hash_of = [None] * self.num_blocks

    def _forget_hash(self, block: int) -> None:
        h = self.hash_of[block]
        if h is not None:
            self.hash_of[block] = None
            del self.block_of_hash[h]
            self.num_evictions += 1

    def check_invariants(self) -> None:
        for b in range(self.num_blocks):
            if (self.ref_count[b] == 0) != (b in self._free):
                raise AssertionError(f"block {b}: ref {self.ref_count[b]} vs free list")
            h = self.hash_of[b]
            if h is not None and self.block_of_hash.get(h) != b:
                raise AssertionError(f"block {b}: hash map out of sync")
