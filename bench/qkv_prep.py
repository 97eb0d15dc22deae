"""Fused attention input prep (`qkv_prep_triton`) vs the old composition it replaced (RMSNorm on q,
RMSNorm on k, rotary, KV append: four Triton launches), timed as the engine runs them.

Owns: one table (cache, n, old us, fused us, old/fused) and a JSON file. Shape: Qwen3-0.6B per
layer (16 query heads, 8 KV heads, head_dim 128, q/k norm on, bf16 activations), bf16 and int8
caches, n tokens in {1, 8, 64, 256}. Each variant is captured `--reps` times into one CUDA graph
and the graph replayed `--iters` times (median of per-replay events / reps); an eager column
(events around one call, host launch cost included) is printed too, and the fused kernel with
other head groupings (`--block-h`, more programs per token). Before timing, both variants
run once on the same inputs and the max differences of q and of the written cache rows are
checked (the fused kernel must agree within bf16 rounding / one int8 code step). `--smoke` runs
on the CPU interpreter with tiny counts: it checks the script, its times mean nothing.

  python bench/qkv_prep.py [--n 1 8 64 256] [--out bench/results/qkv_prep.json]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HQ, HKV, D, BLOCK_SIZE, NUM_BLOCKS, MAX_POS = 16, 8, 128, 16, 64, 4096


def _inputs(torch, n, int8, device):
    from infer_cluster.kernels.rotary import build_rope_cache
    g = torch.Generator(device="cpu").manual_seed(n)
    qkv = torch.randn(n, (HQ + 2 * HKV) * D, generator=g).to(device, torch.bfloat16)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
    cos, sin = build_rope_cache(inv_freq.to(device), MAX_POS)
    positions = torch.randint(0, MAX_POS, (n,), generator=g).to(device)
    blocks = max(NUM_BLOCKS, -(-2 * n // BLOCK_SIZE))  # room for a prefill step's tokens
    slots = torch.randperm(blocks * BLOCK_SIZE, generator=g)[:n].to(device)
    shape = (blocks, BLOCK_SIZE, HKV, D)
    kc = torch.zeros(shape, device=device, dtype=torch.int8 if int8 else torch.bfloat16)
    scales = [torch.zeros(blocks, HKV, BLOCK_SIZE, device=device) for _ in range(2)] \
        if int8 else [None, None]
    w = [(torch.rand(D, generator=g) + 0.5).to(device, torch.bfloat16) for _ in range(2)]
    return dict(qkv=qkv, positions=positions, cos_cache=cos, sin_cache=sin, slot_mapping=slots,
                k_cache=kc, v_cache=kc.clone(), q_norm_weight=w[0], k_norm_weight=w[1], eps=1e-6,
                k_scale=scales[0], v_scale=scales[1], num_heads=HQ, num_kv_heads=HKV, head_dim=D)


def old_composition(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                    q_norm_weight, k_norm_weight, eps, k_scale, v_scale, num_heads, num_kv_heads,
                    head_dim):
    """What Attention.forward launched before the fusion (Triton path)."""
    from infer_cluster.kernels.kv_append_triton import kv_append_triton
    from infer_cluster.kernels.norm_triton import rms_norm_triton
    from infer_cluster.kernels.qkv_prep import split_qkv
    from infer_cluster.kernels.rotary_triton import apply_rotary_triton
    q, k, v = split_qkv(qkv, num_heads, num_kv_heads, head_dim)
    q, k = rms_norm_triton(q, q_norm_weight, eps), rms_norm_triton(k, k_norm_weight, eps)
    apply_rotary_triton(q, k, positions, cos_cache, sin_cache)
    kv_append_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def _fresh(torch, case):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def _max_diffs(torch, case, fused):
    """(q, k cache, v cache) max |old - fused| on the same inputs (int8: in code steps)."""
    a, b = _fresh(torch, case), _fresh(torch, case)
    qa, qb = old_composition(**a), fused(**b)
    diffs = [(qa.float() - qb.float()).abs().max().item()]
    for key in ("k_cache", "v_cache"):
        diffs.append((a[key].float() - b[key].float()).abs().max().item())
    return diffs


def _time_graph(torch, fn, case, reps, iters):
    """Microseconds per call: `fn(**case)` captured `reps` times in one CUDA graph, median of
    `iters` replays (bench/tune_decode_cases.time_graph, which all decode benches share)."""
    from bench import tune_decode_cases as tc
    median_ms, _ = tc.time_graph(lambda batch, _out: fn(**batch), {"batches": [case]}, [None], reps, iters)
    return median_ms * 1e3


def _time_eager(torch, fn, case, iters, cuda):
    for _ in range(3):
        fn(**case)
    samples = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(**case)
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) * 1e3)
        else:
            t0 = time.perf_counter()
            fn(**case)
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=None,
                    help="tokens per call (default: 1 8 64 256; with --smoke 1 8)")
    ap.add_argument("--reps", type=int, default=50, help="calls per captured graph")
    ap.add_argument("--iters", type=int, default=50, help="graph replays (median taken)")
    ap.add_argument("--out", default="bench/results/qkv_prep.json")
    ap.add_argument("--block-h", type=int, nargs="*", default=[4],
                    help="also time the fused kernel with these heads per program (default: "
                         "the entry point's choice, 16 at this shape, plus these)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny counts")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    if args.n is None:
        args.n = [1, 8] if args.smoke else [1, 8, 64, 256]
    import torch

    from bench.report import write_json
    from infer_cluster.kernels.qkv_prep_triton import qkv_prep_triton

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        sys.exit("bench/qkv_prep.py needs a CUDA device (or --smoke for a CPU script check)")
    device = "cuda" if cuda else "cpu"
    rows = []
    print(f"{'cache':<6}{'n':>5}{'old us':>10}{'fused us':>10}{'ratio':>8}"
          f"{'old eager':>11}{'fused eager':>13}  max diff q / k / v")
    for int8 in (False, True):
        for n in args.n:
            case = _inputs(torch, n, int8, device)
            diffs = _max_diffs(torch, case, qkv_prep_triton)
            # bf16: a few ulps at |x| < 8; int8: one code step (two under the interpreter,
            # which truncates float32 -> bf16); v is copied or quantized identically.
            if diffs[0] > 0.1 or diffs[1] > ((1 if cuda else 2) if int8 else 0.1) or diffs[2] > 0:
                sys.exit(f"fused result differs from the old composition: {diffs}")
            row = dict(cache="int8" if int8 else "bf16", n=n, max_diff_q_k_v=diffs)
            for name, fn in (("old", old_composition), ("fused", qkv_prep_triton)):
                work = _fresh(torch, case)
                row[f"{name}_us"] = (_time_graph(torch, fn, work, args.reps, args.iters) if cuda
                                     else _time_eager(torch, fn, work, 2, False))
                row[f"{name}_eager_us"] = _time_eager(torch, fn, work, args.iters if cuda else 2,
                                                      cuda)
            for bh in args.block_h:
                fn = functools.partial(qkv_prep_triton, block_h=bh)
                work = _fresh(torch, case)
                row[f"fused_bh{bh}_us"] = (_time_graph(torch, fn, work, args.reps, args.iters)
                                           if cuda else _time_eager(torch, fn, work, 2, False))
            row["ratio"] = row["old_us"] / row["fused_us"]
            rows.append(row)
            print(f"{row['cache']:<6}{n:>5}{row['old_us']:>10.2f}{row['fused_us']:>10.2f}"
                  f"{row['ratio']:>8.2f}{row['old_eager_us']:>11.1f}{row['fused_eager_us']:>13.1f}"
                  f"  {diffs[0]:.3g} / {diffs[1]:.3g} / {diffs[2]:.3g}"
                  + "".join(f"  bh={bh}: {row[f'fused_bh{bh}_us']:.2f}" for bh in args.block_h))
    meta = dict(device=torch.cuda.get_device_name() if cuda else "cpu (smoke)",
                shape=dict(num_heads=HQ, num_kv_heads=HKV, head_dim=D, dtype="bfloat16",
                           qk_norm=True),
                reps=args.reps, iters=args.iters, torch=torch.__version__)
    write_json(args.out, dict(meta=meta, rows=rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
