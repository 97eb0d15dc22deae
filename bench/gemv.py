"""Small-batch linear benchmark: cuBLAS (`F.linear`) vs `linear_small`, and the fused MLP down
projection vs `silu_and_mul` + `F.linear`, on the SmolLM2-135M, Qwen3-0.6B and Llama-3-8B shapes and
one rank's shard of the latter two at T=2 (`--models ...-tp2`), M = 1..16; without `--sweep`, M up
to 256 too (the mid-size
decode batches, where the small path falls back to cuBLAS, after the reference SiLU for down:
the cuBLAS columns then give its time and GB/s per shape, what issue 44's "GEMMs at mid-size M"
starts from).

Owns: timing inside CUDA graphs (each graph replays the op many times over rotating copies of
the weight, so the 50 MB L2 never holds it: the decode step streams every weight from HBM once;
best of several replays), the table (us, GB/s, speedup), the per-step sum for one decode token,
and `--sweep`, which times a grid of `GemvConfig`s per (shape, M) and prints the winners as
`kernels/gemv_tuned.py` entries (None where cuBLAS stays faster). The down shape is swept with
the fused SiLU op, since that is how the model runs it. Never asserts correctness (that is
tests/kernels/test_gemv.py); without CUDA it prints a note and exits 0.
To add a shape: extend SHAPES (name -> (N, K)); `down` is always the fused op.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]
sys.path.insert(0, _ROOT)

from bench.graph_timing import best_replay_s  # noqa: E402

SHAPES = {
    "qwen3-0.6b": {"layers": 28, "qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                   "down": (1024, 3072), "lm_head": (151936, 1024)},
    # the packaged model (SmolLM2-135M); its table rows stay unset: see docs/kernels.md
    "smollm2-135m": {"layers": 30, "qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576),
                     "down": (576, 1536), "lm_head": (49152, 576)},
    "llama-3-8b": {"layers": 32, "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                   "down": (4096, 14336), "lm_head": (128256, 4096)},
    # one rank's shard at T=2: column-parallel N halves (qkv, gate_up, LM head), row-parallel K (o, down)
    "qwen3-0.6b-tp2": {"layers": 28, "qkv": (2048, 1024), "o": (1024, 1024), "gate_up": (3072, 1024),
                       "down": (1024, 1536), "lm_head": (75968, 1024)},
    "llama-3-8b-tp2": {"layers": 32, "qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096),
                       "down": (4096, 7168), "lm_head": (64128, 4096)},
}
MS = (1, 2, 4, 8, 16)
_ROTATE_BYTES = 256 << 20  # weight copies per graph cover this much (> the H100's 50 MB L2)
_GRAPH_BYTES = 2 << 30     # about this much weight traffic per replay


def candidates(m: int, n: int, k: int):
    """The sweep grid for one (M, N, K): CUDA-core configs up to 4 rows, dot configs from 2."""
    from infer_cluster.kernels.gemv_triton import GemvConfig
    out = []
    mb = 1 << max(0, m - 1).bit_length()
    splits = [s for s in (1, 2, 4, 8) if k // s >= 256]
    if mb <= 4:
        for bn, bk, warps, stages in itertools.product((4, 8, 16, 32, 64), (128, 256, 512, 1024, 2048),
                                                       (4, 8), (1, 3)):
            if mb * bn * bk > 32 * warps * 64 or bn * bk < 32 * warps * 4 or bk > k:  # registers / idle lanes
                continue
            out += [GemvConfig(bn, bk, warps, stages, s, False) for s in splits
                    if s == 1 or -(-n // bn) < 264]
    if mb >= 2:
        for bn, bk, stages in itertools.product((16, 32, 64), (64, 128, 256), (2, 3, 4)):
            out += [GemvConfig(bn, bk, 4, stages, s, True) for s in splits
                    if s == 1 or -(-n // bn) < 264]
    return out


def _op(kind, x, w, cfg=None):
    """A callable for one variant: 'cublas', 'small' (pick_config or cfg), fused 'silu_*'."""
    import torch.nn.functional as F

    from infer_cluster.kernels import gemv
    from infer_cluster.kernels.activation import silu_and_mul
    from infer_cluster.kernels.gemv_triton import linear_small_triton, silu_mul_linear_small_triton
    if kind == "cublas":
        return lambda w: F.linear(x, w)
    if kind == "silu_cublas":
        return lambda w: F.linear(silu_and_mul(x), w)
    if kind == "small":
        return (lambda w: linear_small_triton(x, w, cfg=cfg)) if cfg else (lambda w: gemv.linear_small(x, w))
    if kind == "silu_small":
        return (lambda w: silu_mul_linear_small_triton(x, w, cfg)) if cfg else \
            (lambda w: gemv.silu_mul_linear_small(x, w))
    raise ValueError(kind)


def time_op(fn, weights, replays=6):
    """Seconds per op: one graph runs fn over the weight copies `reps` times; best replay."""
    per_graph = max(5, min(50, _GRAPH_BYTES // max(1, weights[0].numel() * weights[0].element_size())))
    return best_replay_s(lambda i: fn(weights[i % len(weights)]), per_graph, replays)


def _inputs(model, shape, m, dtype, l2_hot=False):
    import torch
    n, k = SHAPES[model][shape]
    el = torch.tensor([], dtype=dtype).element_size()
    # --l2-hot: one copy, so a weight that fits in L2 is read from it (as after the L2 prefetch,
    # worker/models/l2_prefetch.py).
    copies = 1 if l2_hot else max(1, min(32, -(-_ROTATE_BYTES // (n * k * el))))
    weights = [torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5 for _ in range(copies)]
    width = 2 * k if shape == "down" else k
    x = torch.randn(m, width, device="cuda", dtype=dtype)
    nbytes = el * (n * k + m * width + m * n)
    return n, k, x, weights, nbytes


def _warm_one(job):
    """Worker: compile one config at the same specialisation the timed call will have."""
    m, k, cfg, silu = job
    import torch

    from infer_cluster.kernels.gemv_triton import linear_small_triton, silu_mul_linear_small_triton
    w = torch.zeros(256, k, device="cuda", dtype=torch.bfloat16)
    if silu:
        silu_mul_linear_small_triton(torch.zeros(m, 2 * k, device="cuda", dtype=torch.bfloat16), w, cfg)
    else:
        linear_small_triton(torch.zeros(m, k, device="cuda", dtype=torch.bfloat16), w, cfg=cfg)
    torch.cuda.synchronize()
    return 1


def _variant(m, k, cfg, silu):
    """What tells compiled kernels apart: the constexprs, the launch options, and how Triton
    specialises M (== 1, multiple of 16); N, K and the strides are multiples of 16 here."""
    rows = ("dot", m == 1, m % 16 == 0) if cfg.use_dot else m
    k_per_split = -(-(-(-k // cfg.split_k)) // cfg.block_k) * cfg.block_k
    return (rows, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.use_dot,
            k_per_split < k, silu, k % cfg.block_k == 0)


def precompile(jobs, workers):
    """Fill Triton's on-disk cache in parallel processes (compiling dominates the sweep)."""
    import multiprocessing as mp
    t0 = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_warm_one, jobs, chunksize=4)
    print(f"precompiled {len(jobs)} variants with {workers} processes in {time.time() - t0:.1f} s", flush=True)


