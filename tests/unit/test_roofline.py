"""bench/roofline.py: the workload ceiling's KV bytes follow the cache's own layout, so an int8
cache's ceiling counts codes plus scales (132 of 256 bytes a row at head_dim 128)."""

import pytest

from bench.roofline import model_numbers, workload_ceiling

DEV = {"copy_GBps": 4000.0, "bf16_TFLOPs": 700.0}


def test_int8_kv_bytes_are_codes_plus_scales():
    bf16, int8 = model_numbers("qwen3-0.6b-shape"), model_numbers("qwen3-0.6b-shape", "int8")
    # Qwen3-0.6B: 28 layers, 8 KV heads, head_dim 128; K and V
    assert bf16["kv_bytes_per_token"] == 2 * 28 * 8 * 128 * 2
    assert int8["kv_bytes_per_token"] == 2 * 28 * 8 * (128 + 4)
    assert int8["weight_bytes"] == bf16["weight_bytes"]


def test_int8_ceiling_lowers_only_the_decode_floor():
    prompts, outs = [100, 900, 512], [300, 50, 1000]
    bf16 = workload_ceiling("qwen3-0.6b-shape", prompts, outs, 256, DEV)
    int8 = workload_ceiling("qwen3-0.6b-shape", prompts, outs, 256, DEV, kv_cache_dtype="int8")
    assert int8["prefill_floor_s"] == pytest.approx(bf16["prefill_floor_s"])
    weights_s = max(outs) * bf16["weight_bytes"] / (DEV["copy_GBps"] * 1e9)
    assert int8["decode_floor_s"] - weights_s == pytest.approx((bf16["decode_floor_s"] - weights_s) * 132 / 256)
    assert int8["ceiling_tokens_per_s"] > bf16["ceiling_tokens_per_s"]
