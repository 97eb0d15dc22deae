"""Prefill attention over an int8 KV cache vs the bf16 cache, per int8 operand method and kernel.

Owns: one table (case, variant, ms, speedup over the Triton kernel on the bf16 cache, max error vs
`paged_attention_ref` on the same int8 cache) and a JSON file. Cases at the Qwen3-0.6B head shape
(16 query / 8 KV heads, head_dim 128, page 16, pages shuffled): `fresh16`, 16 whole prompts of
U[100, 1024] tokens (workload A's prompts, ~9k tokens per launch), `chunk4`, 4 chunks of 512
query tokens over 2,048-token contexts (chunked prefill over a cached prefix), and `mixed`, 192
decode rows (contexts U[100, 1500]) beside 8 whole prompts, as in workload A's prefill steps. Variants: the
bf16 cache, then the int8 cache with each `cvt` of `--cvt` (default: the prefill default
`PREFILL_INT8_CVT` first, then "add", the per-element conversion it replaced, two other
load-layout methods and the int8-MMA modes "mma_k" / "mma_k_words_v", q @ K^T on int8 tensor
cores), and on the GPU the Gluon kernel over the int8 cache ("int8 gluon",
kernels/attention_prefill_int8_gluon.py); `--gluon` adds bf16 rows through the Gluon kernel.
Timed as CUDA-graph replays (`bench/tune_decode_cases.time_graph`). Every row also gives its
attention TFLOP/s (`attention_flops`: the causal score and value products actually needed)
and its share of the bf16 matmul peak measured in the same run (`bench/roofline.measure_device`):
the `chunk1k` case, two 1,024-token chunks over 2,048 cached tokens each, is issue 44's "1k-token
chunks over cached prefixes".
`--smoke` runs tiny batches on the CPU interpreter (checks the script only; times meaningless).

  python bench/int8_prefill.py [--cvt words add] [--out bench/results/int8_prefill.json]
To add a case: an entry in `CASES` (name, query lengths, context lengths).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RNG = random.Random(0)
_PROMPTS = [_RNG.randint(100, 1024) for _ in range(16)]
_DECODE_CTX = [_RNG.randint(100, 1500) for _ in range(192)]
CASES = [("fresh16", _PROMPTS, _PROMPTS), ("chunk4", [512] * 4, [2048] * 4),
         ("chunk1k", [1024] * 2, [3072] * 2),
         # a workload-A mixed step: decode rows of admitted requests beside whole prompts
         ("mixed", [1] * 192 + _PROMPTS[:8], _DECODE_CTX + _PROMPTS[:8])]
SMOKE_CASES = [("fresh2", [20, 9], [20, 9]), ("chunk1", [8], [40])]


def attention_flops(q_lens, ctx_lens, heads: int, head_dim: int) -> int:
    """Multiply-adds x 2 of causal attention for query chunks at the end of their contexts: the
    j-th query token of a chunk of q tokens in a context of c attends c - q + j + 1 keys, each
    costing a score and a value product of head_dim."""
    keys = sum(q * (c - q) + q * (q + 1) // 2 for q, c in zip(q_lens, ctx_lens))
    return 4 * heads * head_dim * keys


def _tile_set(text: str) -> tuple:
    """A `--tiles` value: four positive whole numbers, comma-separated."""
    parts = text.split(",")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not BM,BN,WARPS,STAGES (four positive numbers)")
    return tuple(int(p) for p in parts)


def build(q_lens, ctx_lens, device, seed):
    """(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens) in bf16, pages shuffled."""
    import torch

    from bench import tune_decode_cases as tc
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = [-(-c // tc.PAGE) for c in ctx_lens]
    total = sum(blocks)
    k = torch.randn(total, tc.PAGE, tc.HK, tc.D, generator=g, device=device).to(torch.bfloat16)
    v = torch.randn(total, tc.PAGE, tc.HK, tc.D, generator=g, device=device).to(torch.bfloat16)
    ids = torch.randperm(total, device="cpu", generator=torch.Generator().manual_seed(seed))
    bt = torch.zeros(len(ctx_lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, b in enumerate(blocks):
        bt[i, :b] = ids[used:used + b].to(torch.int32)
        used += b
    q = torch.randn(sum(q_lens), tc.H, tc.D, generator=g, device=device).to(torch.bfloat16)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    lens = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
    return q, k, v, bt.to(device), qsl, lens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cvt", nargs="+", default=None,
                    help="int8 operand methods to time (CVT_MODES names)")
    ap.add_argument("--tiles", nargs="+", default=[], metavar="BM,BN,WARPS,STAGES", type=_tile_set,
                    help="bf16 variants with these prefill tiles (the default tiles are `_tiles`')")
    ap.add_argument("--gluon", nargs="+", default=[], metavar="BM,BN,WARPS,STAGES", type=_tile_set,
                    help="bf16 variants through the Gluon prefill kernel with these tiles "
                         "(kernels/attention_prefill_gluon.py; its default is GLUON_TILES), and the int8 "
                         "Gluon kernel with the same tiles")
    ap.add_argument("--entry", action="store_true",
                    help="also time each case through `paged_attention_triton` (bf16 and int8), whose "
                         "mixed steps give their decode rows to the decode kernel "
                         "(INFER_CLUSTER_MIXED_DECODE=0 for the other side of the A/B)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5, help="kernel calls per captured graph")
    ap.add_argument("--out", default="bench/results/int8_prefill.json")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny batches")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    from bench import tune_decode_cases as tc
    from bench.report import write_json
    from infer_cluster.kernels.attention import paged_attention_ref
    from infer_cluster.kernels.attention_prefill_triton import PREFILL_INT8_CVT, prefill_attention
    from infer_cluster.kernels.attention_int8_triton import CVT_MODES, OP_MMA
    from infer_cluster.kernels.attention_triton import int8_quantizes_q
    from infer_cluster.kernels.kv_append import dequantize_int8_ref, quantize_int8_ref
    tc.SMOKE = args.smoke
    device = "cpu" if args.smoke else "cuda"
    iters = 2 if args.smoke else args.iters
    cvts = args.cvt or list(dict.fromkeys([PREFILL_INT8_CVT, "add", "words", "words_k",
                                           "prmt_load", "mma_k", "mma_k_words_v"]))
    scale = tc.D ** -0.5
    tile_sets = args.tiles
    rows = []
    peak = 0.0
    if not args.smoke:
        from bench.roofline import measure_device
        peak = measure_device()["bf16_TFLOPs"]
        print(f"bf16 matmul peak measured now: {peak:.0f} TFLOP/s")
    print(f"{'case':<10}{'tokens':>8}  {'variant':<22}{'ms':>9}{'vs bf16':>9}{'max err':>9}{'TFLOP/s':>9}{'of peak':>8}")
    for seed, (name, q_lens, ctx_lens) in enumerate(SMOKE_CASES if args.smoke else CASES):
        q, k, v, bt, qsl, lens = build(q_lens, ctx_lens, device, seed)
        mq = max(q_lens)
        flops = attention_flops(q_lens, ctx_lens, tc.H, tc.D)
        (kc, ks), (vc, vs) = [(c, s.transpose(1, 2).contiguous())
                              for c, s in map(quantize_int8_ref, (k, v))]
        out = [torch.empty_like(q)]
        bf16 = dict(batches=[(q, k, v, bt, qsl, lens)])
        base = tc.time_graph(lambda b, o: prefill_attention(*b, scale, mq, o, gluon=False), bf16,
                             out, args.reps, iters)[0]
        rows.append(dict(case=name, variant="bf16", ms=base, speedup=1.0, max_err=None, ok=True))
        if tile_sets or args.entry or args.gluon:
            ref = paged_attention_ref(q, k, v, bt, qsl, lens, scale)
        refs = {}  # per q: int8-MMA modes quantize q, their reference does too

        def int8_ref(mma):
            if mma not in refs:
                refs[mma] = paged_attention_ref(dequantize_int8_ref(*quantize_int8_ref(q)) if mma else q,
                                                kc, vc, bt, qsl, lens, scale, k_scale=ks, v_scale=vs)
            return refs[mma]
        for gluon, tiles in [(False, t) for t in tile_sets] + [(True, t) for t in args.gluon]:
            def fn(b, o, tiles=tiles, gluon=gluon):
                prefill_attention(*b, scale, mq, o, tiles=tiles, gluon=gluon)
            try:
                err, ok = tc.check(fn, bf16, ref)
                ms = tc.time_graph(fn, bf16, out, args.reps, iters)[0] if ok else float("inf")
            except Exception as e:  # e.g. the tiles need more shared memory than a SM has
                print(f"{name}: tiles {tiles} failed: {str(e).splitlines()[0][:120]}")
                err, ok, ms = float("nan"), False, float("inf")
            rows.append(dict(case=name, variant=("gluon" if gluon else "bf16") + " {}x{} w{} s{}".format(*tiles), ms=ms,
                             speedup=base / ms, max_err=err, ok=ok))
        int8 = dict(batches=[(q, kc, vc, bt, qsl, lens, ks, vs)])
        entries = []
        if args.entry:
            from infer_cluster.kernels.attention_triton import paged_attention_triton
            for label, case, r in (("bf16 entry", bf16, ref),
                                   ("int8 entry", int8, int8_ref(int8_quantizes_q(q, kc, mq)))):
                def fn(b, o):
                    o.copy_(paged_attention_triton(*b[:6], scale, mq, *b[6:]))
                err, ok = tc.check(fn, case, r)
                ms = tc.time_graph(fn, case, out, args.reps, iters)[0] if ok else float("inf")
                entries.append(dict(case=name, variant=label, ms=ms, speedup=base / ms, max_err=err, ok=ok))
        for cvt in cvts:
            def fn(b, o, cvt=cvt):
                prefill_attention(*b[:6], scale, mq, o, k_scale=b[6], v_scale=b[7], cvt=cvt)
            err, ok = tc.check(fn, int8, int8_ref(CVT_MODES[cvt][0] == OP_MMA))
            ms = tc.time_graph(fn, int8, out, args.reps, iters)[0] if ok else float("inf")
            rows.append(dict(case=name, variant=f"int8 {cvt}", ms=ms, speedup=base / ms,
                             max_err=err, ok=ok))
        gluon_int8 = []
        # the Gluon kernel over the int8 cache: default tiles, then each --gluon tile set
        for tiles in ([] if args.smoke else [None, *args.gluon]):
            def fn(b, o, tiles=tiles):
                prefill_attention(*b[:6], scale, mq, o, k_scale=b[6], v_scale=b[7], gluon=True,
                                  tiles=tiles)
            label = "int8 gluon" + ("" if tiles is None else " {}x{} w{} s{}".format(*tiles))
            try:
                err, ok = tc.check(fn, int8, int8_ref(True))  # "mma_k": q as int8 codes
                ms = tc.time_graph(fn, int8, out, args.reps, iters)[0] if ok else float("inf")
            except Exception as e:  # e.g. the tiles need more shared memory than a SM has
                print(f"{name}: int8 tiles {tiles} failed: {str(e).splitlines()[0][:120]}")
                err, ok, ms = float("nan"), False, float("inf")
            gluon_int8.append(dict(case=name, variant=label, ms=ms, speedup=base / ms,
                                   max_err=err, ok=ok))
        rows += gluon_int8 + entries
        for r in rows[-len(cvts) - len(tile_sets) - len(args.gluon) - len(gluon_int8) - len(entries) - 1:]:
            r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
            r["of_peak"] = r["tflops"] / peak if peak else None
            err = "" if r["max_err"] is None else format(r["max_err"], "9.1e")
            share = f"{r['of_peak']:.0%}" if peak else "-"
            print(f"{name:<10}{sum(q_lens):>8}  {r['variant']:<22}{r['ms']:>9.4f}"
                  f"{r['speedup']:>9.2f}{err:>9}{r['tflops']:>9.1f}{share:>8}"
                  + ("" if r["ok"] else "  WRONG (vs reference)"), flush=True)
    meta = dict(device=torch.cuda.get_device_name() if not args.smoke else "cpu (interpreter)",
                torch=torch.__version__, reps=args.reps, iters=iters, default=PREFILL_INT8_CVT,
                bf16_peak_tflops=peak)
    write_json(args.out, dict(meta=meta, results=rows))
    return rows


if __name__ == "__main__":
    main()
