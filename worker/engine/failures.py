"""What a failed step does to its requests (a device fault must not take the other requests'
replies down): `fail_scheduled` ends the requests of the failed steps as FAILED, and every
request when scheduling itself failed or host-tier copies may be half done (then no cached KV
is trusted). The engine sends their final deltas afterwards. Plain Python over the scheduler."""

from __future__ import annotations

from typing import Optional

from infer_cluster.protocol import EngineError, FinishReason, RequestStatus

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
