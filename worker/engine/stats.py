"""What a `DynamicEngine` reports about itself: its counters (`engine_stats`), its KV pool and
limits (`engine_capacity`), and one request's phase (`request_phase`). Plain Python: these read
the engine's scheduler, allocator and host tier and change nothing.

Owns: the names and meaning of the stats keys (the replica server forwards them to the
coordinator and the gateway's metrics). To add a stat: compute it here from state the engine
already keeps; the step loop (worker/engine/engine.py) stays free of reporting code.
"""

from __future__ import annotations

import time

from infer_cluster.protocol import RequestStatus

from infer_cluster.worker.sched.host_tier import HostTier
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.spec_decode.decoder import off_stats


def is_prefilling(req: Request) -> bool:
    """Its prompt (or a recompute after preemption) is still being computed."""
    return req.first_token_time is None or req.num_computed_tokens < req.num_tokens - 1


def request_phase(engine, request_id: str) -> str:
    """`waiting` (queued or preempted), `prefilling`, `generating`, or `finished` (ended, or
    never known here)."""
    req = engine.scheduler.requests.get(request_id)
    if req is None:
        return "finished"
    if req.status is not RequestStatus.RUNNING:
        return "waiting"
    return "prefilling" if is_prefilling(req) else "generating"


def engine_stats(engine) -> dict:
    sched = engine.scheduler
    elapsed = max(1e-9, time.monotonic() - engine.started_at)
    num_prefilling = sum(1 for r in sched.running if is_prefilling(r))
    return {"num_running": len(sched.running), "num_waiting": len(sched.waiting),
            "num_prefilling": num_prefilling,
            "num_generating": len(sched.running) - num_prefilling,
            "num_preemptions": sched.num_preemptions,
            "num_scheduled_tokens": sched.num_scheduled_tokens,
            "prefix_cache_hit_tokens": sched.prefix_cache_hit_tokens,
            "num_free_blocks": engine.allocator.num_free_blocks,
            "num_total_blocks": engine.allocator.num_blocks,
            "num_generated_tokens": engine.num_generated,
            "generated_tokens_per_s": engine.num_generated / elapsed,
            "max_num_seqs": engine.config.max_num_seqs,
            "warmup_seconds": engine.warmup_stats["seconds"] if engine.warmup_stats else 0.0,
            "step_seconds": engine.phase_seconds,
            **_host_tier_stats(engine), **_spec_stats(engine)}


def _spec_stats(engine) -> dict:
    """Speculative decoding's proposals and acceptances (zeros and [] when it is off)."""
    spec = engine.spec_decoder
    return spec.stats() if spec is not None else off_stats()


def _host_tier_stats(engine) -> dict:
    """The host KV tier's use (all zero when it is off)."""
    tier = engine.host_tier
    stats = tier.stats() if tier is not None else HostTier.empty_stats()
    stats["prefix_cache_hit_tokens_host"] = engine.scheduler.prefix_cache_hit_tokens_host
    stats["num_swapped_out"] = engine.scheduler.num_swapped_out
    return stats


def engine_capacity(engine) -> dict:
    config = engine.config
    return {"model": engine.model_name, "num_total_blocks": engine.allocator.num_blocks,
            "block_size": config.block_size, "max_num_seqs": config.max_num_seqs,
            "max_model_len": engine.max_model_len, "kv_cache_dtype": config.kv_cache_dtype,
            "speculative": config.speculative_config.method if config.speculative_config else ""}
