"""BlockAllocator: exact block ids, ref counts, the chained-hash prefix cache, LRU eviction.

Every test calls `check_invariants()` after each operation; a hypothesis state machine drives
random operation sequences against a simple model of what the allocator must hold.
"""

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from infer_cluster.worker.sched.block_allocator import NO_PARENT, BlockAllocator, hash_block, hash_full_blocks


def free_order(alloc: BlockAllocator) -> list[int]:
    """The free list front to back (front = evicted first)."""
    return list(alloc._free)


# -- hashing ------------------------------------------------------------------------------------

def test_hash_block_chains_parent_and_content():
    h0 = hash_block(NO_PARENT, [1, 2, 3, 4])
    assert h0 == hash_block(NO_PARENT, [1, 2, 3, 4])
    assert h0 != hash_block(NO_PARENT, [1, 2, 3, 5])
    assert hash_block(h0, [5, 6, 7, 8]) != hash_block(NO_PARENT, [5, 6, 7, 8])
    assert isinstance(h0, int) and 0 <= h0 < 2**64


def test_hash_full_blocks_only_full_blocks_and_reuses_known():
    tokens = list(range(10))
    hashes = hash_full_blocks(tokens, 4)
    h0 = hash_block(NO_PARENT, [0, 1, 2, 3])
    h1 = hash_block(h0, [4, 5, 6, 7])
    assert hashes == [h0, h1]  # the partial block [8, 9] gets no hash
    assert hash_full_blocks(tokens[:3], 4) == []
    assert hash_full_blocks(list(range(12)), 4, known=[h0, h1]) == [h0, h1, hash_block(h1, [8, 9, 10, 11])]
    # Known hashes are trusted as given (not recomputed).
    assert hash_full_blocks(tokens, 4, known=[123]) == [123, hash_block(123, [4, 5, 6, 7])]


# -- allocate / free ----------------------------------------------------------------------------

def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks > 0"):
        BlockAllocator(0, 4)
    with pytest.raises(ValueError, match="block_size > 0"):
        BlockAllocator(4, 0)


def test_allocate_takes_ids_in_initial_order():
    a = BlockAllocator(8, 4)
    assert a.num_free_blocks == 8
    assert a.allocate(3) == [0, 1, 2]
    a.check_invariants()
    assert a.allocate(2) == [3, 4]
    a.check_invariants()
    assert a.num_free_blocks == 3
    assert a.ref_count == [1, 1, 1, 1, 1, 0, 0, 0]
    assert free_order(a) == [5, 6, 7]
    assert a.allocate(0) == []
    a.check_invariants()


def test_allocate_too_many_raises_and_changes_nothing():
    a = BlockAllocator(4, 4)
    a.allocate(3)
    assert a.can_allocate(1) and not a.can_allocate(2)
    with pytest.raises(MemoryError, match="asked for 2 KV blocks, only 1 free"):
        a.allocate(2)
    a.check_invariants()
    assert a.num_free_blocks == 1
    assert a.allocate(1) == [3]
    a.check_invariants()


def test_free_appends_to_tail_in_reverse_table_order():
    a = BlockAllocator(6, 4)
    assert a.allocate(3) == [0, 1, 2]
    a.free([0, 1, 2])
    a.check_invariants()
    assert free_order(a) == [3, 4, 5, 2, 1, 0]
    # Never-used blocks first, then the freed sequence's tail before its head.
    assert a.allocate(4) == [3, 4, 5, 2]
    a.check_invariants()
    assert a.allocate(2) == [1, 0]
    a.check_invariants()
    assert a.num_free_blocks == 0


def test_free_order_across_two_sequences():
    a = BlockAllocator(6, 4)
    s1 = a.allocate(2)
    s2 = a.allocate(3)
    assert (s1, s2) == ([0, 1], [2, 3, 4])
    a.free(s2)
    a.check_invariants()
    a.free(s1)
    a.check_invariants()
    assert free_order(a) == [5, 4, 3, 2, 1, 0]
    assert a.allocate(6) == [5, 4, 3, 2, 1, 0]
    a.check_invariants()


def test_ref_counting_and_double_free():
    a = BlockAllocator(4, 4)
    blocks = a.allocate(2)
    assert blocks == [0, 1]
    a.share([0])  # a second owner of block 0
    a.check_invariants()
    assert a.ref_count[:2] == [2, 1]
    a.free([0, 1])
    a.check_invariants()
    assert a.ref_count[:2] == [1, 0]
    assert free_order(a) == [2, 3, 1]
    a.free([0])
    a.check_invariants()
    assert free_order(a) == [2, 3, 1, 0]
    with pytest.raises(RuntimeError, match="block 0 freed more often than allocated"):
        a.free([0])
    a.check_invariants()
    assert a.ref_count == [0, 0, 0, 0]


