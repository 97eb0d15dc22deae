"""Decode attention over an int8 KV cache vs the bf16 cache, timed as the engine runs it
(CUDA-graph replays, graph-width block tables), on the decode tuner's Qwen3-0.6B batches.

Owns: one table (case, variant, ms, GB/s of bytes actually read, speedup over bf16 defaults, max
error vs `paged_attention_ref` on the same int8 cache) and a JSON file. Variants: the bf16
cache with the tuned defaults, and the int8 cache with `DECODE_INT8` and with other tile sizes
(`--block-n`), and with each `--cvt` mode at those tiles (the int8-MMA modes "mma_k" /
"mma_k_words_v" next to the default: `--block-n 128 --cvt mma_k mma_k_words_v`); `--sweep`
adds tile x warps x stages; `--variants` times the kernel variants
(`variant_configs`: every `CVT_MODES` entry, tiles / warps for the promising ones, split-K at
batch 256), `--round2` a second list, around the first one's winner (`round2_configs`,
precompiled in parallel processes first); both then pick the fastest correct one per case and overall
(geometric mean of the speedup over bf16 across the cases) and print the `DECODE_INT8` line
that makes it the default, with its split rule. Batches, timers and the correctness check come from `bench/tune_decode_cases.py`.
`--smoke` runs tiny batches on the CPU interpreter (checks the script only; times meaningless).

  python bench/int8_decode.py [--block-n 64 128] [--cvt mma_k] [--variants | --round2] [--out ...]
To add a variant: a config dict (keys of `decode_config`) in `variant_configs` or
`round2_configs` (check it with bench/ptxas_check.py --int8-round2; spills go in ROUND2_SPILLS).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def int8_bytes(ctx_total: int, num_seqs: int) -> int:
    """What decode attention over an int8 cache must read and write: each context token's K and
    V codes with their float32 scales, every KV head, then q and the output (bf16)."""
    from bench.tune_decode_cases import D, H, HK
    return ctx_total * HK * (D + 4) * 2 + 2 * 2 * num_seqs * H * D


def _int8_batches(case):
    """The case's batches with the caches quantized once (codes, scales) by the append rule."""
    from infer_cluster.kernels.kv_append import quantize_int8_ref
    k, v = case["batches"][0][1], case["batches"][0][2]
    quant = []
    for cache in (k, v):
        codes, scale = quantize_int8_ref(cache)
        quant.append((codes, scale.transpose(1, 2).contiguous()))
    (kc, ks), (vc, vs) = quant
    return [(q, kc, vc, bt, qsl, lens, ks, vs) for q, _, _, bt, qsl, lens in case["batches"]]


# `--round2` (the sweep around the first list's winner "words" n128): the (cvt, block_n,
# num_stages, maxnreg) combinations that spill at sm_90 in the split or unsplit kernel
# (`bench/ptxas_check.py --int8-round2`, Triton 3.7 AOT), left out. num_stages 4 compiles to the
# same kernels as 3.
ROUND2_SPILLS = {("words", 64, 2, None), ("words_v", 64, 2, None), ("words", 128, 2, 128),
                 ("words", 128, 2, 168), ("words_v", 128, 2, 128), ("words_v", 128, 2, 168),
                 ("prmt_v", 128, 2, 128), ("load_k_words_v", 64, 2, None)}
_SPLIT_RULES = (dict(small_per_sm=16, small_programs=512), dict(small_per_sm=8, small_programs=512))


