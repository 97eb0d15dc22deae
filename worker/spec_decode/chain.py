"""Chained verify steps: the next verify step launched before this one's tokens are known.

Why: a verify step's proposals need its rows' tokens, so after each verify step the device
waited while the host collected it, proposed, scheduled and staged the next one. On the H200
(SmolLM2, batch 8, 2026-11-30) that was 0.36-0.41 ms of each 1.65 ms verify step, the largest
part of what kept batch 8 from its target. A chained step moves that dependency onto the device:
the host schedules it with placeholder positions while the step before is still in flight, and
a kernel (kernels/spec_chain.py), queued between the two forwards, verifies the step before,
appends the kept tokens to a device copy of each request's tokens, looks up the next proposals
by the same prompt-lookup rule, and writes the chained step's input ids, positions, KV slots and
context lengths. The host collects the step before while the chained one runs.

Owns: `VerifyChain`, the device state (each request's tokens, and per request slot the proposals
of the latest launched step, `meta`), `begin` (the state from the host, for the first step of a
chain), `plan` (each request's proposal positions), `launch` (a `ChainedStep`), `ChainedStep`,
which reads its own proposals back beside its draws and verifies them as `VerifyStep` does, and
`chain_draws` (the ids a chain starts from, after a verify step or a plain one).

When: prompt lookup, a single-rank runner, async scheduling, one step in flight, and it a verify
step of plain greedy requests (every proposal checked by argmax) that holds every running
request, no request waiting, and free blocks for both steps' proposals
(`Scheduler.chain`), where the host's tokens still propose something (`worth_waiting`) and
`plan` finds a request whose text repeats. A chain also starts from a plain decode step in
flight (`chain_draws`: every row a plain greedy request's one token) once the tokens on the host
propose something again: the plan then takes the host's lookup counts, and the kernel appends
the plain step's draw (a row of no proposals) before it looks up. Without that, the first verify
step after a stretch of plain steps waited for the last of them on the host, as every verify
step did before chains (`INFER_CLUSTER_SPEC_CHAIN_PLAIN=0`, `bench/spec_decode.py --runs
on_noplain`). A request that ends (a stop inside a burst, max_tokens, an abort) is left out of
the next chained step and the chain goes on with the others (their state rows stay where
`begin` put them: `slot_of`); the rows it got in the steps in flight are dropped, as for any
step scheduled before an end. A request that joins ends the chain.
Exact: every kept token is still the argmax at its position given the tokens kept before it;
only which proposals are checked differs (a request gets the positions `plan` gave it, filler
where its lookup found fewer tokens, and the filler is never counted as a proposal: it is
neither kept nor reported).
`INFER_CLUSTER_SPEC_CHAIN=0` turns it off (`bench/spec_decode.py --runs on_nochain`).
Must never: let the host and the device disagree on a token (the host checks each chained step's
token count against its own).
"""

from __future__ import annotations

from typing import Optional

import torch

from infer_cluster.kernels.dispatch import env_switch
from infer_cluster.kernels.spec_chain import META_HEAD, chain_inputs
from infer_cluster.worker.device.to_host import to_host
from infer_cluster.worker.device.wait import wait_event
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.spec_decode.verify import _DROPPED_ROW, VerifyStep, _chainable, decode_shaped

CHAIN_ENV = "INFER_CLUSTER_SPEC_CHAIN"
CHAIN_PLAIN_ENV = "INFER_CLUSTER_SPEC_CHAIN_PLAIN"  # 0: chains start after verify steps only


def chain_enabled() -> bool:
    """Off with `INFER_CLUSTER_SPEC_CHAIN=0` (the A/B)."""
    return env_switch(CHAIN_ENV)


