"""Where a round's wall time goes, step by step, on one engine (bench/spec_decode.py --step-log).

Owns: `StepLog(engine)`, which wraps one `DynamicEngine` instance's step launches (never the
class): every step it schedules (`_schedule_next`) and every chained verify step
(`_chain`, worker/spec_decode/chain.py) is recorded with its start and kind: `prompt` (a
prompt chunk in it), `verify` (proposals, host-scheduled), `chained` (proposals, written on the
device), `plain`. `round(t0, t1)` marks a round of requests; `summary()` gives, over the rounds
marked since the last summary, each kind's steps, seconds (a step's time is the gap to the next
step's start, or to the round's end) and ms a step, and the mean ms from a round's start to its
first step and to its first step without a prompt. Why: a speculating engine's round at batch 8
differs from speculation off's in its prompt phase as well as its decode steps (H200,
2026-11-30: ~10 ms more from a round's start to its first decode step), and the ratio alone
does not say where. Bench-only: restores the instance on `close()`.
"""

from __future__ import annotations

import time
from collections import defaultdict

KINDS = ("prompt", "verify", "chained", "plain")


class StepLog:
    def __init__(self, engine):
        self.engine = engine
        self.steps: list[tuple[float, str]] = []
        self.rounds: list[tuple[float, float]] = []
        schedule_next, chain = engine._schedule_next, engine._chain

        def logged_schedule_next():
            out = schedule_next()
            if not out.is_empty:
                self._add(out, chained=False)
            return out

        def logged_chain():
            out = chain()
            if out is not None:
                self._add(out, chained=True)
            return out

        engine._schedule_next, engine._chain = logged_schedule_next, logged_chain

    def _add(self, out, chained: bool) -> None:
        if any(len(s.token_ids) > 1 + s.num_spec_tokens for s in out.requests):
            kind = "prompt"
        elif any(s.num_spec_tokens for s in out.requests):
            kind = "chained" if chained else "verify"
        else:
            kind = "plain"
        self.steps.append((time.perf_counter(), kind))

    def round(self, t0: float, t1: float) -> None:
        self.rounds.append((t0, t1))

    def summary(self) -> dict:
        """Per kind {steps, seconds, ms_each}, plus `first_step_ms` and `first_decode_ms`
        (means over the rounds); then starts over."""
        kinds = defaultdict(lambda: [0, 0.0])
        first, first_decode = [], []
        for t0, t1 in self.rounds:
            steps = [s for s in self.steps if t0 <= s[0] < t1]
            if not steps:
                continue
            first.append(steps[0][0] - t0)
            decode = next((t for t, kind in steps if kind != "prompt"), None)
            if decode is not None:
                first_decode.append(decode - t0)
            for (t, kind), nxt in zip(steps, [s[0] for s in steps[1:]] + [t1]):
                kinds[kind][0] += 1
                kinds[kind][1] += nxt - t
        self.steps, self.rounds = [], []
        out = {kind: {"steps": n, "seconds": round(s, 4), "ms_each": round(1e3 * s / n, 3)}
               for kind, (n, s) in sorted(kinds.items(), key=lambda kv: KINDS.index(kv[0]))}
        out["first_step_ms"] = round(1e3 * sum(first) / len(first), 2) if first else None
        out["first_decode_ms"] = round(1e3 * sum(first_decode) / len(first_decode), 2) if first_decode else None
        return out

    def close(self) -> None:
        for name in ("_schedule_next", "_chain"):
            self.engine.__dict__.pop(name, None)