def round2_configs():
    """Overrides of `DECODE_INT8` for `--round2`: the three load-layout conversions crossed with
    tiles x pipeline depth, register caps, the K/V method pairs, and split rules (more programs
    per SM for every batch, or only for small ones: `small_per_sm` at or below `small_programs`
    sequences x KV heads, which leaves batch 256 unsplit). Spilling combinations are out."""
    from infer_cluster.kernels.attention_triton import DECODE_INT8
    main = ("words", "words_v", "prmt_v")
    configs = [dict(cvt=c, block_n=bn, num_stages=st) for c in main for bn in (64, 128)
               for st in (2, 3)]
    configs += [dict(cvt=c, block_n=bn, maxnreg=r) for c in main for bn in (64, 128)
                for r in (128, 168)]
    configs += [dict(cvt=c, block_n=bn) for c in ("words_k", "load_k_words_v", "add_k_words_v")
                for bn in (64, 128)]
    configs += [dict(cvt=c, block_n=128, **rule) for c in main for rule in _SPLIT_RULES]
    configs += [dict(cvt=c, block_n=64, num_stages=3, **rule) for c in main
                for rule in _SPLIT_RULES]
    configs += [dict(cvt=c, block_n=128, programs_per_sm=16) for c in main]
    out = []
    for c in configs:
        key = (c["cvt"], c["block_n"], c.get("num_stages", DECODE_INT8["num_stages"]),
               c.get("maxnreg"))
        if key in ROUND2_SPILLS or c in out or dict(DECODE_INT8, **c) == DECODE_INT8:
            continue  # spills, repeats, or the defaults (timed as "int8 defaults" anyway)
        out.append(c)
    return out


def precompile(configs, workers):
    """Compile every config's split and unsplit decode kernels in parallel processes at the
    benchmark's specialisation (Triton's on-disk cache), so the timed loop does not compile."""
    import multiprocessing as mp
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = [c for c, ok in zip(configs, pool.map(_warm_one, configs, chunksize=1)) if not ok]
    print(f"precompiled {len(configs)} int8 variants with {workers} processes in "
          f"{time.monotonic() - t0:.0f} s" + (f"; failed: {failed}" if failed else ""), flush=True)


def _warm_one(cfg):
    """Worker: run one config once without and once with splits on a tiny batch of the cases'
    head shape and page size (same strides and alignment as the timed batches)."""
    import torch

    from bench import tune_decode_cases as tc
    from infer_cluster.kernels.attention_triton import decode_attention
    try:
        q = torch.randn(2, tc.H, tc.D, device="cuda", dtype=torch.bfloat16)
        kc = torch.zeros(9, tc.PAGE, tc.HK, tc.D, device="cuda", dtype=torch.int8)
        ks = torch.ones(9, tc.HK, tc.PAGE, device="cuda")
        bt = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
        qsl = torch.arange(3, dtype=torch.int32, device="cuda")
        lens = torch.tensor([50, 64], dtype=torch.int32, device="cuda")
        for splits in (1, 2):
            decode_attention(q, kc, kc, bt, qsl, lens, 0.1, torch.empty_like(q),
                             num_splits=splits, config=cfg, k_scale=ks, v_scale=ks)
        torch.cuda.synchronize()
        return True
    except Exception:  # reported by the timed loop, which runs it again
        return False


def variant_configs():
    """Overrides of `DECODE_INT8` for `--variants`: each operand conversion (`CVT_MODES`) at the
    default tile; tiles x warps for the conversions that keep the tile out of the MMA layout
    (fewest SASS instructions, bench/ptxas_check.py --int8-variants) and for the current
    default; more programs per SM (split-K even at batch 256)."""
    from infer_cluster.kernels.attention_triton import CVT_MODES, DECODE_INT8
    configs = [dict(cvt=c) for c in CVT_MODES]
    for cvt in ("prmt_load", "prmt_v", "words_v"):
        for bn, w, st in ((64, 4, 2), (128, 8, 2), (128, 4, 3)):
            configs.append(dict(cvt=cvt, block_n=bn, num_warps=w, num_stages=st))
    # 128 registers: 4 programs of 4 warps per SM instead of 3 (no spills at 64-token tiles)
    configs += [dict(cvt=c, block_n=64, maxnreg=128) for c in ("prmt_load", "prmt_v")]
    configs += [dict(cvt=DECODE_INT8["cvt"], block_n=64), dict(cvt=DECODE_INT8["cvt"], num_warps=8)]
    configs += [dict(cvt="prmt_load", programs_per_sm=pps) for pps in (16, 32)]
    configs.append(dict(cvt=DECODE_INT8["cvt"], programs_per_sm=16))
    unique = []
    for c in configs:  # drop repeats (the default cvt is listed twice)
        if c not in unique:
            unique.append(c)
    return unique


