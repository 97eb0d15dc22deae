"""bench/targets.py: the table `gpu_suite.sh targets` ends with, from its JSON files. Each share
is a run over the ceiling measured before it, seeds pair bf16 with int8, and a figure below its
target is marked."""

import json

from bench.targets import report, rows


def _write(d, name, obj):
    (d / name).write_text(json.dumps(obj))


def _roofline(ceiling, copy=4200.0):
    return {"ceiling_tokens_per_s": ceiling, "device": {"copy_GBps": copy}}


def _run(tps, commit="abc1234", idle_ms=None):
    ours = {"tokens_per_s": tps}
    if idle_ms is not None:
        ours["step_timeline"] = {"gpu_idle_between_steps_ms": idle_ms}
    return {"ours": ours, "run": {"commit": commit}}


def test_shares_ratios_and_marks(tmp_path):
    _write(tmp_path, "roofline_s0.json", _roofline(34000.0))
    _write(tmp_path, "wla_s0.json", _run(29240.0))            # 86%: meets 85%
    _write(tmp_path, "roofline_s0_int8.json", _roofline(60000.0))
    _write(tmp_path, "wla_s0_int8.json", _run(42000.0, idle_ms=117.3))  # 1.436x: below 1.5x
    _write(tmp_path, "roofline_s1.json", _roofline(35000.0))
    _write(tmp_path, "wla_s1.json", _run(28700.0))            # 82%: below
    _write(tmp_path, "decode_grid.json", {"rows": [
        {"batch": 256, "kv": "bf16", "context": 128, "of_copy": 0.80},
        {"batch": 256, "kv": "bf16", "context": 512, "of_copy": 0.99},
        {"batch": 128, "kv": "int8", "context": 128, "of_copy": 0.51}]})
    got = rows(str(tmp_path))
    assert [r["seed"] for r in got] == [0, 1]
    assert abs(got[0]["bf16"]["share"] - 29240 / 34000) < 1e-12
    assert abs(got[0]["int8_over_bf16"] - 42000 / 29240) < 1e-12
    assert got[1]["int8"]["tok_s"] is None and got[1]["int8_over_bf16"] is None
    assert got[0]["int8"]["idle_ms"] == 117.3 and got[0]["bf16"]["idle_ms"] is None
    lines = report(str(tmp_path)).splitlines()
    seed0, seed1 = lines[1], lines[2]
    assert "86.0%" in seed0 and "86.0% <" not in seed0 and "1.436x <" in seed0 and " 117 " in seed0
    assert "82.0% <" in seed1
    bf16_256 = next(line for line in lines if "256  bf16" in line)
    assert "128: 80% <" in bf16_256 and "512: 99%" in bf16_256 and "99% <" not in bf16_256
    # batch 128 has no target: nothing marked there
    assert "<" not in next(line for line in lines if "128  int8" in line)
