"""What a failed step does to its requests (a device fault must not take the other requests'
replies down): `recover_step` waits out the device's work on the launched steps and any grammar
mask filled ahead, lands host-tier loads, ends the requests of the failed steps as FAILED
(`fail_scheduled`: every request when scheduling itself failed or host-tier copies may be half
done, and then no cached KV is trusted), and queues the final delta of every request that ended
without one. Plain Python over the engine's parts."""

from __future__ import annotations

from typing import Optional

from infer_cluster.protocol import EngineError, FinishReason, RequestStatus

from infer_cluster.worker.engine.deltas import final_delta
from infer_cluster.worker.sched.output import SchedulerOutput


def fail_scheduled(scheduler, allocator, host_tier, outs: Optional[list[SchedulerOutput]],
                   exc: Exception, loads: bool = False) -> None:
    """End the scheduled requests of the failed steps `outs` (all requests if scheduling itself
    failed: None) as FAILED. `loads`: host-tier loads were in flight."""
    error = EngineError(f"engine step failed: {type(exc).__name__}: {exc}").to_dict()
    ids = ([s.request_id for out in outs for s in out.requests] if outs is not None
           else list(scheduler.requests))
    if loads or (outs is not None and any(out.has_swaps for out in outs)):  # copies may be half done
        ids = list(scheduler.requests)  # trust no cached KV
        allocator.reset_prefix_cache()
        host_tier.reset_prefix_cache()
    for rid in ids:
        req = scheduler.requests.get(rid)
        if req is not None:
            scheduler.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, error)


def recover_step(engine, out: Optional[SchedulerOutput], launched: bool, exc: Exception,
                 deltas: list) -> None:
    """After `engine.step()` failed: `out` is the step it scheduled (None if scheduling failed),
    `launched` whether it reached the device; final deltas go into `deltas` (rare path: a full
    scan of the engine's requests is fine here)."""
    outs = engine._inflight.abandon() + ([out] if out is not None and not launched else [])
    if engine.sampler.grammar_masks is not None:  # a mask filled ahead: its matchers are ours again
        engine.sampler.grammar_masks.join()
    scheduler = engine.scheduler
    loads = scheduler.has_loads
    if loads:  # host-tier copies in flight: let them finish before their blocks go back
        try:
            scheduler.land_all_loads()
        except Exception:  # a broken device: nothing more will write them
            pass
    scheduler.settle_all()  # the blocks of requests that ended meanwhile
    fail_scheduled(scheduler, engine.allocator, engine.host_tier,
                   outs if out is not None else None, exc, loads)
    for rid, req in list(engine._requests.items()):
        if req.is_finished:  # finished requests that were reported have no state left
            engine._drop_state(rid)
            deltas.append(final_delta(req))
