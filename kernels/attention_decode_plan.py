"""The decode kernel's launch plan: its config and its split count, from shapes only.

Owns: `decode_config` (tile tokens, warps, stages, the split rule, int8 operand conversions),
the tuned defaults `DECODE_TUNED` / `DECODE_INT8`, `RUNS_PROGRAMS_PER_SM` (the split rule's
target for a verify step's runs), `plan_decode_splits`, and the PDL preload rule
(`preload_enabled`, `_one_wave`). Host Python only; the kernels and `decode_attention`, which
uses all of this, are in `attention_decode_triton`. Everything here reads shapes, dtypes and the
device, never `seq_lens` values, so a decode step stays capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton

from .dispatch import env_switch

_MIN_PARTITION = 256      # tokens; shorter partitions cost more in the reduce than they save
_MAX_SPLITS = 256
_sm_counts: dict[int, int] = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _sm_counts:
        _sm_counts[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _sm_counts[idx]


# Decode launch config for CUDA fp16/bf16 with head_dim <= 128, tuned on an H100 with
# bench/tune_decode.py (results and the rejected variants in docs/kernels.md): tile tokens,
# warps, pipeline depth, and the split rule (programs_per_sm, min_partition).
DECODE_TUNED = dict(block_n=64, num_warps=4, num_stages=2, programs_per_sm=2,
                    min_partition=256, reduce_warps=4, small_per_sm=4, small_programs=128)
# "small_per_sm" / "small_programs": 4 programs a SM where a call has at most 128 (sequence, KV
# head) items (16 sequences at 8 KV heads), so few long contexts split finer. H200, 2026-11-30,
# f996dc5 (bench/decode_grid.py --spread 0.9 --longest-first, forced split counts in the same
# run, ms at ~512 / 1,024 / 2,048 tokens): batch 16, 5 splits against the 2-a-SM rule's 3,
# 0.0170 / 0.0267 / 0.0439 against 0.0179 / 0.0292 / 0.0474; batch 12, 6 against 3, 0.0176 /
# 0.0221 / 0.0381 against 0.0174 / 0.0257 / 0.0458; batch 8, 9 against 5, 0.0142 / 0.0200 /
# 0.0271 against 0.0131 / 0.0197 / 0.0323; batch 4, 16 against 9, 0.0113 / 0.0142 / 0.0192
# against 0.0114 / 0.0151 / 0.0211. Long contexts gain 7-17%, ~512 tokens +-8% (the noise).
# The wave rule's keys for DECODE_TUNED at head_dim 128 ("resident_per_sm" / "wave_fill",
# `wave_splits`): where the split rule gives one partition, a grid of more than one wave
# (resident programs x SMs) whose last wave would be under `wave_fill` full splits each context
# in two. Three a SM is what the wave edges measured below say (the unsplit build under ncu:
# 116 registers and 38.9 KB of shared memory, one K/V buffer; `gpu_suite.sh decode_ncu`). H200, 2026-11-30 (forced split counts, CUDA-graph replays, 4,096-token tables,
# contexts +-25% around 512 / 1,024 / 2,048), two partitions against one: batch 64 (512
# programs, 1.29 waves) 1.09x / 1.16x / 1.18x; batch 128 (2.59 waves) 1.00x / 1.03x / 1.05x;
# batch 160 1.01x / 1.05x / 1.07x; batch 256 (5.17 waves) 0.99x / 1.01x / 1.03x; batches 48,
# 96 and 192 (0.97, 1.94 and 3.88 waves) lost 0-4%.
DECODE_WAVES_128 = dict(resident_per_sm=3, wave_fill=0.6)

# int8 caches on CUDA start from this one. "mma_k": q quantized to int8 per row once per program
# and q @ K^T on int8 tensor cores (no K conversion), V converted where it is loaded. H100,
# 2026-11-25, CUDA-graph replays vs the bf16 defaults in the same run (bench/int8_decode.py --cvt):
# b256 1.62x, b32 1.37x, b1 1.25x, against the earlier default "words_k" (K tiles read as int32
# words) 1.58x / 1.33x / 1.21x in that run; the first default "add" was 1.25x / 1.16x / 1.13x.
# Heads narrower than 32 take "prmt_load" for K (`cvt_ops`).
# "cvt" names how codes become fp16 MMA operands (`CVT_MODES`).
# Split rule keys (`plan_decode_splits`): "small_per_sm" programs per SM instead of
# "programs_per_sm" when num_seqs * num_kv_heads <= "small_programs" (None / 0: one rule).
# "q_smem_rounds" (`gluon_q_smem`): from 1.5 rounds of four programs a SM (792 programs on 132
# SMs: 99 sequences at 8 KV heads) the Gluon kernel keeps q's codes in shared memory and runs at
# 128 registers, four programs a SM. H200, 2026-12-01, 77aa951 (bench/decode_grid.py --kv int8
# --spread 0.9 --longest-first, two rounds alternating, GB/s at ~128 / 512 / 1,024 / 2,048
# tokens, four a SM against three): batch 256 1,950-1,960 / 3,490-3,496 / 3,852-3,854 / 3,982-3,987
# against 1,743-1,782 / 3,226-3,259 / 3,684-3,696 / 3,976-3,992; batch 128 +8% / +2-3% / +2-3% /
# level; batch 112 +8-11% / +3% / +3% / level; batch 96 -1-3% / -2% / -13% / -16%; batch 64 -2% /
# -17% / -19% / -19%. Workload A with int8 KV 39,291 / 39,332 tok/s against 38,995 / 39,012
# (alternating; from 1.0 rounds 39,159 / 39,048).
DECODE_INT8 = dict(DECODE_TUNED, block_n=128, cvt="mma_k", small_per_sm=None, small_programs=0,
                   q_smem_rounds=1.5, q_smem_maxnreg=128)

# The persistent decode kernel over float caches (kernels/attention_decode_persistent_gluon.py;
# `decode_config` key "persistent", INFER_CLUSTER_DECODE_PERSISTENT=0 keeps `_decode_kernel`):
# tile tokens, programs resident a SM (its grid), the rounds of unsplit items every program must
# get for it to take a call (`persistent_applies`), the share of one round from which it takes a
# call of at most one item a program ("one_round_from"; in between, and below, `_decode_kernel`
# splits the contexts), and a register cap (None: the build's own 149-168 a thread, three a SM).
# H200, 2026-11-30 (bench/decode_grid.py --spread 0.9 --longest-first, % of copy bandwidth at
# ~128 / 512 / 1,024 / 2,048 tokens): batch 256 85 / 106 / 109 / 112 against 55 / 89 / 100 /
# 108 for `_decode_kernel`; batch 128 73 / 100 / 105 / 105 against 51 / 87 / 98 / 106. Below
# two rounds (8 KV heads, 132 SMs; ms, persistent against `_decode_kernel`): batches 40 and 48
# (0.81 and 0.97 of a round) 5-13% faster at every context, 80 and 96 (1.6 and 1.9 rounds) 1-14%;
# batch 64 (1.3 rounds: a second round for a third of the programs) and batches 24-32 (under
# 0.7 of a round, where `_decode_kernel` splits long contexts) up to 13% slower at 1-2k tokens.
# Split contexts lost in this kernel (batch 128 at two partitions: 56 / 76 / 84 / 85; batch 64 at
# two or three 43-45 / 68-73 / 79-88 / 85-95 against 44 / 79 / 90 / 100), and so did four
# programs a SM at 128 registers, or two of 128-token tiles, by 0-5 points.
DECODE_PERSISTENT = dict(block_n=64, resident=3, min_rounds=1.5, one_round_from=0.75, maxnreg=None)

# Runs (`row_span`): programs per SM the split rule aims at, for a verify step's chunks. H200,
# 2026-11-29 (bench/verify_attention.py --variants, 8,192-token tables, ~1.3k-token contexts, us a
# layer, 1 against the plain rule's 2): SmolLM2 16 rows of one request 8.9 against 12.3, 48 rows
# of 8 requests 15.4 against 17.4; Qwen3-0.6B shape 17.6 against 23.2 and 31.7 against 36.9;
# 5 rows (k = 4) 8.1 and 11.1 against 8.1 and 16.8 (row by row: 10.5 and 12.5).
RUNS_PROGRAMS_PER_SM = 1


def decode_config(q, kv_dtype=None):
    """Default decode launch config, from dtypes, device and head_dim only: block_n (tokens per
    K/V tile), num_warps, num_stages, programs_per_sm and min_partition (the split rule, see
    `plan_decode_splits`), reduce_warps, cvt (int8 codes to operands, `CVT_MODES`; float caches
    ignore it); optional: "maxnreg" caps registers per thread, "small_per_sm" / "small_programs"
    a second split rule for small batches, "resident_per_sm" / "wave_fill" the wave rule
    (`plan_decode_splits`), "gluon" (int8: the Gluon kernel where it applies,
    kernels/attention_decode_gluon.py), "persistent" with "persistent_block_n" /
    "persistent_resident" / "persistent_min_rounds" / "persistent_one_round_from" /
    "persistent_maxnreg" (float caches: the
    persistent kernel where it applies, `DECODE_PERSISTENT`; "persistent_programs" forces it
    and its grid). `decode_attention(config=...)`
    overrides any of them (benchmarks, tests)."""
    if not q.is_cuda:  # interpreter: small tiles so tests cross tile and page boundaries
        return dict(block_n=16, num_warps=4, num_stages=1, programs_per_sm=None,
                    min_partition=_MIN_PARTITION, reduce_warps=4, cvt="add")
    if q.dtype == torch.float32 or q.shape[2] > 128:
        # float32 dots hold their operands in registers; 256-wide heads double the tiles.
        return dict(block_n=32, num_warps=8, num_stages=2, programs_per_sm=4,
                    min_partition=_MIN_PARTITION, reduce_warps=4, cvt="add")
    if kv_dtype == torch.int8:
        # "gluon": the Gluon build of the mma_k kernel where it applies (`decode_attention`);
        # INFER_CLUSTER_DECODE_GLUON=0 keeps the Triton kernel (A/B)
        return dict(DECODE_INT8, gluon=env_switch("INFER_CLUSTER_DECODE_GLUON"))
    waves = DECODE_WAVES_128 if q.shape[2] == 128 else {}  # measured there only
    # "persistent": INFER_CLUSTER_DECODE_PERSISTENT=0 keeps `_decode_kernel` (A/B)
    return dict(DECODE_TUNED, cvt="add", persistent=env_switch("INFER_CLUSTER_DECODE_PERSISTENT"),
                **{f"persistent_{k}": v for k, v in DECODE_PERSISTENT.items()}, **waves)


def persistent_applies(num_seqs: int, num_kv_heads: int, device, cfg) -> bool:
    """Whether the persistent kernel's grid (`persistent_resident` programs a SM) gets at least
    `persistent_min_rounds` items a program without splitting any context, or (where
    `persistent_one_round_from` is set) one item a program for at least that share of them."""
    slots = cfg["persistent_resident"] * _sm_count(device)
    items = num_seqs * num_kv_heads
    one_round = cfg.get("persistent_one_round_from")
    return (items >= cfg["persistent_min_rounds"] * slots
            or (one_round is not None and one_round * slots <= items <= slots))


def wave_splits(programs: int, slots: int, fill: float) -> int:
    """2 where a grid of `programs` (one partition a context) runs more than one wave of
    `slots` resident programs and its last wave is under `fill` full, else 1: splitting in two
    then evens out the waves (the tail wave otherwise leaves most SMs idle)."""
    if slots <= 0 or programs <= slots:
        return 1
    return 2 if (programs % slots) / slots < fill else 1


def plan_decode_splits(num_seqs, programs_per_seq, max_ctx, device, num_splits=None,
                       programs_per_sm=4, min_partition=_MIN_PARTITION, small_per_sm=None,
                       small_programs=0, resident_per_sm=None, wave_fill=0.0):
    """Context partitions per sequence, from shapes only (CUDA-graph safe): enough programs for
    `programs_per_sm` per SM (8 programs on the interpreter; `small_per_sm` instead when
    num_seqs * programs_per_seq <= `small_programs`), at most one per `min_partition`
    tokens of `max_ctx` (the most a block-table row can address) and `_MAX_SPLITS`.
    `num_splits` forces a count. Where that gives one partition, `resident_per_sm` and
    `wave_fill` may make it two (`wave_splits`; CUDA only). Each sequence's partition length is
    then derived in the kernel from its own length (`_split_part`), so the work is even whatever
    the table width."""
    if num_splits is None:
        if small_per_sm and num_seqs * programs_per_seq <= small_programs:
            programs_per_sm = small_per_sm
        target = 8 if device.type != "cuda" else programs_per_sm * _sm_count(device)
        by_ctx = triton.cdiv(max(max_ctx, 1), min_partition)
        num_splits = min(triton.cdiv(target, max(num_seqs * programs_per_seq, 1)), by_ctx, _MAX_SPLITS)
        if num_splits == 1 and resident_per_sm and device.type == "cuda" and wave_splits_enabled():
            num_splits = min(wave_splits(num_seqs * programs_per_seq, resident_per_sm * _sm_count(device),
                                         wave_fill), by_ctx)
    return max(1, int(num_splits))


def wave_splits_enabled() -> bool:
    """False when `INFER_CLUSTER_DECODE_WAVES=0` (A/B of `wave_splits`)."""
    return env_switch("INFER_CLUSTER_DECODE_WAVES")


def longest_first_enabled() -> bool:
    """False when `INFER_CLUSTER_DECODE_LONGEST_FIRST=0` (A/B of `decode_order`)."""
    return env_switch("INFER_CLUSTER_DECODE_LONGEST_FIRST")


def early_tile_enabled() -> bool:
    """False when `INFER_CLUSTER_DECODE_EARLY_TILE=0` (A/B of the Gluon int8 decode kernel's first
    tile issued before its prologue and, where it holds no row this step appends, before the
    PDL wait)."""
    return env_switch("INFER_CLUSTER_DECODE_EARLY_TILE")


def preload_enabled() -> bool:
    """False when `INFER_CLUSTER_DECODE_PRELOAD=0` (A/B of the K/V tile loaded before the PDL wait)."""
    return env_switch("INFER_CLUSTER_DECODE_PRELOAD")


def _one_wave(cfg, device) -> int:
    """Programs that run at once under the split rule's target (`programs_per_sm` per SM): the
    preload pays only where every program loads its tile while the kernel before drains."""
    per_sm = cfg.get("programs_per_sm") or 1
    return per_sm * (_sm_count(device) if device.type == "cuda" else 4)


def gluon_q_smem(cfg, programs: int, device) -> bool:
    """Whether the int8 Gluon decode takes its four-a-SM build (q's codes in shared memory,
    "q_smem_maxnreg" registers, `_reg_cap`): config "q_smem" forces it either way, else
    "q_smem_rounds" (None: never) is the grid's size from which it does, in rounds of four
    programs on every SM."""
    if cfg.get("q_smem") is not None:
        return bool(cfg["q_smem"])
    rounds = cfg.get("q_smem_rounds")
    return rounds is not None and device.type == "cuda" and programs >= rounds * 4 * _sm_count(device)


def _reg_cap(cfg, key: str = "maxnreg") -> dict:
    """The launch option capping registers per thread (config `key`, "maxnreg" or
    "persistent_maxnreg": more programs per SM at the risk of spills; bench/ptxas_check.py shows
    them), none when unset."""
    return {} if cfg.get(key) is None else dict(maxnreg=cfg[key])