def sweep(models, ms, dtype, workers, budget_s, l2_hot=False):
    import torch
    deadline = time.time() + budget_s
    jobs = {}
    for model, m in itertools.product(models, ms):
        for shape in ("qkv", "o", "gate_up", "down", "lm_head"):
            n, k = SHAPES[model][shape]
            for c in candidates(m, n, k):
                jobs.setdefault(_variant(m, k, c, shape == "down"), (m, k, c, shape == "down"))
    if workers > 1:
        precompile(list(jobs.values()), workers)
    results, lines = [], []
    for model in models:
        for shape in ("qkv", "o", "gate_up", "down", "lm_head"):
            for m in ms:
                if time.time() > deadline:
                    print(f"    # {model} {shape} M={m}: not swept (--budget-s {budget_s:.0f} spent)")
                    continue
                n, k, x, weights, nbytes = _inputs(model, shape, m, dtype, l2_hot)
                silu = shape == "down"
                base = time_op(_op("silu_cublas" if silu else "cublas", x, None), weights)
                timed = []
                for cfg in candidates(m, n, k):
                    try:
                        timed.append((time_op(_op("silu_small" if silu else "small", x, None, cfg), weights), cfg))
                    except Exception as e:  # a config that fails to compile/launch loses, the sweep goes on
                        print(f"  {model} {shape} M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}")
                timed.sort(key=lambda t: t[0])
                best_t, best = timed[0] if timed else (float("inf"), None)
                use = best if best_t < 0.98 * base else None
                results.append({"model": model, "shape": shape, "n": n, "k": k, "m": m,
                                "cublas_us": base * 1e6, "best_us": best_t * 1e6, "best": repr(best),
                                "use": None if use is None else dataclasses.asdict(use),
                                "top5": [(t * 1e6, repr(c)) for t, c in timed[:5]]})
                note = (f"# {model} {shape}: {best_t * 1e6:.1f} us vs {'silu+' if silu else ''}cuBLAS "
                        f"{base * 1e6:.1f} us ({nbytes / best_t / 1e9:.0f} GB/s)")
                lines.append(f"    ({n}, {k}, {m}): {use!r},  {note}")
                print(lines[-1], flush=True)
                del weights, x
                torch.cuda.empty_cache()
    print("\n# paste into kernels/gemv_tuned.py:\nTUNED: dict = {\n" + "\n".join(lines) + "\n}")
    return results


