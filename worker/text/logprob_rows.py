"""Logprob entries built when they are needed, not on the step's critical path.

Owns: `LogprobRows` (one step's logprobs as the sampler read them back: two flat host lists),
`DeferredLogprob` (one row's entry, not built yet) and `resolve_logprobs(deltas)`, which turns
deferred entries in raw engine deltas into the public form `[sampled_logprob, {alt_id:
logprob}]`. Plain Python: no torch, so the text stage may import it.

Why: building 256 small dicts per step costs ~0.2 ms of host time right after the step's only
sync, when the next step is waiting to be scheduled. The engine puts deferred entries in its raw
deltas; whoever turns raw deltas into client deltas (`TextStage.process`, on the text thread for
`LLM.generate` and replicas) builds them off the engine loop. An engine without a text stage of
its own resolves them itself unless told that a text stage downstream will
(`DynamicEngine.defer_logprobs`).

To extend: a new per-token logprob field (e.g. ranks) goes into `LogprobRows.entry`.
"""

from __future__ import annotations

from typing import Sequence


class LogprobRows:
    __slots__ = ("values", "ids", "width", "k")

    def __init__(self, values: list, ids: list, k: int):
        self.values = values  # per row: the sampled token's logprob, then k alternatives'
        self.ids = ids        # per row: the k alternatives' token ids
        self.width = 1 + k
        self.k = k

    def entry(self, j: int, num: int) -> list:
        """Row j's entry with its first `num` (<= k) alternatives."""
        v0, a0 = j * self.width, j * self.k
        return [self.values[v0], dict(zip(self.ids[a0:a0 + num], self.values[v0 + 1:v0 + 1 + num]))]


class DeferredLogprob:
    __slots__ = ("rows", "j", "num")

    def __init__(self, rows: LogprobRows, j: int, num: int):
        self.rows, self.j, self.num = rows, j, num

    def build(self) -> list:
        return self.rows.entry(self.j, self.num)


def resolve_logprobs(deltas: Sequence) -> None:
    """In place: every deferred entry in the deltas' `logprobs` becomes its public form."""
    for d in deltas:
        lps = d.logprobs
        if not lps:
            continue
        if len(lps) == 1:  # the usual delta: one token
            e = lps[0]
            if type(e) is DeferredLogprob:
                d.logprobs = [e.build()]
        elif any(type(e) is DeferredLogprob for e in lps):
            d.logprobs = [e.build() if type(e) is DeferredLogprob else e for e in lps]
