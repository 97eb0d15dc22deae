"""bench/host_timers.py: the timers count every call of a function and of a method, also where a
module imported the function by name, and everything is as it was after the block."""

import numpy as np

from bench.host_timers import HostTimers
from infer_cluster.worker.sampling import row_plans, sampler
from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sampling.draw_io import SamplingRequestState

TARGETS = [("infer_cluster.worker.sampling.row_plans", "rows_with"),
           ("infer_cluster.worker.sampling.row_plans", "RowPlans.slots")]


def test_timers_count_calls_and_restore_everything():
    before = (row_plans.rows_with, sampler.rows_with, row_plans.RowPlans.__dict__["slots"])
    rows = [SamplingRequestState(SamplingParams(temperature=0.0), [1, 2], [], None, (2,), f"r{i}")
            for i in range(3)]
    with HostTimers(TARGETS) as timers:
        assert sampler.rows_with is row_plans.rows_with is not before[0]  # the imported name too
        plans = row_plans.RowPlans()
        for _ in range(4):
            plans.slots(rows, 100, [])
        assert sampler.rows_with(np.array([1, 0, 3]), 1) == [0, 2]  # called through the importer
        row_plans.rows_with(np.array([2]), 2)
    got = {r["name"]: r for r in timers.table()}
    assert got["RowPlans.slots"]["calls"] == 4 and got["rows_with"]["calls"] == 2
    assert all(r["seconds"] >= 0 and r["us_per_call"] >= 0 for r in got.values())
    after = (row_plans.rows_with, sampler.rows_with, row_plans.RowPlans.__dict__["slots"])
    assert all(a is b for a, b in zip(before, after))