def load_tuned(path):
    """{(N, K, M): GemvConfig or None} from a `--sweep --out` JSON (to time a sweep's picks
    before they are pasted into kernels/gemv_tuned.py)."""
    from infer_cluster.kernels.gemv_triton import GemvConfig
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["n"], r["k"], r["m"]): GemvConfig(**r["use"]) if r["use"] else None for r in rows}


def compare(models, ms, dtype, tuned=None, l2_hot=False):
    import torch
    rows = []
    for model in models:
        for shape in ("qkv", "o", "gate_up", "down", "lm_head"):
            for m in ms:
                n, k, x, weights, nbytes = _inputs(model, shape, m, dtype, l2_hot)
                silu = shape == "down"
                t_ref = time_op(_op("silu_cublas" if silu else "cublas", x, None), weights)
                if tuned is not None and (n, k, m) in tuned:  # the sweep's pick; None = cuBLAS
                    cfg = tuned[(n, k, m)]
                    kind = ("silu_" if silu else "") + ("small" if cfg else "cublas")
                    t_new = time_op(_op(kind, x, None, cfg), weights) if cfg else t_ref
                else:
                    t_new = time_op(_op("silu_small" if silu else "small", x, None), weights)
                rows.append({"model": model, "shape": shape + ("+silu" if silu else ""), "n": n, "k": k,
                             "m": m, "cublas_us": t_ref * 1e6, "small_us": t_new * 1e6,
                             "cublas_gbs": nbytes / t_ref / 1e9, "small_gbs": nbytes / t_new / 1e9,
                             "speedup": t_ref / t_new})
                del weights, x
                torch.cuda.empty_cache()
    print(f"{'model':<11} {'shape':<12} {'M':>2} {'cuBLAS us':>9} {'GB/s':>6} {'small us':>9} {'GB/s':>6} {'x':>5}")
    for r in rows:
        print(f"{r['model']:<11} {r['shape']:<12} {r['m']:>2} {r['cublas_us']:>9.2f} {r['cublas_gbs']:>6.0f} "
              f"{r['small_us']:>9.2f} {r['small_gbs']:>6.0f} {r['speedup']:>5.2f}")
    for model in models:  # what one decode token spends in these ops (each layer once, LM head once)
        for m in ms:
            sel = [r for r in rows if r["model"] == model and r["m"] == m]
            layers = SHAPES[model]["layers"]
            tot = {c: sum(r[c] * (1 if r["shape"] == "lm_head" else layers) for r in sel)
                   for c in ("cublas_us", "small_us")}
            print(f"{model} M={m}: linears per step {tot['cublas_us']:.0f} us (cuBLAS) -> "
                  f"{tot['small_us']:.0f} us (small path, LM head as dispatched)")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", action="store_true", help="time a grid of launch configs and print the best per (shape, M)")
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--m", nargs="+", type=int, default=list(MS),
                    help="batch rows to time (<= 16 with --sweep, else <= 256: past 16 the small path falls back "
                         "to cuBLAS)")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes that precompile the sweep's kernels (1 = compile inline)")
    ap.add_argument("--budget-s", type=float, default=180,
                    help="sweep: stop starting new (shape, M) cells after this many seconds")
    ap.add_argument("--tuned", default=None,
                    help="compare: use the picks of this --sweep JSON instead of kernels/gemv_tuned.py")
    ap.add_argument("--l2-hot", action="store_true",
                    help="time one copy of each weight (read from L2 when it fits), not rotating copies")
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench/gemv.py: no CUDA device; nothing to time")
        return 0
    most = 16 if args.sweep else 256
    if any(not 1 <= m <= most for m in args.m):
        ap.error(f"--m values must be in 1..{most}{' with --sweep' if args.sweep else ''}")
    t0 = time.time()
    if args.sweep:
        rows = sweep(args.models, args.m, torch.bfloat16, args.jobs, args.budget_s, args.l2_hot)
    else:
        rows = compare(args.models, args.m, torch.bfloat16,
                       load_tuned(args.tuned) if args.tuned else None, args.l2_hot)
    print(f"({time.time() - t0:.0f} s on {torch.cuda.get_device_name()})")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "sweep": args.sweep, "l2_hot": args.l2_hot, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