class VerifyChain:
    def __init__(self, k: int, min_n: int, max_n: int, slots: int, max_model_len: int,
                 block_size: int, device: torch.device):
        """Room for `slots` requests of `max_model_len` tokens and k proposals each (4 bytes a
        token: 0.8 MB for 24 requests of SmolLM2's 8,192)."""
        self.min_n, self.max_n, self.slots, self.block_size = min_n, max_n, slots, block_size
        self.hist = torch.zeros(slots, max_model_len, dtype=torch.int32, device=device)
        self.meta = torch.zeros(slots, META_HEAD + k + 1, dtype=torch.int32, device=device)
        self.k = k
        self.device = device
        # request id -> tokens its latest collected lookup found after the match (0: its text
        # does not repeat now); read by `plan`, written by `ChainedStep.wait`
        self.found: dict[str, int] = {}
        self.slot_of: dict[str, int] = {}  # request id -> its row of `hist` / `meta` (this chain's)
        self.from_plain = env_switch(CHAIN_PLAIN_ENV)  # a chain may start after a plain step
        if device.type == "cuda":
            self._compile()

    def _compile(self) -> None:
        """Run the kernel once on scratch tensors, so it compiles now and not in a served step."""
        z64 = torch.zeros(4, dtype=torch.int64, device=self.device)
        meta = torch.zeros(1, self.meta.shape[1], dtype=torch.int32, device=self.device)
        meta[0, 0] = 1
        layout = torch.tensor([[0], [1], [0]], dtype=torch.int32, device=self.device)
        chain_inputs(z64, torch.zeros(1, 8, dtype=torch.int32, device=self.device), meta, layout, self.min_n,
                     self.max_n, torch.zeros(2, 2, dtype=torch.int32, device=self.device), self.block_size,
                     z64.clone(), z64.clone(), z64.clone(), torch.zeros(4, dtype=torch.int32, device=self.device))

    def plan(self, before, request_ids: list[str], max_rows: int,
             host_found: Optional[list[int]] = None) -> Optional[list[int]]:
        """Proposal positions for each of `request_ids` (requests of `before`) in a chained step
        after `before`, or None (no request's text repeats now). A request whose latest lookup
        found nothing gets none (one row); the others share what is left of `max_rows` evenly,
        each at most k and at most what its lookup found, the rows one leaves going to the rest
        (fewest first). The latest lookup: the device's, collected, within a chain; at its start
        the host's: `before`'s proposals, or `host_found` (after a plain step: what the tokens
        on the host propose, one count a request)."""
        if isinstance(before, ChainedStep):
            found = [self.found.get(rid) for rid in request_ids]
        elif host_found is not None:
            found = list(host_found)
        else:
            host = {s.request_id: s.num_spec_tokens for s in before.out.requests}
            found = [host[rid] for rid in request_ids]
        ks = [0] * len(found)
        hot = sorted((f if f is not None else self.k, i) for i, f in enumerate(found) if f != 0)
        if not hot:
            return None
        budget = max_rows - (len(found) - len(hot))  # the cold ones' one row each
        for n, (cap, i) in enumerate(hot):
            left = len(hot) - n
            ks[i] = max(0, min(self.k, cap, budget // left - 1))
            budget -= ks[i] + 1
        return ks if any(ks) else None

    def begin(self, step, requests: dict, found: Optional[dict] = None) -> None:
        """Load the device state from the host for the requests of `step`, a step in flight
        launched by the host (a verify step, or a plain decode step: no proposals, a row each):
        their tokens before it, its proposals and rows. `found`: request id -> what the host's
        lookup found (default: the step's proposals)."""
        out = step.out
        m = len(out.requests)
        lengths = [requests[s.request_id].num_tokens for s in out.requests]
        width = max(lengths)
        hist = torch.zeros(m, width, dtype=torch.int32)
        meta = torch.zeros(m, self.meta.shape[1], dtype=torch.int32)
        first = 0
        self.found = dict(found) if found is not None else {s.request_id: s.num_spec_tokens
                                                           for s in out.requests}
        self.slot_of = {s.request_id: i for i, s in enumerate(out.requests)}
        for i, s in enumerate(out.requests):
            tokens = requests[s.request_id].all_token_ids
            hist[i, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            k = s.num_spec_tokens
            meta[i, :META_HEAD + k] = torch.tensor([len(tokens), first, k, k, *s.token_ids[1:]], dtype=torch.int32)
            first += k + 1
        self.hist[:m, :width].copy_(hist, non_blocking=True)
        self.meta[:m].copy_(meta, non_blocking=True)

    def launch(self, out: SchedulerOutput, draws: torch.Tensor, max_rows: int, runner, sampler,
               requests: dict, stats, governor, recorder) -> "ChainedStep":
        """Run the chained step `out` (`Scheduler.chain`; its requests are the step before's,
        or those of them still running, in its order). `draws`: the step before's argmax ids,
        one a row (`chain_draws`); `max_rows`: the most positions run as decode rows."""
        firsts, ks, slots, first = [], [], [], 0
        for s in out.requests:
            firsts.append(first)
            ks.append(s.num_spec_tokens)
            slots.append(self.slot_of[s.request_id])
            first += s.num_spec_tokens + 1
        layout = torch.tensor([firsts, ks, slots], dtype=torch.int32).to(self.device, non_blocking=True)

        def fill(input_ids, positions, slot_mapping, seq_lens, block_tables):
            chain_inputs(draws, self.hist, self.meta, layout, self.min_n, self.max_n, block_tables,
                         self.block_size, input_ids, positions, slot_mapping, seq_lens)

        rows = decode_shaped(out, max_rows) or out
        ids_only = runner.takes_greedy_ids
        result, row_ids = runner.execute(rows, greedy_ids=ids_only, fill_inputs=fill)
        ids = result if ids_only else result.argmax(dim=-1)
        stats.num_chained_steps += 1
        return ChainedStep(out, ids, row_ids, self.meta, slots, requests, sampler, stats, governor, recorder,
                           runner, max_rows, self.found)


class ChainedStep(VerifyStep):
    """A verify step whose proposals were made on the device: `wait` reads them (the kernel's
    `meta` rows, copied behind the step) and verifies as `VerifyStep` does."""

    def __init__(self, out: SchedulerOutput, ids: torch.Tensor, row_ids: list[str], meta: torch.Tensor,
                 slots: list[int], requests: dict, sampler, stats, governor, recorder, runner, max_rows: int,
                 found: Optional[dict] = None):
        """`meta`: the chain's state (`slots`: each request's row of it); `requests`: the
        scheduler's live requests by id (`wait` checks their token counts); `found`: the chain's
        `VerifyChain.found`, which `wait` updates."""
        self._requests, self._slots = requests, slots
        self._found = found if found is not None else {}
        self.out, self._stats, self._governor, self.max_rows = out, stats, governor, max_rows
        self._verify, self._gave_up = runner.verify_step, runner.wait_gave_up
        self.chain_ids = ids
        self._meta = to_host(meta)  # before the next chained step's kernel rewrites it
        self.draw = sampler.draw_greedy_ids(ids, [_DROPPED_ROW] * len(row_ids))
        self._send(recorder)
        self._groups = None  # known once `wait` has the proposals

    def wait(self, sampler):
        if self._event is not None:
            wait_event(self._event, self._gave_up)
        self._groups, first = [], 0
        state = self._meta.tolist()
        for s, slot in zip(self.out.requests, self._slots):
            length, _, num, avail, *proposals = state[slot]
            self._found[s.request_id] = avail
            req = self._requests.get(s.request_id)
            if req is not None and not req.is_finished and req.num_tokens != length:
                raise RuntimeError(f"chained verify step out of step with the host: request "
                                   f"{s.request_id} holds {req.num_tokens} tokens, the device {length}")
            self._groups.append((s.request_id, first, proposals[:num]))
            first += s.num_spec_tokens + 1
        return super().wait(sampler)


def chain_draws(before, requests: dict, eos_token_ids) -> Optional[torch.Tensor]:
    """The argmax ids, one a row, that a chained step after `before` (a step in flight) starts
    from, or None where none may follow it: a verify step's `chain_ids` (set where its requests
    are plain greedy), or the draws of a plain decode step whose every row is a plain greedy
    request's one token (`_chainable`: then each id is the raw argmax), in its requests' order.
    A chain starting from a plain step spares the host-scheduled verify step that would start it
    otherwise: collecting the step, proposing and scheduling while the device waits."""
    if isinstance(before, VerifyStep):
        return before.chain_ids
    draw = getattr(before, "draw", None)  # None: a deferred draw, not queued yet
    if (draw is None or before.row_ids != [s.request_id for s in before.out.requests]
            or any(s.num_spec_tokens for s in before.out.requests)  # a row a request, no proposals
            or not _chainable(before.out, requests, eos_token_ids)):  # (also: some request)
        return None
    return draw.token_ids


def chained_requests(before, running: list, waiting: bool) -> Optional[list]:
    """The requests of a chained step after `before` (a step `chain_draws` gave ids for): the
    running ones, every one of them a request of `before` (those of its requests that ended
    meanwhile are left out), in its order; or None where there can be none: a request waits,
    or one runs that `before` does not hold."""
    if waiting or not running:
        return None
    by_id = {req.request_id: req for req in running}
    reqs = [by_id[s.request_id] for s in before.out.requests if s.request_id in by_id]
    return reqs if len(reqs) == len(running) else None