_SHORT = dict(block_n="n", num_warps="warps", num_stages="stages", programs_per_sm="per_sm",
              min_partition="min_part", reduce_warps="reduce_warps", cvt="cvt", maxnreg="regs",
              small_per_sm="small", small_programs="below")


def _label(cfg):
    return "int8 " + " ".join(f"{_SHORT.get(k, k)}={v}" for k, v in cfg.items())


def pick_winners(rows):
    """(best per case, overall best) among the int8 rows whose output matched the reference:
    per case the lowest ms; overall the config with the highest geometric mean speedup over
    the bf16 defaults across all cases (configs that failed or missed a case are out)."""
    ok = [r for r in rows if r["config"] is not None and r["ok"]]
    per_case = {}
    for r in ok:
        if r["case"] not in per_case or r["ms"] < per_case[r["case"]]["ms"]:
            per_case[r["case"]] = r
    cases = {r["case"] for r in rows}
    by_cfg = {}
    for r in ok:
        by_cfg.setdefault(r["variant"], []).append(r)
    full = {v: rs for v, rs in by_cfg.items() if {r["case"] for r in rs} == cases}
    overall = None
    if full:
        name = max(full, key=lambda v: sum(math.log(r["speedup"]) for r in full[v]))
        rs = full[name]
        overall = dict(variant=name, config=rs[0]["config"],
                       geomean=math.exp(sum(math.log(r["speedup"]) for r in rs) / len(rs)),
                       speedups={r["case"]: r["speedup"] for r in rs})
    return per_case, overall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--cvt", nargs="+", default=[],
                    help="also time these CVT_MODES names at each --block-n")
    ap.add_argument("--sweep", action="store_true",
                    help="also time block_n x num_warps x num_stages variants of the int8 kernel")
    ap.add_argument("--variants", action="store_true",
                    help="time the kernel variants (variant_configs) instead of --block-n, and "
                         "print the fastest correct one per case and overall")
    ap.add_argument("--round2", action="store_true",
                    help="time the round-2 list (round2_configs: words / words_v / prmt_v x "
                         "tiles x stages x register caps, K/V pairs, split rules) instead")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes that precompile the variants first (1 = compile inline)")
    ap.add_argument("--budget-s", type=float, default=340.0,
                    help="stop starting new int8 variants after this many seconds (the ones "
                         "left are reported as skipped; winners come from what ran)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20, help="kernel calls per captured graph")
    ap.add_argument("--out", default="bench/results/int8_decode.json")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny batches")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    from bench import tune_decode_cases as tc
    from bench.report import write_json
    from infer_cluster.kernels.attention import paged_attention_ref
    from infer_cluster.kernels.attention_int8_triton import CVT_MODES, OP_MMA
    from infer_cluster.kernels.attention_triton import DECODE_INT8, decode_attention
    from infer_cluster.kernels.kv_append import dequantize_int8_ref, quantize_int8_ref
    tc.SMOKE = args.smoke
    device = "cpu" if args.smoke else "cuda"
    iters = 2 if args.smoke else args.iters
    scale = tc.D ** -0.5
    if args.round2:
        configs = [dict()] + round2_configs()
    elif args.variants:
        configs = [dict()] + variant_configs()
    else:
        configs = [dict(block_n=bn) for bn in args.block_n]
        configs += [dict(cvt=c, block_n=bn) for c in args.cvt for bn in args.block_n]
    if args.sweep:
        configs += [dict(block_n=bn, num_warps=w, num_stages=st) for bn in (64, 128, 256)
                    for w in (4, 8) for st in (2, 3, 4)]
    if not args.smoke and args.jobs > 1 and len(configs) > 2:
        precompile(configs, args.jobs)
    rows = []
    t_start = time.monotonic()
    print(f"int8 defaults: DECODE_INT8 = {DECODE_INT8}")
    print(f"{'case':<22}{'variant':<52}{'ms':>9}{'GB/s':>7}{'vs bf16':>8}{'max err':>9}")
    for case in tc.make_cases(device, torch.bfloat16, graph_width=True, b1_copies=4):
        outs = [torch.empty_like(b[0]) for b in case["batches"]]
        base = tc.time_graph(lambda b, o: decode_attention(*b, scale, o), case, outs,
                             args.reps, iters)[0]
        variants = [("bf16 defaults", None, base, case["work"], None, True)]
        int8 = _int8_batches(case)
        int8_case = dict(case, batches=int8)
        q, kc, vc, bt, qsl, lens, ks, vs = int8[0]
        refs = {}  # per q: int8-MMA modes quantize q, their reference does too
        for mma in (False, True):
            q_ref = dequantize_int8_ref(*quantize_int8_ref(q)) if mma else q
            refs[mma] = paged_attention_ref(q_ref, kc, vc, bt, qsl, lens, scale, k_scale=ks,
                                            v_scale=vs)
        for cfg in configs:
            ref = refs[CVT_MODES[cfg.get("cvt", DECODE_INT8["cvt"])][0] == OP_MMA]
            def fn(b, o, cfg=cfg):
                decode_attention(*b[:6], scale, o, config=cfg, k_scale=b[6], v_scale=b[7])
            label = _label(cfg) if cfg else "int8 defaults"
            if time.monotonic() - t_start > args.budget_s:
                print(f"{case['name']:<22}{label:<52} skipped (--budget-s {args.budget_s:.0f})")
                continue
            try:
                err, ok = tc.check(fn, int8_case, ref)
                ms = tc.time_graph(fn, int8_case, outs, args.reps, iters)[0] if ok else math.inf
            except Exception as exc:  # a variant that does not compile or launch: report, go on
                print(f"{case['name']:<22}{label:<52} failed: {type(exc).__name__}: {exc}"[:200])
                err, ok, ms = math.nan, False, math.inf
            variants.append((label, cfg, ms, int8_bytes(case["ctx_total"], case["num_seqs"]), err, ok))
        for name, cfg, ms, work, err, ok in variants:
            row = dict(case=case["key"], variant=name, config=cfg, ms=ms,
                       gbs=work / (ms * 1e-3) / 1e9, speedup=base / ms, max_err=err, ok=ok)
            rows.append(row)
            flag = "" if ok else "  WRONG (vs reference)"
            print(f"{case['name']:<22}{name:<52}{ms:>9.4f}{row['gbs']:>7.0f}{row['speedup']:>8.2f}"
                  f"{'' if err is None else format(err, '9.1e'):>9}{flag}", flush=True)
    meta = dict(device=torch.cuda.get_device_name() if not args.smoke else "cpu (interpreter)",
                torch=torch.__version__, reps=args.reps, iters=iters, defaults=DECODE_INT8)
    result = dict(meta=meta, results=rows)
    if args.variants or args.round2:
        per_case, overall = pick_winners(rows)
        print("\nfastest correct int8 variant per case (vs bf16 defaults in the same run):")
        for key, r in per_case.items():
            print(f"  {key:<6}{r['variant']:<52}{r['ms']:.4f} ms  {r['gbs']:.0f} GB/s  "
                  f"{r['speedup']:.2f}x")
        if overall:
            new = dict(DECODE_INT8, **overall["config"])
            print(f"overall (geometric mean over cases): {overall['variant']}  "
                  f"{overall['geomean']:.2f}x  "
                  + " ".join(f"{k}={v:.2f}x" for k, v in overall["speedups"].items()))
            rule = {k: new[k] for k in ("programs_per_sm", "small_per_sm", "small_programs")}
            print(f"split rule of the winner: {rule} (small_per_sm applies when num_seqs x "
                  f"num_kv_heads <= small_programs)")
            print(f"to make it the default (kernels/attention_decode_triton.py):\n"
                  f"  DECODE_INT8 = {new}")
            result.update(winners=per_case, overall=dict(overall, decode_int8=new))
        else:
            print("no int8 variant ran and matched the reference on every case")
    write_json(args.out, result)
    return rows


if __name__ == "__main__":
    main()
