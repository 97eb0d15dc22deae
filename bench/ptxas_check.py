"""Register and spill check of the paged attention, int8 append and small-batch linear kernels for
sm_90, without a GPU.

Owns: the variants, the kernels at the launches their entry points pick: `_decode_kernel`,
`_prefill_kernel` and `_kv_append_int8_kernel` at the
Qwen3-0.6B head shape (16 query / 8 KV heads, page 16; prefill also at head_dim 64 and 256),
`_gemv_kernel` at the Qwen3-0.6B weight shapes for M = 1..16 (`gemv_variants`; qkv and gate_up
also with the add + RMSNorm prologue; one-chunk builds where the K slice is one chunk), the
fused `_qkv_prep_kernel` (bf16 and int8 caches, q/k norm on and off), the sampler's kernels
(`sampler_variants`: the draw, the top-p cut, the uniforms, the penalty state) and the split
argmax (`argmax_variants`), with the Gluon kernels' from bench/ptxas_gluon.py (the shapes and
strides here are theirs too); and the report: each built for sm_90 as the JIT would for
contiguous caches (bench/sm90_build.py), its registers and spill bytes, a count of cp.async
copies (pipelined loads), and its warpgroup MMAs: "async", "serial" where ptxas serialized them
(each waiting for the one before), "-" for none. Prints one row per variant; exits 1 if any
variant spills or has serialized warpgroup MMAs. Never runs a kernel.

  python bench/ptxas_check.py            # bf16 and int8 caches
  python bench/ptxas_check.py --int8-variants   # int8 decode per `CVT_MODES` x tile/warps, with
                                                # SASS counts of the loop-heavy instructions
  python bench/ptxas_check.py --int8-round2     # the kernels bench/int8_decode.py --round2 times
To add a variant: a row in `variants()` (kernel, pointer dtypes, integer arguments, constexprs,
launch options).
"""

from __future__ import annotations

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.sm90_build import SASS_KINDS, compile_sm90, ptxas_report, sass_counts  # noqa: E402

H, HK, PAGE = 16, 8, 16
DECODE_DNS = ("s_bt", "spo_s", "spo_h", "spl_s", "spl_h")  # the kernel's do_not_specialize


def _strides(d, int8):
    """Integer arguments for contiguous q/out [T, H, d], caches [B, PAGE, HK, d] and scales
    [B, HK, PAGE] (zeros when the cache is not int8: the kernel never reads them)."""
    s = dict(sq_t=H * d, sq_h=d, sq_d=1, sk_b=PAGE * HK * d, sk_s=HK * d, sk_h=d, sk_d=1,
             sv_b=PAGE * HK * d, sv_s=HK * d, sv_h=d, sv_d=1, s_bt=2560, so_t=H * d, so_h=d,
             so_d=1)
    sc = (HK * PAGE, PAGE, 1) if int8 else (0, 0, 0)
    s.update(zip(("sks_b", "sks_h", "sks_s"), sc))
    s.update(zip(("svs_b", "svs_h", "svs_s"), sc))
    return s


def _decode_ptrs(kv):
    int8 = kv == "*i8"
    return dict(q_ptr="*bf16", k_ptr=kv, v_ptr=kv, ks_ptr="*fp32" if int8 else kv,
                vs_ptr="*fp32" if int8 else kv, bt_ptr="*i32", qsl_ptr="*i32",
                lens_ptr="*i32", span_ptr="*i32", order_ptr="*i32", out_ptr="*bf16", po_ptr="*fp32", plse_ptr="*fp32")


