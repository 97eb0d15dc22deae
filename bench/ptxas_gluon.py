"""sm_90 build variants of the Gluon kernels, for bench/ptxas_check.py's report and the kernel
tests' build checks: the int8 decode kernel (`gluon_decode_variants`), the persistent bf16
decode kernel (`persistent_decode_variants`), the prefill kernels over bf16 and int8 caches
(`prefill_gluon_variants`) and the mid-size GEMM (`gemm_variants`); `gluon_variants` is all of
them, in that order. Each row is (name, kernel, pointer dtypes, integer arguments, constexprs,
launch options, do_not_specialize) at the Qwen3-0.6B head shape and strides of ptxas_check.py.
Never runs a kernel.
"""

from __future__ import annotations

from bench.ptxas_check import DECODE_DNS, H, HK, PAGE, _decode_ptrs, _strides


def gluon_variants():
    return (gluon_decode_variants() + gluon_decode_q_smem_variants() + persistent_decode_variants()
            + prefill_gluon_variants() + gemm_variants())


def gluon_decode_variants(q_smem=False, early=True):
    """The Gluon build of the int8 decode kernel (`_decode_int8_gluon_kernel`) as the engine
    launches it: 128-token tiles, 4 warps, PDL, sequences longest first, one partition or split;
    with `q_smem`, its four-a-SM build (q's codes in shared memory, 128 registers); `early=False`:
    the A/B build without the early first tile (`INFER_CLUSTER_DECODE_EARLY_TILE=0`)."""
    from infer_cluster.kernels.attention_decode_gluon import _decode_int8_gluon_kernel
    ptrs = _decode_ptrs("*i8")
    ptrs.pop("span_ptr")
    s = _strides(128, True)
    ints = {k: v for k, v in s.items() if not k.endswith("_d") and k != "sks_s" and k != "svs_s"}
    rows = []
    from infer_cluster.kernels.attention_decode_plan import DECODE_INT8
    tag, opts = ((" q_smem", dict(num_warps=4, maxnreg=DECODE_INT8["q_smem_maxnreg"])) if q_smem
                 else ("", dict(num_warps=4)))
    tag += "" if early else " late"
    for split in (False, True):
        rows.append((f"decode i8 gluon{tag} split={split} d128 n128", _decode_int8_gluon_kernel, ptrs,
                     dict(ints, bt_tokens=4096, spo_s=0, spo_h=0, spo_p=128 if split else 0, spl_s=0,
                          spl_h=0),
                     dict(GROUP=H // HK, PAGE=PAGE, BLOCK_N=128, SPLIT=split, ORDERED=True,
                          PDL=True, Q_SMEM=q_smem, EARLY_TILE=early), opts, DECODE_DNS + ("bt_tokens",)))
    return rows


def gluon_decode_q_smem_variants():
    """`gluon_decode_variants`' four-a-SM build (`gluon_q_smem` in kernels/attention_decode_plan.py)."""
    return gluon_decode_variants(q_smem=True)


def persistent_decode_variants():
    """The persistent decode kernel over bf16 caches (`_decode_persistent_kernel`) as the engine
    launches it: 64-token tiles, 4 warps, PDL, sequences longest first, one partition or split."""
    from infer_cluster.kernels.attention_decode_persistent_gluon import _decode_persistent_kernel
    ptrs = _decode_ptrs("*bf16")
    for k in ("span_ptr", "ks_ptr", "vs_ptr"):
        ptrs.pop(k)
    s = _strides(128, False)
    keep = ("sq_t", "sq_h", "sk_b", "sk_s", "sk_h", "sv_b", "sv_s", "sv_h", "s_bt", "so_t", "so_h")
    rows = []
    for split in (False, True):
        ints = dict({k: s[k] for k in keep}, num_seqs=256, num_splits=2 if split else 1, spo_s=0,
                    spo_h=0, spo_p=128 if split else 0, spl_s=0, spl_h=0)
        rows.append((f"decode bf16 persistent split={split} n64", _decode_persistent_kernel, ptrs,
                     ints, dict(KV_HEADS=HK, SPLIT=split, GROUP=H // HK, PAGE=PAGE, BLOCK_N=64,
                                ORDERED=True, PDL=True), dict(num_warps=4),
                     ("num_seqs", "num_splits") + DECODE_DNS))
    return rows


