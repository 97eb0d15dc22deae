"""Resizing (or retyping) a replica's KV pool between steps: the bookkeeping half. Plain Python.

Owns: checking a resize target against the engine (`check_target`), choosing which running
requests keep their KV (`plan_resize`: the head of `Scheduler.running`, in priority / arrival
order, as long as its blocks fit the new pool; every later one is preempted, newest first, like
ordinary preemption: to the host tier when it has room, else recomputed) and moving the survivors onto the new `BlockAllocator`
(`adopt_survivors`: their blocks become ids 0..k-1 in table order, shared blocks stay shared).
The prefix cache is dropped; survivors' full blocks are offered to it again by the next
`Scheduler.update`. The tensor half (reallocate, copy surviving blocks, re-capture CUDA graphs)
is `ModelRunner.resize_kv_pool`; `kv_reset.reset_engine_cache` (run by `DynamicEngine.reset_cache`)
drives both.

Must never import torch, and never fail or drop a request: a request that does not fit goes
back to waiting, and a target that could strand a request is refused up front.
To extend (e.g. copy the dropped prefix cache to the host tier): `kv_reset.reset_engine_cache`
has the old pool until `resize_kv_pool`; keep `adopt_survivors` assigning ids in order (the runner's copy relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from infer_cluster.protocol import InvalidRequestError

from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.config import KV_CACHE_DTYPES
from infer_cluster.worker.sched.request import Request


@dataclass
class ResizePlan:
    num_blocks: int
    kv_cache_dtype: str
    block_map: dict[int, int] = field(default_factory=dict)  # old block id -> new block id
    survivors: list[Request] = field(default_factory=list)
    victims: list[Request] = field(default_factory=list)


def min_blocks(max_model_len: int, block_size: int) -> int:
    """Blocks one request of `max_model_len` tokens needs: the smallest pool that can never
    strand an admitted request."""
    return -(-max_model_len // block_size)


def check_target(num_kv_blocks: Optional[int], kv_cache_dtype: Optional[str], current_dtype: str,
                 max_model_len: int, block_size: int,
                 same_bytes_blocks: Callable[[str], int]) -> tuple[int, str]:
    """Validate a resize request; returns (block count, dtype). `num_kv_blocks=None` means as
    many blocks as the current pool's bytes hold in the new dtype (`same_bytes_blocks(dtype)`).
    Raises `InvalidRequestError` with a message a person can act on."""
    if num_kv_blocks is None and kv_cache_dtype is None:
        raise InvalidRequestError("resize needs num_kv_blocks, kv_cache_dtype or both")
    dtype = current_dtype if kv_cache_dtype is None else kv_cache_dtype
    if dtype not in KV_CACHE_DTYPES:
        raise InvalidRequestError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                                  f"got {kv_cache_dtype!r}")
    if num_kv_blocks is None:
        num_kv_blocks = same_bytes_blocks(dtype)
    if isinstance(num_kv_blocks, bool) or not isinstance(num_kv_blocks, int):
        raise InvalidRequestError(f"num_kv_blocks must be an integer, got {num_kv_blocks!r}")
    need = min_blocks(max_model_len, block_size)
    if num_kv_blocks < need:
        raise InvalidRequestError(
            f"num_kv_blocks={num_kv_blocks} is too small: one request of max_model_len "
            f"{max_model_len} tokens needs {need} blocks of {block_size} tokens")
    return num_kv_blocks, dtype


def plan_resize(running: Sequence[Request], num_blocks: int, kv_cache_dtype: str,
                keep_kv: bool) -> ResizePlan:
    """Which running requests keep their KV in a pool of `num_blocks`. `keep_kv=False` (new
    dtype, or the old pool must go before the new one fits): every running request is a victim."""
    plan = ResizePlan(num_blocks, kv_cache_dtype)
    for i, req in enumerate(running):
        new = [b for b in dict.fromkeys(req.block_ids) if b not in plan.block_map]
        if not keep_kv or len(plan.block_map) + len(new) > num_blocks:
            plan.victims = list(running[i:])
            break
        for b in new:
            plan.block_map[b] = len(plan.block_map)
        plan.survivors.append(req)
    return plan


def adopt_survivors(plan: ResizePlan, allocator: BlockAllocator) -> None:
    """Give the survivors their new block ids on a fresh `allocator` with the same references
    (a block shared by two survivors has two)."""
    fresh = allocator.allocate(len(plan.block_map))
    if fresh != list(range(len(plan.block_map))):
        raise RuntimeError("a fresh allocator must hand out blocks 0..n-1 in order")
    seen: set[int] = set()
    for req in plan.survivors:
        extra = []
        for b in req.block_ids:
            if b in seen:
                extra.append(plan.block_map[b])
            seen.add(b)
        allocator.share(extra)
        req.block_ids = [plan.block_map[b] for b in req.block_ids]
        req.num_registered_blocks = 0  # the new pool's prefix cache starts empty
