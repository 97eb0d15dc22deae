"""bench/sched_timeline.py's `SchedTimeline` on a real scheduler: it records the steps it sees and
leaves the scheduler as it found it, so one engine can be timed run after run (throughput.py
times each request kind under its own timeline)."""

from bench.sched_timeline import SchedTimeline
from tests.unit.scheduler_harness import Harness


def _run(h, rid):
    h.add(rid, [5, 6, 7], max_tokens=2, ignore_eos=True)
    while h.sched.has_unfinished():
        h.step()


def test_entered_twice_and_the_scheduler_is_restored():
    h = Harness()
    own = h.sched.wait_load  # an instance attribute: it must come back, not be deleted
    for rid in ("a", "b"):
        with SchedTimeline(h.sched) as tl:
            assert h.sched.wait_load is not own and "schedule" in h.sched.__dict__
            _run(h, rid)
        assert len(tl.steps) >= 2 and {s[1] for s in tl.steps} == {1}  # a prefill, then a decode step
        assert h.sched.wait_load is own
        assert "schedule" not in h.sched.__dict__ and "finish" not in h.sched.__dict__
    h.assert_all_free()