def _decode_row(name, int8, split, block_n, warps, stages, extra=()):
    import triton.language as tl

    from infer_cluster.kernels.attention_decode_triton import _decode_kernel
    kv = "*i8" if int8 else "*bf16"
    ints = dict(_strides(128, int8), spo_s=0, spo_h=0, spo_p=128 if split else 0,
                spl_s=0, spl_h=0)
    consts = dict(GROUP=H // HK, HEAD_DIM=128, PAGE=PAGE, BLOCK_G=16, BLOCK_D=128,
                  BLOCK_N=block_n, SPLIT=split, LOWP=True,
                  DOT_DTYPE=tl.float16 if int8 else tl.bfloat16, KV_INT8=int8, OP_K=0, OP_V=0,
                  ASM=True, PRELOAD=False, GROUPED=False, ROWS=1, ORDERED=False)
    consts.update(extra)
    return (name, _decode_kernel, _decode_ptrs(kv), ints, consts,
            dict(num_warps=warps, num_stages=stages), DECODE_DNS)


def _cvt_consts(cfg):
    from infer_cluster.kernels.attention_int8_triton import CVT_MODES
    op_k, op_v = CVT_MODES[cfg["cvt"]]
    return dict(OP_K=op_k, OP_V=op_v)


def int8_decode_variants():
    """The int8 decode kernel for each `CVT_MODES` entry at the int8 default tile, then the
    default cvt at other tiles / warps."""
    from infer_cluster.kernels.attention_decode_triton import DECODE_INT8
    from infer_cluster.kernels.attention_int8_triton import CVT_MODES
    d = DECODE_INT8
    rows = []
    for cvt in CVT_MODES:
        for split in (False, True):
            rows.append(_decode_row(f"i8 {cvt} n{d['block_n']} w{d['num_warps']} split={split}",
                                    True, split, d["block_n"], d["num_warps"], d["num_stages"],
                                    _cvt_consts(dict(cvt=cvt))))
    for cvt in ("add", "prmt_load", "words_v"):
        for bn, w in ((64, 4), (128, 8), (256, 8)):
            rows.append(_decode_row(f"i8 {cvt} n{bn} w{w} split=False", True, False, bn, w,
                                    d["num_stages"], _cvt_consts(dict(cvt=cvt))))
    for cvt in ("prmt_load", "prmt_v"):  # capped at 128 registers ("maxnreg")
        name, *rest, opts, dns = _decode_row(f"i8 {cvt} n64 w4 regs128 split=False", True,
                                             False, 64, 4, d["num_stages"],
                                             _cvt_consts(dict(cvt=cvt)))
        rows.append((name, *rest, dict(opts, maxnreg=128), dns))
    return rows


def int8_round2_variants():
    """`bench/int8_decode.py --round2`'s kernels: each distinct (cvt, block_n, num_stages,
    maxnreg) of `round2_configs`, unsplit and split (the split-rule configs compile the same
    kernels as their plain rows). Names carry the key `ROUND2_SPILLS` takes."""
    from bench.int8_decode import round2_configs
    from infer_cluster.kernels.attention_decode_triton import DECODE_INT8
    rows, seen = [], set()
    for cfg in [dict()] + round2_configs():
        c = dict(DECODE_INT8, **cfg)
        key = (c["cvt"], c["block_n"], c["num_stages"], c.get("maxnreg"))
        if key in seen:
            continue
        seen.add(key)
        for split in (False, True):
            name, *rest, opts, dns = _decode_row(f"r2 {key} split={split}", True, split,
                                                 c["block_n"], c["num_warps"], c["num_stages"],
                                                 _cvt_consts(c))
            if c.get("maxnreg"):
                opts = dict(opts, maxnreg=c["maxnreg"])
            rows.append((name, *rest, opts, dns))
    return rows


