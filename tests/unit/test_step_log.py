"""bench/step_log.py: steps recorded by kind on one engine instance (host-scheduled and chained),
each step's time the gap to the next step or the round's end, a round's first (decode) step, and
the instance restored on close."""

from types import SimpleNamespace

import pytest

from bench import step_log
from bench.step_log import StepLog


def _out(*rows):
    """rows: (tokens, proposals) per request."""
    reqs = [SimpleNamespace(token_ids=[0] * n, num_spec_tokens=k) for n, k in rows]
    return SimpleNamespace(requests=reqs, is_empty=not reqs)


class FakeEngine:
    def __init__(self, outs):
        self.outs = list(outs)

    def _schedule_next(self):
        return self.outs.pop(0)

    def _chain(self):
        return self.outs.pop(0)


def test_kinds_gaps_and_first_steps(monkeypatch):
    clock = iter([1.0, 1.04, 1.05, 1.0515, 1.0528])
    monkeypatch.setattr(step_log.time, "perf_counter", lambda: next(clock))
    engine = FakeEngine([_out((900, 0), (800, 0)), _out((1, 0), (1, 0)), _out((4, 3), (1, 0)),
                         _out((3, 2), (2, 1)), None, _out(), _out((1, 0))])
    log = StepLog(engine)
    engine._schedule_next()  # 1.0: a prompt step
    engine._schedule_next()  # 1.04: plain
    engine._schedule_next()  # 1.05: a host-scheduled verify step
    engine._chain()          # 1.0515: a chained one
    assert engine._chain() is None and engine._schedule_next().is_empty  # neither recorded
    engine._schedule_next()  # 1.0528: plain
    log.round(0.99, 1.06)
    s = log.summary()
    assert s["prompt"] == {"steps": 1, "seconds": 0.04, "ms_each": 40.0}
    assert s["verify"]["ms_each"] == pytest.approx(1.5) and s["chained"]["ms_each"] == pytest.approx(1.3)
    assert s["plain"]["steps"] == 2 and s["plain"]["seconds"] == pytest.approx(0.01 + 0.0072)
    assert s["first_step_ms"] == pytest.approx(10.0) and s["first_decode_ms"] == pytest.approx(50.0)
    assert log.summary()["first_step_ms"] is None  # a summary starts over
    log.close()
    assert engine._schedule_next.__func__ is FakeEngine._schedule_next  # the instance restored
