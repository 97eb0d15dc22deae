"""`bench/prepare_cost.py` runs, and what it measures holds: preparing a steady decode step's
inputs (async scheduling: every row continues the previous draw's row of its index) dispatches
no tensor operation at all, so on a GPU it launches no kernel between two graph replays; the
decode graphs' own path (`GraphInputs.stage`) dispatches two copies on the CPU: the transfer (a
Triton read on CUDA, not a tensor op) and the previous draw's ids."""

import json

from bench.prepare_cost import main


def test_a_steady_step_dispatches_nothing(tmp_path):
    out = tmp_path / "prepare_cost.json"
    assert main(["--batch", "1", "3", "--calls", "3", "--repeats", "1", "--context", "40",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["ops"], r["op_names"]) for r in rows] == [(1, 0, []), (3, 0, [])]
    assert all(r["prepare_us"] > 0 and r["classify_greedy_us"] > 0 and r["classify_sampled_us"] > 0
               for r in rows)
    assert [(r["graph_inputs_ops"], r["graph_inputs_op_names"]) for r in rows] == [(2, ["copy_"])] * 2
    assert all(r["graph_inputs_us"] > 0 for r in rows)