def variants():
    import torch
    import triton.language as tl

    from infer_cluster.kernels.attention_decode_triton import DECODE_INT8, DECODE_TUNED
    from infer_cluster.kernels.attention_prefill_plan import WIDE_MIN_QUERY, _tiles
    from infer_cluster.kernels.attention_prefill_triton import PREFILL_INT8_CVT, _prefill_kernel
    from infer_cluster.kernels.kv_append_triton import _kv_append_int8_kernel
    rows = []
    for int8 in (False, True):
        kv = "*i8" if int8 else "*bf16"
        ptrs = _decode_ptrs(kv)
        dot = tl.float16 if int8 else tl.bfloat16
        cfg = DECODE_INT8 if int8 else DECODE_TUNED
        for split in (False, True):
            rows.append(_decode_row(f"decode {kv[1:]} split={split} d128 n{cfg['block_n']}",
                                    int8, split, cfg["block_n"], cfg["num_warps"],
                                    cfg["num_stages"], _cvt_consts(cfg) if int8 else {}))
            # a decode step's launch: sequences longest first (`decode_order`)
            rows.append(_decode_row(f"decode {kv[1:]} ordered split={split} d128 n{cfg['block_n']}",
                                    int8, split, cfg["block_n"], cfg["num_warps"], cfg["num_stages"],
                                    dict(_cvt_consts(cfg) if int8 else {}, ORDERED=True)))
            # a verify step's runs (`row_span`): 16 // GROUP rows of one request a program
            rows.append(_decode_row(f"decode {kv[1:]} runs split={split} d128 n{cfg['block_n']}",
                                    int8, split, cfg["block_n"], cfg["num_warps"], cfg["num_stages"],
                                    dict(_cvt_consts(cfg) if int8 else {}, GROUPED=True, ROWS=16 // (H // HK))))
        cuda_bf16_q = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # all _tiles reads
        tiles = [(d, t) for d in (64, 128, 256)  # narrow, and wide for long queries (`_tiles`)
                 for t in dict.fromkeys(_tiles(cuda_bf16_q, d, int8, m) for m in (0, WIDE_MIN_QUERY))]
        for d, (bm, bn, warps, stages) in tiles:
            for cvt in (tuple(dict.fromkeys((PREFILL_INT8_CVT, "prmt_load", "add", "mma_k"))) if int8 else ("-",)):
                consts = dict(GROUP=H // HK, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d,
                              LOWP=True, DOT_DTYPE=dot, KV_INT8=int8, OP_K=0, OP_V=0, ASM=True,
                              PACK=H // HK, SEQ_CHUNK=128,  # GQA packing, the default
                              LONGEST_FIRST=True, SKIP_SINGLE=False)  # a dense grid (one prompt)
                if int8:
                    consts.update(_cvt_consts(dict(cvt=cvt)))
                name = f"prefill {kv[1:]} d{d} {bm}x{bn} w{warps} s{stages}" + (f" {cvt}" if int8 else "")
                # One split (the grid of prompts); the partial strides are then never read.
                ints = dict(_strides(d, int8), page_size=PAGE, num_seqs=7, dense_blocks=3, spo_s=0, spo_t=0, spo_h=0,
                            spl_s=0, spl_t=0)
                rows.append((name, _prefill_kernel, ptrs, ints, dict(consts, NUM_SPLITS=1),
                             dict(num_warps=warps, num_stages=stages), ()))
    ints = dict(num_kv_heads=HK, head_dim=128, block_size=PAGE, sk_t=3 * H * 128, sk_h=128,
                sk_d=1, sv_t=3 * H * 128, sv_h=128, sv_d=1, skc_b=PAGE * HK * 128,
                skc_s=HK * 128, skc_h=128, skc_d=1, svc_b=PAGE * HK * 128, svc_s=HK * 128,
                svc_h=128, svc_d=1, sks_b=HK * PAGE, sks_h=PAGE, sks_s=1, svs_b=HK * PAGE,
                svs_h=PAGE, svs_s=1)
    rows.append(("kv_append int8 d128", _kv_append_int8_kernel,
                 dict(key_ptr="*bf16", value_ptr="*bf16", k_cache_ptr="*i8", v_cache_ptr="*i8",
                      ks_ptr="*fp32", vs_ptr="*fp32", slot_ptr="*i64"), ints,
                 dict(BLOCK_H=8, BLOCK_D=128), dict(num_warps=4, enable_fp_fusion=False), ()))
    from bench.ptxas_gluon import gluon_variants
    return rows + gluon_variants() + gemv_variants() + mlp_variants() + _qkv_prep_variants() + sampler_variants() + argmax_variants()


def sampler_variants():
    """The sampler's kernels (kernels/sample_triton.py, penalty_triton.py, random_columns_triton.py) at the Qwen3-0.6B
    vocabulary, float32 and bf16 logits, with the entry points' launch options."""
    import torch

    from infer_cluster.kernels import penalty_triton as pt
    from infer_cluster.kernels import sample_triton as st
    from infer_cluster.kernels import top_p_cut_triton as tc
    vocab, rows = 151936, []
    for xd in ("*fp32", "*bf16"):
        rows.append((f"sample candidate {xd[1:]}", st._candidate_kernel,
                     dict(x_ptr=xd, vals_ptr="*fp32", ids_ptr="*i64", m_ptr="*fp32", inv_t_ptr="*fp32",
                          top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32", u_ptr="*fp64",
                          out_ptr="*i64", unresolved_ptr="*i8", kth_ptr="*fp32", sums_ptr="*fp32",
                          mass_ptr="*fp32"),
                     dict(sx=vocab, sv=114, si=114, n_blocks=1187, vocab=vocab, width=114),
                     dict(MARGIN=64, P_CANDIDATES=256, C_PAD=512, CH=st.CH, BLOCK=128), dict(num_warps=16),
                     ("sx", "sv", "si", "n_blocks", "vocab", "width")))
        full = dict(x_ptr=xd, m_ptr="*fp32", inv_t_ptr="*fp32", tau_ptr="*fp32", min_p_ptr="*fp32",
                    active_ptr="*i8")
        rows.append((f"sample top-p-alone masses {xd[1:]}", st._block_sums_kernel, dict(full, sums_ptr="*fp32"),
                     dict(sx=vocab, vocab=vocab, part_tiles=10, n_blocks=1187),
                     dict(BLOCK=128, NB=16, HAS_ACTIVE=False, ACTIVE_CODE=1, FILTERS=False),
                     dict(num_warps=4), ("sx", "vocab", "part_tiles", "n_blocks")))
        for has in (False, True):  # every row (the full path) / the code-2 rows (the draw's finish)
            act, tag = dict(HAS_ACTIVE=has, ACTIVE_CODE=2), f"{xd[1:]}{' active' if has else ''}"
            rows.append((f"sample block sums {tag}", st._block_sums_kernel, dict(full, sums_ptr="*fp32"),
                         dict(sx=vocab, vocab=vocab, part_tiles=10, n_blocks=1187),
                         dict(BLOCK=128, NB=16, FILTERS=True, **act),
                         dict(num_warps=4), ("sx", "vocab", "part_tiles", "n_blocks")))
            rows.append((f"sample full pick {tag}", st._full_pick_kernel,
                         dict(full, u_ptr="*fp64", sums_ptr="*fp32", out_ptr="*i64"),
                         dict(sx=vocab, vocab=vocab, n_blocks=1187), dict(BLOCK=128, TILE=1024, **act),
                         dict(num_warps=4), ("sx", "vocab", "n_blocks")))
            rows.append((f"sample top-p cut {tag}", tc._top_p_threshold_kernel,
                         dict(x_ptr=xd, m_ptr="*fp32", inv_t_ptr="*fp32", tau_ptr="*fp32", top_p_ptr="*fp32",
                              out_ptr="*fp32", active_ptr="*i8", mass_ptr="*fp32"),
                         dict(sx=vocab, vocab=vocab),
                         dict(tc.cut_options(torch.bfloat16 if xd == "*bf16" else torch.float32),
                              HAS_MASS=has, **act),
                         dict(num_warps=8),
                         ("sx", "vocab")))
    rows.append(("sample keep flagged rows", st._copy_flagged_kernel,  # what a redo reads (`copy_flagged_rows`)
                 dict(src_ptr="*bf16", dst_ptr="*bf16", flags_ptr="*u8", rows_ptr="*i64"),
                 dict(sx=vocab, sd=vocab, vocab=vocab, has_rows=1), dict(BLOCK=2048), dict(num_warps=4),
                 ("sx", "sd", "vocab", "has_rows")))
    from infer_cluster.kernels import topk_select_triton as ts
    rows.append(("sample top-k select", ts._topk_select_kernel,  # candidates and logprob alternatives
                 dict(x_ptr="*bf16", bmax_ptr="*bf16", scratch_ptr="*i32", packs_ptr="*i64", vals_ptr="*fp32",
                      ids_ptr="*i64"),
                 dict(sx=vocab, sb=1187, sv=114, si=114, nblk=1187, vocab=vocab, width=114),
                 dict(NBLK_PAD=2048, BLOCK=128, TB=ts._TB, WPAD=ts.MAX_WIDTH), dict(num_warps=8),
                 ("sx", "sb", "sv", "si", "nblk", "vocab", "width")))
    from infer_cluster.kernels import random_columns_triton as rc
    rows.append(("sample random columns", rc._columns_kernel,  # the random rows' casts and uniforms
                 dict(packed_ptr="*fp64", bits_ptr="*i64", f32_ptr="*fp32", top_k_ptr="*i64", u_ptr="*fp64"),
                 dict(sr=256, sc=1, n=256, sf=256), dict(BLOCK=128), dict(num_warps=4), ("n", "sr", "sc", "sf")))
    from infer_cluster.kernels import logprob_pack_triton as lp
    rows.append(("logprob pack", lp._pack_kernel,  # the logprob values (and greedy ids) in one launch
                 dict(x_ptr="*bf16", lse_ptr="*fp32", ids_ptr="*i64", bmax_ptr="*bf16", vals_ptr="*fp32",
                      out_ptr="*fp64"),
                 dict(sx=vocab, sb=1187, sv=5, vocab=vocab, nblk=1187, k=5, greedy=1),
                 dict(BLOCK=128, TILE=lp._BLOCK_TILE, SCAN=lp._SCAN, KP=lp.K_PAD), dict(num_warps=4),
                 ("sx", "sb", "sv", "vocab", "nblk", "k", "greedy")))
    rows.append(("penalties apply", pt._apply_kernel,
                 dict(x_ptr="*fp32", ids_ptr="*i64", counts_ptr="*fp32", num_ptr="*i64", packed_ptr="*fp64"),
                 dict(sx=vocab, s_ids=1024, s_cnt=1024, n=256), dict(CH=pt.CH),
                 dict(num_warps=4, enable_fp_fusion=False), ("sx", "s_ids", "s_cnt", "n")))
    rows.append(("penalties append", pt._append_kernel,
                 dict(ids_ptr="*i64", counts_ptr="*fp32", num_ptr="*i64", slots_ptr="*fp64", tokens_ptr="*i64"),
                 dict(s_ids=1024, s_cnt=1024), dict(CH=pt.CH), dict(num_warps=4), ("s_ids", "s_cnt")))
    return rows


def argmax_variants():
    """The split row argmax (kernels/argmax_triton.py) at the Qwen3-0.6B vocabulary, float32
    and bf16 logits, as `row_argmax_triton` launches it."""
    from infer_cluster.kernels import argmax_triton as am
    vocab, rows = 151936, []
    nparts = -(-vocab // am.BLOCK)
    for xd in ("*fp32", "*bf16"):
        rows.append((f"argmax parts {xd[1:]}", am._part_kernel,
                     dict(x_ptr=xd, val_ptr="*fp32", idx_ptr="*i32"),
                     dict(sx=vocab, vocab=vocab, nparts=nparts), dict(BLOCK=am.BLOCK),
                     dict(num_warps=am._WARPS), ("sx", "vocab", "nparts")))
    rows.append(("argmax pick", am._pick_kernel, dict(val_ptr="*fp32", idx_ptr="*i32", out_ptr="*i64"),
                 dict(nparts=nparts, vocab=vocab), dict(BLOCK_P=128), dict(num_warps=1), ("nparts", "vocab")))
    return rows


def gemv_variants():
    """The small-batch linear at the configs `pick_config` gives the Qwen3-0.6B shapes and one
    rank's Llama-3-8B shard at T=2 (bf16;
    the down projection with its fused SiLU; qkv and gate_up also with the fused add + RMSNorm
    prologue at `fused_norm_config`), one row per distinct compiled variant."""
    from bench.gemv import SHAPES
    from infer_cluster.kernels.gemv import fused_norm_config, pick_config
    from infer_cluster.kernels.gemv_triton import _DOT_M, _gemv_kernel
    rows, seen = [], set()
    shapes = [(name, SHAPES[model][name]) for model in ("qwen3-0.6b", "llama-3-8b-tp2")
              for name in ("qkv", "o", "gate_up", "down", "lm_head")]
    cases = [(name, nk, False) for name, nk in shapes]
    cases += [(name + "+norm", nk, True) for name, nk in shapes if name in ("qkv", "gate_up")]
    for name, (n, k), norm in cases:
        for m in (1, 2, 4, 8, 16):
            cfg = fused_norm_config(m, n, k) if norm else pick_config(m, n, k)
            if cfg is None:
                continue
            silu, partial = name == "down", cfg.split_k > 1
            bm = _DOT_M if cfg.use_dot else 1 << (m - 1).bit_length()
            key = (bm, cfg, silu, norm, partial)
            if key in seen:
                continue
            seen.add(key)
            per_split = -(-k // cfg.split_k)
            ints = dict(M=m, N=n, K=k, k_per_split=-(-per_split // cfg.block_k) * cfg.block_k,
                        sxm=2 * k if silu else k, swn=k, som=n, sos=m * n if partial else 0,
                        srm=k, shm=k)
            consts = dict(HAS_BIAS=False, SILU_MUL=silu, NORM=norm, HAS_RES=norm, PARTIAL=partial,
                          USE_DOT=cfg.use_dot, DOT_F32=False, EVEN_K=k % cfg.block_k == 0,
                          STAGES=cfg.num_stages, BLOCK_M=bm, BLOCK_N=cfg.block_n,
                          BLOCK_K=cfg.block_k, NORM_BLOCK=max(16, min(k, 4096 // bm)), PDL=True,
                          ONE_CHUNK=False)
            ptrs = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16",
                        out_ptr="*fp32" if partial else "*bf16", r_ptr="*bf16", nw_ptr="*bf16",
                        h_ptr="*bf16")
            tag = f"{'dot' if cfg.use_dot else 'fma'} {cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
            opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            rows.append((f"gemv {name} M{m} {tag}", _gemv_kernel, ptrs, ints, consts, opts, ()))
            if not cfg.use_dot and ints["k_per_split"] == cfg.block_k:  # the one-chunk build (default)
                rows.append((f"gemv {name} M{m} {tag} one-chunk", _gemv_kernel, ptrs, ints,
                             dict(consts, ONE_CHUNK=True), opts, ()))
    return rows


def mlp_variants(configs=None):
    """The fused batch-1 MLP (kernels/mlp_triton.py) at the Qwen3-0.6B shape, with and without
    the zeroing of the other accumulator, at `configs` (channels per program, warps; by default
    the one `fused_mlp_config` picks)."""
    from infer_cluster.kernels.mlp import fused_mlp_config
    from infer_cluster.kernels.mlp_triton import _mlp_kernel
    hidden, inter, rows = 1024, 3072, []
    configs = configs or (fused_mlp_config(1, hidden, inter),)
    ptrs = dict(x_ptr="*fp32", r_ptr="*bf16", h_ptr="*bf16", nw_ptr="*bf16", wgu_ptr="*bf16",
                wd_ptr="*bf16", acc_ptr="*fp32", zero_ptr="*fp32")
    ints = dict(M=1, K=hidden, I=inter, sxm=hidden, srm=hidden, shm=hidden, swgu=hidden,
                swd=inter, sam=hidden)
    for block_c, warps in configs:
        for zero in (True, False):
            consts = dict(HAS_RES=True, HAS_ZERO=zero, EVEN_K=True, EVEN_C=True, BLOCK_M=1, BLOCK_C=block_c, BLOCK_K=hidden)
            rows.append((f"mlp {block_c}ch w{warps} zero={zero}", _mlp_kernel, ptrs, ints, consts,
                         dict(num_warps=warps), ("M",)))
    return rows


def _qkv_prep_variants():
    """The fused q/k norm + rotary + KV append kernel at the Qwen3-0.6B layer shape."""
    from infer_cluster.kernels.qkv_prep_triton import _qkv_prep_kernel, plan_groups
    block_h, block_d, q_groups, _ = plan_groups(H, HK, 128)
    rows = []
    for int8, norm in ((False, True), (True, True), (False, False)):
        kv = "*i8" if int8 else "*bf16"
        ptrs = dict(qkv_ptr="*bf16", pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32",
                    slot_ptr="*i64", kc_ptr=kv, vc_ptr=kv, ks_ptr="*fp32" if int8 else kv,
                    vs_ptr="*fp32" if int8 else kv, qw_ptr="*bf16", kw_ptr="*bf16")
        cache = dict(zip(("b", "s", "h", "d"), (PAGE * HK * 128, HK * 128, 128, 1)))
        sc = (HK * PAGE, PAGE, 1) if int8 else (0, 0, 0)
        ints = dict(num_heads=H, num_kv_heads=HK, head_dim=128, block_size=PAGE,
                    q_groups=q_groups, s_tok=(H + 2 * HK) * 128, s_cos=64, s_sin=64,
                    **{f"skc_{k}": v for k, v in cache.items()},
                    **{f"svc_{k}": v for k, v in cache.items()},
                    **dict(zip(("sks_b", "sks_h", "sks_s", "svs_b", "svs_h", "svs_s"), sc * 2)))
        consts = dict(HAS_NORM=norm, KV_INT8=int8, BLOCK_H=block_h, BLOCK_D=block_d)
        rows.append((f"qkv_prep {kv[1:]} norm={norm} d128", _qkv_prep_kernel, ptrs, ints, consts,
                     dict(num_warps=4 if block_h * block_d <= 2048 else 8,
                          enable_fp_fusion=False), ()))
    return rows


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--int8-variants", action="store_true",
                    help="int8 decode variants (cvt modes, tiles, warps) with SASS counts")
    ap.add_argument("--int8-round2", action="store_true",
                    help="the kernels of bench/int8_decode.py --round2, with SASS counts")
    ap.add_argument("--only", default=None, help="rows whose name contains this text only")
    args = ap.parse_args(argv)
    if args.int8_round2:
        rows = int8_round2_variants()
        args.int8_variants = True  # same columns
    else:
        rows = int8_decode_variants() if args.int8_variants else variants()
    rows = [r for r in rows if args.only is None or args.only in r[0]]
    bad = 0
    head = f"{'variant':<42}{'regs':>6}{'spill B':>9}{'shared B':>10}{'cp.async':>10}{'wgmma':>8}"
    if args.int8_variants:
        head += "".join(f"{k:>9}" for k in SASS_KINDS)
    print(head)
    for name, kernel, ptrs, ints, consts, opts, dns in rows:
        c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
        r = ptxas_report(c.asm["ptx"])
        regs, spills = r["regs"], r["spills"]
        bad += spills > 0 or r["wgmma_serialized"]
        wgmma = "serial" if r["wgmma_serialized"] else ("async" if "wgmma.mma_async" in c.asm["ptx"] else "-")
        line = (f"{name:<42}{regs:>6}{spills:>9}{c.metadata.shared:>10}"
                f"{c.asm['ptx'].count('cp.async.'):>10}{wgmma:>8}")
        if args.int8_variants:
            counts = sass_counts(c.asm["cubin"])
            line += "".join(f"{counts[k]:>9}" for k in SASS_KINDS)
        print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
