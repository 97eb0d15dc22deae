"""Resizing (or retyping) a replica's KV pool between steps: the driver that ties the halves.

Owns: `reset_engine_cache(engine, num_kv_blocks, kv_cache_dtype)`, what
`DynamicEngine.reset_cache` runs once no step is in flight: check the target
(`kv_resize.check_target`), have the runner make room (`prepare_kv_resize`, which raises
`OutOfMemoryError` before anything changes), plan who keeps their KV (`kv_resize.plan_resize`),
preempt the others (swapped to the host tier when it has room and the dtype stays), reallocate
the pool (`ModelRunner.resize_kv_pool`), then give the engine a new `BlockAllocator` holding the
survivors and, after a dtype change, a fresh host tier. No request ends.
Must never run with a step in flight (the engine drains first) or with tensor/pipeline parallel
ranks (refused with `InvalidRequestError`).
To extend (e.g. keep the prefix cache across a resize): plan it in `kv_resize`, copy it in the
runner, and adopt it here where the new allocator is made.
"""

from __future__ import annotations

import logging
from typing import Optional

from infer_cluster.protocol import InvalidRequestError

from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.sched.host_tier import HostTier
from infer_cluster.worker.kv.resize import ResizePlan, adopt_survivors, check_target, plan_resize
from infer_cluster.worker.sched.output import SchedulerOutput

log = logging.getLogger(__name__)


def reset_engine_cache(engine, num_kv_blocks: Optional[int], kv_cache_dtype: Optional[str]) -> None:
    """A new KV pool for `engine` (a `DynamicEngine` with nothing in flight): `num_kv_blocks`
    blocks (None: as many as the current pool's bytes hold in the new dtype) of `kv_cache_dtype`
    storage (None: keep). Running requests whose blocks fit keep their KV (copied; same dtype
    only); the rest are preempted. The device prefix cache is dropped (and with a new dtype the
    host tier's content too)."""
    runner, config = engine.runner, engine.config
    if getattr(runner, "resize_kv_pool", None) is None:
        raise InvalidRequestError(
            f"resizing the KV cache is not supported with tensor/pipeline parallel "
            f"({config.world_size} ranks); restart the replica with --num-kv-blocks / "
            f"--kv-cache-dtype instead")
    num_blocks, dtype = check_target(num_kv_blocks, kv_cache_dtype, config.kv_cache_dtype,
                                     engine.max_model_len, config.block_size, runner.same_bytes_blocks)
    engine.scheduler.land_all_loads()  # host-tier loads in flight write blocks that may move
    beside = runner.prepare_kv_resize(num_blocks, dtype)  # OutOfMemoryError: no change
    same_dtype = dtype == config.kv_cache_dtype
    plan = plan_resize(list(engine.scheduler.running), num_blocks, dtype, keep_kv=same_dtype and beside)
    swaps = SchedulerOutput()
    for req in reversed(plan.victims):  # newest first, as ordinary preemption does
        engine.scheduler._preempt(req, swaps)
    if swaps.has_swaps and same_dtype:  # victims' KV to the host tier, from the old pool
        runner.swap_blocks(swaps)
    try:
        runner.resize_kv_pool(num_blocks, dtype, plan.block_map)
    except Exception:
        if not plan.block_map:  # the old pool came back empty: its prefix cache is void
            _new_allocator(engine, ResizePlan(runner.num_kv_blocks, config.kv_cache_dtype))
        raise
    finally:
        if not same_dtype:  # the host tier's blocks were in the old layout
            _new_host_tier(engine)
    _new_allocator(engine, plan)
    engine.config = config.replace(num_kv_blocks=num_blocks, kv_cache_dtype=dtype)
    log.info("KV pool now %d blocks (%s): %d running request(s) kept their KV, %d preempted",
             engine.allocator.num_blocks, dtype, len(plan.survivors), len(plan.victims))


def _new_allocator(engine, plan: ResizePlan) -> None:
    config = engine.config
    engine.allocator = BlockAllocator(engine.runner.num_kv_blocks, config.block_size,
                                      config.enable_prefix_caching)
    if engine.host_tier is not None:
        engine.allocator.evicted = []  # evicted cached blocks are offered to the host tier
    adopt_survivors(plan, engine.allocator)
    engine.scheduler.allocator = engine.allocator


def _new_host_tier(engine) -> None:
    """A fresh, empty host tier (after a dtype change): swapped-out requests recompute."""
    for req in engine.scheduler.waiting:
        if req.host_block_ids is not None:
            req.host_block_ids = None
            req.num_computed_tokens = 0
    num_host_blocks = getattr(engine.runner, "num_host_blocks", 0)
    engine.host_tier = HostTier(num_host_blocks) if num_host_blocks else None
    engine.scheduler.host = engine.host_tier
