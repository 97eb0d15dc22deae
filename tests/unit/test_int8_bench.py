"""`bench/int8_decode.py --variants` winner selection: only variants that matched the reference
count, per case the fastest, overall the best geometric-mean speedup over every case."""

import math

from bench.int8_decode import pick_winners, variant_configs


def _row(case, variant, config, ms, ok=True, base=1.0):
    return dict(case=case, variant=variant, config=config, ms=ms, speedup=base / ms, ok=ok,
                gbs=0.0, max_err=0.0)


def test_pick_winners():
    rows = [_row(c, "bf16 defaults", None, 1.0) for c in ("b256", "b1")]
    rows += [_row("b256", "int8 a", dict(cvt="a"), 0.5), _row("b1", "int8 a", dict(cvt="a"), 0.9),
             _row("b256", "int8 b", dict(cvt="b"), 0.6), _row("b1", "int8 b", dict(cvt="b"), 0.6),
             # fastest everywhere but wrong: never picked
             _row("b256", "int8 bad", dict(cvt="bad"), 0.1, ok=False),
             _row("b1", "int8 bad", dict(cvt="bad"), 0.1, ok=False),
             # fast on one case, missing (failed to launch) on the other: not an overall pick
             _row("b1", "int8 half", dict(cvt="half"), 0.2)]
    per_case, overall = pick_winners(rows)
    assert per_case["b256"]["variant"] == "int8 a"
    assert per_case["b1"]["variant"] == "int8 half"
    # a: sqrt(2 * 1.11) = 1.49; b: sqrt(1.67 * 1.67) = 1.67
    assert overall["variant"] == "int8 b" and overall["config"] == dict(cvt="b")
    assert math.isclose(overall["geomean"], 1 / 0.6)


def test_pick_winners_none_correct():
    rows = [_row("b1", "bf16 defaults", None, 1.0), _row("b1", "int8 x", {}, 0.5, ok=False)]
    assert pick_winners(rows) == ({}, None)


def test_variant_configs_are_valid_and_distinct():
    from infer_cluster.kernels.attention_triton import CVT_MODES, DECODE_INT8
    configs = variant_configs()
    assert len(configs) == len({tuple(sorted(c.items())) for c in configs})
    assert {c["cvt"] for c in configs} == set(CVT_MODES)
    assert all(set(c) <= set(DECODE_INT8) | {"maxnreg"} for c in configs)


def test_round2_configs_skip_spills_and_defaults():
    from bench.int8_decode import ROUND2_SPILLS, round2_configs
    from infer_cluster.kernels.attention_triton import CVT_MODES, DECODE_INT8
    configs = round2_configs()
    assert len(configs) == len({tuple(sorted(c.items())) for c in configs})
    assert all(set(c) <= set(DECODE_INT8) | {"maxnreg"} and c["cvt"] in CVT_MODES
               for c in configs)
    full = [dict(DECODE_INT8, **c) for c in configs]
    assert DECODE_INT8 not in full  # the defaults are timed once, as "int8 defaults"
    keys = {(c["cvt"], c["block_n"], c["num_stages"], c.get("maxnreg")) for c in full}
    assert not keys & ROUND2_SPILLS
    # every operand pair that K and V can mix is there, and small-batch split rules
    assert {"words", "words_v", "prmt_v", "words_k", "load_k_words_v"} <= {c["cvt"] for c in full}
    assert any(c["small_per_sm"] for c in full)
