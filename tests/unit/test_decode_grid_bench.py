"""`bench/decode_grid.py --smoke`: the grid's script on the CPU interpreter, one tiny cell, bf16
and int8 KV: both rows checked against the reference and written to the JSON (the times mean
nothing there); forced split counts (`--splits`) add rows of their own; the context lengths stay
within +-25% of their bucket."""

import json

from bench.decode_grid import _lengths, main


def test_smoke_cell_matches_the_reference(tmp_path):
    out = tmp_path / "grid.json"
    rows = main(["--smoke", "--out", str(out)])
    assert [r["kv"] for r in rows] == ["bf16", "int8"]
    assert all(r["ok"] and r["ms"] > 0 and r["bytes"] > 0 for r in rows)
    assert rows[1]["bytes"] < rows[0]["bytes"]  # int8 codes and scales: fewer bytes to read
    assert json.loads(out.read_text())["rows"] == rows


def test_forced_splits_are_rows_of_their_own(tmp_path):
    rows = main(["--smoke", "--kv", "bf16", "--splits", "1", "2", "--out", str(tmp_path / "g.json")])
    assert [r["splits"] for r in rows] == ["default", 1, 2]
    assert all(r["ok"] for r in rows) and rows[0]["vs_bf16"] == 1.0 and rows[1]["vs_bf16"] is None


def test_lengths_spread_around_the_bucket():
    lens = _lengths(256, 1024, seed=3)
    assert len(lens) == 256 and min(lens) >= 768 and max(lens) <= 1280
    assert _lengths(256, 1024, seed=3) == lens and _lengths(4, 1, seed=0) == [1, 1, 1, 1]