def test_double_free_of_never_allocated_block():
    a = BlockAllocator(3, 2)
    with pytest.raises(RuntimeError, match="block 2 freed more often"):
        a.free([2])
    a.check_invariants()
    assert free_order(a) == [0, 1, 2]


# -- prefix cache -------------------------------------------------------------------------------

def _hashes(n, block_size=4, start=0):
    return hash_full_blocks(list(range(start, start + n * block_size)), block_size)


def test_register_and_lookup_prefix():
    a = BlockAllocator(8, 4)
    blocks = a.allocate(3)
    h = _hashes(3)
    for b, bh in zip(blocks, h):
        a.register(b, bh)
        a.check_invariants()
    assert a.hash_of[:3] == h
    assert a.block_of_hash == {h[0]: 0, h[1]: 1, h[2]: 2}
    assert a.lookup_prefix(h) == [0, 1, 2]
    assert a.lookup_prefix(h[:2]) == [0, 1]
    # The run stops at the first miss even if later hashes are cached.
    other = _hashes(1, start=100)
    assert a.lookup_prefix([h[0], other[0], h[2]]) == [0]
    assert a.lookup_prefix(other) == []
    assert a.lookup_prefix([]) == []
    # lookup does not take references.
    assert a.ref_count[:3] == [1, 1, 1]
    a.check_invariants()


def test_share_revives_freed_cached_blocks():
    a = BlockAllocator(6, 4)
    blocks = a.allocate(2)
    h = _hashes(2)
    a.register(blocks[0], h[0])
    a.register(blocks[1], h[1])
    a.free(blocks)
    a.check_invariants()
    assert free_order(a) == [2, 3, 4, 5, 1, 0]
    # Freed blocks keep their hashes until evicted.
    assert a.lookup_prefix(h) == [0, 1]
    a.share([0, 1])
    a.check_invariants()
    assert a.ref_count[:2] == [1, 1]
    assert free_order(a) == [2, 3, 4, 5]
    assert a.num_free_blocks == 4
    assert a.num_evictions == 0
    # Sharing blocks already in use just adds references.
    a.share([0])
    assert a.ref_count[0] == 2
    a.check_invariants()


def test_reallocating_a_cached_block_evicts_its_hash():
    a = BlockAllocator(3, 4)
    blocks = a.allocate(3)
    h = _hashes(3)
    for b, bh in zip(blocks, h):
        a.register(b, bh)
    a.free(blocks)
    a.check_invariants()
    assert free_order(a) == [2, 1, 0]
    assert a.num_evictions == 0
    assert a.allocate(1) == [2]  # the least recently freed one: the sequence's tail
    a.check_invariants()
    assert a.num_evictions == 1
    assert a.hash_of[2] is None
    assert h[2] not in a.block_of_hash
    assert a.block_of_hash == {h[0]: 0, h[1]: 1}
    assert a.lookup_prefix(h) == [0, 1]
    assert a.allocate(1) == [1]
    a.check_invariants()
    assert a.num_evictions == 2
    assert a.lookup_prefix(h) == [0]


def test_allocating_uncached_blocks_counts_no_eviction():
    a = BlockAllocator(4, 4)
    a.free(a.allocate(4))
    a.allocate(4)
    a.check_invariants()
    assert a.num_evictions == 0


def test_register_duplicate_hash_keeps_first_block():
    a = BlockAllocator(4, 4)
    b0, b1 = a.allocate(2)
    h = _hashes(1)[0]
    a.register(b0, h)
    a.register(b1, h)
    a.check_invariants()
    assert a.block_of_hash == {h: b0}
    assert a.hash_of[b0] == h
    assert a.hash_of[b1] is None
    # Freeing the duplicate (uncached) copy and reusing it evicts nothing.
    a.free([b1])
    assert a.allocate(2) == [2, 3]
    assert a.allocate(1) == [b1]
    assert a.num_evictions == 0
    assert a.lookup_prefix([h]) == [b0]
    a.check_invariants()


def test_register_of_an_already_hashed_block_is_ignored():
    a = BlockAllocator(2, 4)
    (b,) = a.allocate(1)
    h0, h1 = _hashes(2)
    a.register(b, h0)
    a.register(b, h1)
    a.check_invariants()
    assert a.hash_of[b] == h0
    assert a.block_of_hash == {h0: b}


def test_disabled_prefix_caching_never_caches():
    a = BlockAllocator(4, 4, enable_prefix_caching=False)
    blocks = a.allocate(2)
    h = _hashes(2)
    a.register(blocks[0], h[0])
    a.register(blocks[1], h[1])
    a.check_invariants()
    assert a.block_of_hash == {}
    assert a.hash_of == [None] * 4
    assert a.lookup_prefix(h) == []
    a.free(blocks)
    assert a.allocate(4) == [2, 3, 1, 0]
    assert a.num_evictions == 0
    a.check_invariants()


