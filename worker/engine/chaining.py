"""`launch_chained`: where a chained verify step may follow the step in flight, schedule
and launch it (worker/spec_decode/chain.py says what a chained step is and when it runs; here
is the engine's side: the conditions on its steps in flight and queues, the schedule
(`Scheduler.chain`), the governor's clock, host-tier copies, the chain's state at a chain's
first step, and the launch). Plain Python over the engine's parts, like failures.py."""

from __future__ import annotations

from typing import Optional

from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.spec_decode.chain import ChainedStep, chain_draws, chained_requests
from infer_cluster.worker.spec_decode.verify import VerifyStep


def launch_chained(engine) -> Optional[SchedulerOutput]:
    """The chained step's output once launched, or None with nothing changed (no chain, the
    step in flight is neither a chain's verify step nor a plain decode step of plain greedy
    requests, a request waits or joined, too many requests for the chain's slots, no request's
    text repeats, or too few free blocks). After a plain step the chain starts from its draws
    and the host's lookups (`chain_draws`, `SpecDecoder.host_lookups`)."""
    chain, inflight, sched = engine.spec_chain, engine._inflight, engine.scheduler
    if (chain is None or len(inflight) != 1 or inflight.awaiting_draw or engine.structured.parked
            or len(sched.running) > chain.slots):  # two rows a request: at most the slots
        return None
    before = inflight.steps[0]
    verify = isinstance(before, VerifyStep)
    draws = chain_draws(before, sched.requests, engine.eos_token_ids) if verify or chain.from_plain else None
    reqs = chained_requests(before, sched.running, bool(sched.waiting)) if draws is not None else None
    if reqs is None:
        return None
    decoder = engine.spec_decoder
    ids = [r.request_id for r in reqs]
    found = None
    if verify:
        # Text that stopped repeating: where no row's suffix recurs in the tokens on the host,
        # the host path runs an ordinary step (a chained one would verify only filler).
        ks = chain.plan(before, ids, decoder.max_rows)
        if ks is None or not decoder.worth_waiting(reqs):
            return None
    else:  # a plain step: what the tokens on the host propose (its own token is on the device)
        found = decoder.host_lookups(reqs)
        ks = chain.plan(before, ids, decoder.max_rows, found)  # None where none found anything
        if ks is None:
            return None
    in_flight = {s.request_id: s.num_spec_tokens for s in before.out.requests}
    out = sched.chain(reqs, [in_flight[r.request_id] for r in reqs], ks)
    if out is None:
        return None
    decoder.start_step(out, True)
    if out.has_swaps:  # blocks taken from the prefix cache go to the host tier first
        engine.runner.swap_blocks(out)
    if not isinstance(before, ChainedStep):  # the chain's first step: its state from the host
        chain.begin(before, sched.requests, None if found is None else dict(zip(ids, found)))
    inflight.steps.append(chain.launch(out, draws, decoder.max_rows, engine.runner, engine.sampler,
                                       sched.requests, decoder.counters, decoder.governor,
                                       decoder.recorder))
    return out