def prefill_gluon_variants():
    """The Gluon prefill kernels over bf16 and int8 caches (`_prefill_gluon_kernel`,
    `_prefill_int8_gluon_kernel`) at their tiles, on a dense grid longest first (one prompt) and
    on the scanned grid of a mixed step."""
    from infer_cluster.kernels.attention_prefill_gluon import GLUON_TILES, _prefill_gluon_kernel
    from infer_cluster.kernels.attention_prefill_int8_gluon import _prefill_int8_gluon_kernel
    s = _strides(128, True)
    keep = ("sq_t", "sq_h", "sk_b", "sk_s", "sk_h", "sv_b", "sv_s", "sv_h", "s_bt", "so_t", "so_h")
    bm, bn, warps, stages = GLUON_TILES
    rows = []
    for int8 in (False, True):
        kv = "*i8" if int8 else "*bf16"
        ptrs = dict(q_ptr="*bf16", k_ptr=kv, v_ptr=kv, bt_ptr="*i32", qsl_ptr="*i32",
                    lens_ptr="*i32", out_ptr="*bf16")
        names = keep
        if int8:
            ptrs.update(ks_ptr="*fp32", vs_ptr="*fp32")
            names = keep + ("sks_b", "sks_h", "svs_b", "svs_h")
        for dense in (True, False):
            ints = dict({k: s[k] for k in names}, num_seqs=7, dense_blocks=3 if dense else 0)
            rows.append((f"prefill {kv[1:]} gluon {'dense' if dense else 'scan'} {bm}x{bn} w{warps} s{stages}",
                         _prefill_int8_gluon_kernel if int8 else _prefill_gluon_kernel, ptrs, ints,
                         dict(GROUP=H // HK, PAGE=PAGE, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages,
                              SEQ_CHUNK=128, LONGEST_FIRST=dense, SKIP_SINGLE=not dense,
                              num_warps=warps),
                         dict(num_warps=warps), ("s_bt", "num_seqs", "dense_blocks")))
    return rows


def gemm_variants():
    """The Gluon mid-size GEMM (`_gemm_kernel`) at three Qwen3-0.6B layer shapes, 256 rows,
    gate_up with SiLU-and-mul in its epilogue, and down split four ways (float32 partials)."""
    from bench.sm90_build import desc_sig
    from infer_cluster.kernels.gemm_gluon import BLOCK_M, _gemm_kernel
    rows = []
    for (n, k), bn, bk, stages, silu, splits in (((4096, 1024), 128, 64, 6, False, 1),
                                                 ((1024, 2048), 64, 128, 4, False, 1),
                                                 ((6144, 1024), 256, 64, 4, False, 1),
                                                 ((6144, 1024), 64, 128, 4, True, 1),
                                                 ((1024, 3072), 64, 128, 6, False, 4)):
        n_out = n // 2 if silu else n
        c_shape, c_dt = ((splits * 256, n_out), "fp32") if splits > 1 else ((256, n_out), "bf16")
        ptrs = {"a_desc": desc_sig((256, k), (BLOCK_M, bk)), "w_desc": desc_sig((n, k), (bn, bk)),
                "c_desc": desc_sig(c_shape, (BLOCK_M, bn), c_dt)}
        rows.append((f"gemm n{n} k{k} bn{bn} bk{bk} s{stages}{' silu' if silu else ''}"
                     f"{f' split{splits}' if splits > 1 else ''}", _gemm_kernel,
                     ptrs, dict(n_m=4, up_row=n_out, c_rows=256 if splits > 1 else 0),
                     dict(STEPS=k // bk // splits, STAGES=stages, SILU=silu, num_warps=4), dict(num_warps=4),
                     ("n_m",)))
    return rows