def test_reset_prefix_cache_forgets_everything():
    a = BlockAllocator(4, 4)
    blocks = a.allocate(2)
    h = _hashes(2)
    a.register(blocks[0], h[0])
    a.register(blocks[1], h[1])
    a.reset_prefix_cache()
    a.check_invariants()
    assert a.lookup_prefix(h) == []
    assert a.block_of_hash == {}
    assert a.hash_of == [None] * 4
    assert a.ref_count == [1, 1, 0, 0]  # references are untouched


def test_check_invariants_detects_corruption():
    a = BlockAllocator(3, 4)
    a.allocate(1)
    a.ref_count[0] = 0  # in use per the free list, but ref count says free
    with pytest.raises(AssertionError, match="block 0"):
        a.check_invariants()
    b = BlockAllocator(3, 4)
    (blk,) = b.allocate(1)
    b.hash_of[blk] = 42  # hash without a map entry
    with pytest.raises(AssertionError, match="hash map out of sync"):
        b.check_invariants()


# -- random operations --------------------------------------------------------------------------

NUM_BLOCKS = 8
BLOCK_SIZE = 2


class AllocatorMachine(RuleBasedStateMachine):
    """Sequences own blocks (with optional hashes); a shadow model checks counts and ids."""

    def __init__(self):
        super().__init__()
        self.alloc = BlockAllocator(NUM_BLOCKS, BLOCK_SIZE)
        self.owners: list[list[int]] = []  # each owner holds one reference to each of its blocks
        self.next_content = 0

    def _expected_refs(self) -> list[int]:
        refs = [0] * NUM_BLOCKS
        for blocks in self.owners:
            for b in blocks:
                refs[b] += 1
        return refs

    @rule(n=st.integers(0, 4))
    def allocate(self, n):
        free_before = free_order(self.alloc)
        if n > len(free_before):
            with pytest.raises(MemoryError):
                self.alloc.allocate(n)
            assert free_order(self.alloc) == free_before
            return
        got = self.alloc.allocate(n)
        assert got == free_before[:n]  # always from the front of the LRU list
        for b in got:
            assert self.alloc.hash_of[b] is None
        self.owners.append(got)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def free_owner(self, data):
        i = data.draw(st.integers(0, len(self.owners) - 1))
        blocks = self.owners.pop(i)
        free_before = free_order(self.alloc)
        self.alloc.free(blocks)
        refs = self._expected_refs()
        newly_free = [b for b in reversed(blocks) if refs[b] == 0]
        assert free_order(self.alloc) == free_before + newly_free

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), shared_content=st.booleans())
    def register(self, data, shared_content):
        blocks = data.draw(st.sampled_from(self.owners))
        if not blocks:
            return
        b = data.draw(st.sampled_from(blocks))
        if shared_content:
            h = hash_block(NO_PARENT, [0, 0])  # the same prefix offered from many blocks
        else:
            self.next_content += 1
            h = hash_block(NO_PARENT, [self.next_content, 0])
        before = dict(self.alloc.block_of_hash)
        old_hash = self.alloc.hash_of[b]
        self.alloc.register(b, h)
        if h in before or old_hash is not None:
            # The first copy stays canonical; a block keeps its first hash.
            assert self.alloc.block_of_hash == before
            assert self.alloc.hash_of[b] == old_hash
        else:
            assert self.alloc.block_of_hash == {**before, h: b}
            assert self.alloc.hash_of[b] == h

    @rule(data=st.data())
    def share_cached(self, data):
        hashes = sorted(self.alloc.block_of_hash)
        if not hashes:
            return
        h = data.draw(st.sampled_from(hashes))
        blocks = self.alloc.lookup_prefix([h])
        assert blocks == [self.alloc.block_of_hash[h]]
        was_free = self.alloc.ref_count[blocks[0]] == 0
        free_before = free_order(self.alloc)
        self.alloc.share(blocks)
        if was_free:  # revived: taken out of the free list, the rest keeps its order
            assert free_order(self.alloc) == [b for b in free_before if b != blocks[0]]
        self.owners.append(blocks)

    @rule()
    def reset(self):
        self.alloc.reset_prefix_cache()

    @invariant()
    def invariants_hold(self):
        self.alloc.check_invariants()
        refs = self._expected_refs()
        assert self.alloc.ref_count == refs
        assert sorted(free_order(self.alloc)) == [b for b in range(NUM_BLOCKS) if refs[b] == 0]
        assert len(free_order(self.alloc)) == len(set(free_order(self.alloc)))
        for h, b in self.alloc.block_of_hash.items():
            assert self.alloc.hash_of[b] == h
        assert len(self.alloc.block_of_hash) == sum(h is not None for h in self.alloc.hash_of)


AllocatorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAllocatorMachine = AllocatorMachine.TestCase
