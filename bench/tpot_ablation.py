"""Batch-1 TPOT with one kernel of the decode chain left out: what fusing it away could gain at most.

A measurement tool, not a model: each variant runs `bench/latency.py` in a fresh subprocess
with one launch replaced by nothing (the step's results are then wrong, its timing is what is
read), or with one GEMV table row replaced. The upper bound of a fusion is
TPOT(base) - TPOT(kernel left out): a fused kernel still does the work, so it gains less.

Variants (`--variants`, comma-separated, run in that order; repeat `base` to see the spread):
  base       the engine as it is
  prep       no qkv_prep launch (q/k norm, rotary, KV append)
  reduce     no split-decode reduce launch
  decode     no split-decode attention launch (the reduce still runs)
  attn       no prep, decode or reduce: the whole attention chain
  splitsum   no split-K sum after a GEMV (at batch 1: the o projection)
  o_nosplit  the o projection's batch-1 row without split-K (4 x 2048, 4 warps): one launch
  gemv=N.K.M:BN.BK.W.S.SPLIT[+...]  the GEMV table row (N, K, M bucket) replaced by a CUDA-core
             config (block_n, block_k, warps, stages, split_k); `+` joins several rows in one
             variant (a step-level sweep: the table's rows were timed alone, the step runs them
             back to back under PDL, where how many programs fit beside the kernel before matters;
             batch-1 steps run the MLP fused, so the gate_up and down rows matter only with
             INFER_CLUSTER_FUSED_MLP=0 in the environment)
  decode=KEY.VALUE[+...]  float decode attention's launch config (`DECODE_TUNED`) with integer
             keys replaced, e.g. `decode=min_partition.4096` (at --max-model-len 4096: one
             partition per sequence, so no reduce launch) or `decode=min_partition.1024+num_stages.3`
Writes one JSON with every variant's p50 / p90 TPOT and its difference from the first `base`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("base", "prep", "reduce", "decode", "attn", "splitsum", "o_nosplit")


class NoLaunch:
    """Stands in for a Triton kernel: `kernel[grid](...)` launches nothing (also
    bench/step_kernels.py's `--leave-out`)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _gemv_rows(variant: str) -> dict:
    """`gemv=N.K.M:BN.BK.W.S.SPLIT+...` -> {(N, K, M): GemvConfig}; ValueError when malformed."""
    from infer_cluster.kernels.gemv_config import GemvConfig
    rows = {}
    for part in variant[len("gemv="):].split("+"):
        key, _, cfg = part.partition(":")
        n, k, m = (int(v) for v in key.split("."))
        bn, bk, w, st, split = (int(v) for v in cfg.split("."))
        rows[(n, k, m)] = GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                                     split_k=split, use_dot=False)
    return rows


def _decode_keys(variant: str) -> dict:
    """`decode=KEY.VALUE+...` -> {KEY: int}; ValueError when malformed or KEY is not a config key."""
    from infer_cluster.kernels.attention_decode_triton import DECODE_TUNED
    keys = {}
    for part in variant[len("decode="):].split("+"):
        key, _, value = part.partition(".")
        if key not in DECODE_TUNED:
            raise ValueError(f"{key!r} is not a decode config key")
        keys[key] = int(value)
    return keys


def _known(variant: str) -> bool:
    if variant.startswith("decode="):
        try:
            return bool(_decode_keys(variant))
        except ValueError:
            return False
    if variant.startswith("gemv="):
        try:
            return bool(_gemv_rows(variant))
        except ValueError:
            return False
    return variant in VARIANTS


def _apply(variant: str) -> None:
    """Patch the kernels module for one variant, before the engine is built (and its graphs
    captured)."""
    from infer_cluster.kernels import attention_decode_triton as dec
    from infer_cluster.kernels import attention_triton as att
    from infer_cluster.kernels import gemv_triton, gemv_tuned, qkv_prep_triton
    from infer_cluster.kernels.gemv_config import GemvConfig
    from infer_cluster.kernels.qkv_prep import split_qkv

    def no_prep(qkv, *args, num_heads, num_kv_heads, head_dim, **kwargs):
        return split_qkv(qkv, num_heads, num_kv_heads, head_dim)[0]

    if variant in ("prep", "attn"):
        qkv_prep_triton.qkv_prep_triton = no_prep
    if variant == "reduce":
        dec._reduce_kernel = NoLaunch()
    if variant == "decode":
        dec._decode_kernel = NoLaunch()
    if variant == "attn":
        att.decode_attention = lambda q, *args, **kwargs: args[6]  # `out`, untouched
    if variant == "splitsum":
        gemv_triton._split_sum_kernel = NoLaunch()
    if variant.startswith("gemv="):
        gemv_tuned.TUNED.update(_gemv_rows(variant))
    if variant.startswith("decode="):
        dec.DECODE_TUNED.update(_decode_keys(variant))
    if variant == "o_nosplit":
        gemv_tuned.TUNED[(1024, 2048, 1)] = GemvConfig(block_n=4, block_k=2048, num_warps=4,
                                                      num_stages=1, split_k=1, use_dot=False)


def _child(variant: str, out: str, latency_args: list) -> None:
    _apply(variant)
    from bench import latency
    latency.main([*latency_args, "--out", out])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="base,prep,reduce,decode,attn,splitsum,o_nosplit,base")
    ap.add_argument("--out", default="bench/results/tpot_ablation.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args, latency_args = ap.parse_known_args(argv)
    if args.child:
        _child(args.child, args.child_out, latency_args)
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(v for v in set(variants) if not _known(v))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # Each child's JSON goes to a scratch folder: only the summary lands beside --out (the
    # device machine sends back a limited number of files).
    scratch = tempfile.mkdtemp(prefix="tpot_ablation_")
    rows = []
    for i, variant in enumerate(variants):
        child_out = os.path.join(scratch, f"{i}_{variant}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--child-out", child_out,
               *latency_args]
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
        if rc != 0:
            print(f"{variant}: failed (rc {rc})", flush=True)
            rows.append({"variant": variant, "error": rc})
            continue
        with open(child_out) as f:
            res = json.load(f)
        rows.append({"variant": variant, "tpot_ms_p50": res["tpot_ms_p50"], "tpot_ms_p90": res["tpot_ms_p90"]})
        print(f"{variant:10s} TPOT p50 {res['tpot_ms_p50']:.3f} ms  p90 {res['tpot_ms_p90']:.3f}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    base = next((r["tpot_ms_p50"] for r in rows if r["variant"] == "base" and "tpot_ms_p50" in r), None)
    for r in rows:
        if base is not None and "tpot_ms_p50" in r:
            r["minus_base_ms"] = round(r["tpot_ms_p50"] - base, 4)
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
