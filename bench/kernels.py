"""Kernel microbenchmark: each Triton kernel vs its plain-torch reference, on Qwen3-0.6B shapes.

Owns: timing (CUDA events, warmup, median of --iters), a correctness spot check (max abs error vs
the reference) and one table plus a JSON file. Shapes: 16 query / 8 KV heads, head_dim 128,
hidden 1024, intermediate 3072; decode batch 256 with ~600-token contexts; prefill 8k tokens.
Each case is isolated: a failure (OOM in a reference, a compile error) is reported in its row and
the run goes on. Never asserts: correctness is tests/kernels' job.

Without CUDA it prints a note and exits 0; `--interpret` instead runs tiny shapes under Triton's
CPU interpreter (times meaningless; useful only to check that the script itself works).
To add a kernel: write a `case_*` function returning Case objects and list it in CASES.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

# Run as `python bench/kernels.py`: make the repo's `kernels` package win over this file's name.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]
sys.path.insert(0, _ROOT)


@dataclass
class Case:
    kernel: str
    shape: str
    triton: Callable[[], object]
    torch: Callable[[], object]
    work: float            # bytes moved, or FLOPs when metric is TFLOP/s
    metric: str = "GB/s"   # "GB/s" or "TFLOP/s"
    # In-place kernels: `reset` restores their inputs, `output` returns what they wrote.
    reset: Callable[[], None] | None = None
    output: Callable[[], object] | None = None


def _rand(shape, dtype, device, scale=1.0):
    import torch
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def case_elementwise(s, dtype, device):
    import torch

    from infer_cluster.kernels.activation import silu_and_mul_ref
    from infer_cluster.kernels.activation_triton import silu_and_mul_triton
    from infer_cluster.kernels.kv_append import kv_append_ref
    from infer_cluster.kernels.kv_append_triton import kv_append_triton
    from infer_cluster.kernels.norm import rms_norm_ref
    from infer_cluster.kernels.norm_triton import rms_norm_triton
    from infer_cluster.kernels.rotary import apply_rotary_ref, build_rope_cache
    from infer_cluster.kernels.rotary_triton import apply_rotary_triton
    el = torch.tensor([], dtype=dtype).element_size()
    cases = []
    for n in s["tokens"]:
        x, res = _rand((n, s["hidden"]), dtype, device), _rand((n, s["hidden"]), dtype, device)
        w = _rand((s["hidden"],), dtype, device, 0.1) + 1
        cases.append(Case("rms_norm+residual", f"{n}x{s['hidden']}",
                          lambda x=x, r=res, w=w: rms_norm_triton(x, w, 1e-6, r),
                          lambda x=x, r=res, w=w: rms_norm_ref(x, w, 1e-6, r),
                          el * n * s["hidden"] * 4))
        gu = _rand((n, 2 * s["inter"]), dtype, device)
        cases.append(Case("silu_and_mul", f"{n}x{2 * s['inter']}",
                          lambda gu=gu: silu_and_mul_triton(gu),
                          lambda gu=gu: silu_and_mul_ref(gu), el * n * s["inter"] * 3))
        h, hk, d = s["heads"], s["kv_heads"], s["head_dim"]
        qkv = _rand((n, (h + 2 * hk) * d), dtype, device)
        qkv0 = qkv.clone()
        q, k = qkv[:, :h * d].view(n, h, d), qkv[:, h * d:(h + hk) * d].view(n, hk, d)
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=device).float() / d))
        cos, sin = build_rope_cache(inv, 40960)
        pos = torch.randint(0, 4096, (n,), device=device)
        cases.append(Case("rotary (q,k in qkv)", f"{n}x({h}+{hk})x{d}",
                          lambda q=q, k=k, p=pos, c=cos, si=sin:
                          apply_rotary_triton(q, k, p, c, si),
                          lambda q=q, k=k, p=pos, c=cos, si=sin:
                          apply_rotary_ref(q, k, p, c, si),
                          el * n * (h + hk) * d * 2 + 4 * n * d * 2,
                          reset=lambda a=qkv, b=qkv0: a.copy_(b), output=lambda a=qkv: a))
        key, val = _rand((n, hk, d), dtype, device), _rand((n, hk, d), dtype, device)
        num_blocks, bs = max(2 * n // 16, 64), 16
        kc = torch.zeros(num_blocks, bs, hk, d, device=device, dtype=dtype)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(num_blocks * bs, device=device)[:n].to(torch.int64)
        args = (key, val, kc, vc, slots)
        cases.append(Case("kv_append", f"{n}x{hk}x{d} bs{bs}",
                          lambda a=args: kv_append_triton(*a),
                          lambda a=args: kv_append_ref(*a),
                          el * n * hk * d * 4, reset=lambda a=args: (a[2].zero_(), a[3].zero_()),
                          output=lambda a=args: (a[2], a[3])))
    return cases


def _paged_batch(q_lens, ctx_lens, h, hk, d, bs, dtype, device):
    import torch
    blocks = [(c + bs - 1) // bs for c in ctx_lens]
    kc = _rand((sum(blocks) + 1, bs, hk, d), dtype, device)
    vc = _rand(tuple(kc.shape), dtype, device)
    ids = torch.randperm(sum(blocks), device=device).to(torch.int32)
    bt = torch.zeros(len(ctx_lens), max(blocks), dtype=torch.int32, device=device)
    used = 0
    for i, n in enumerate(blocks):
        bt[i, :n] = ids[used:used + n]
        used += n
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = _rand((starts[-1], h, d), dtype, device)
    qsl = torch.tensor(starts, dtype=torch.int32, device=device)
    lens = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
    return q, kc, vc, bt, qsl, lens


def case_attention(s, dtype, device):
    import random

    from infer_cluster.kernels import attention, attention_triton
    import torch
    h, hk, d = s["heads"], s["kv_heads"], s["head_dim"]
    el = torch.tensor([], dtype=dtype).element_size()
    rng = random.Random(0)
    cases = []

    def add(name, q_lens, ctx_lens):
        batch = _paged_batch(q_lens, ctx_lens, h, hk, d, 16, dtype, device)
        mql = max(q_lens)
        if mql == 1:  # decode is bandwidth-bound: count the KV bytes read
            work, metric = el * sum(ctx_lens) * hk * d * 2 + el * 2 * len(q_lens) * h * d, "GB/s"
        else:         # prefill is compute-bound: 2 matmuls x 2 FLOPs over causal (q, k) pairs
            pairs = sum(sum(c - q + j + 1 for j in range(q)) for q, c in zip(q_lens, ctx_lens))
            work, metric = 4.0 * pairs * h * d, "TFLOP/s"
        scale = d ** -0.5
        cases.append(Case(name, f"{len(q_lens)} seqs, q {sum(q_lens)}, ctx {sum(ctx_lens)}",
                          lambda: attention_triton.paged_attention_triton(*batch, scale, mql),
                          lambda: attention.paged_attention_ref(*batch, scale), work, metric))

    for b, ctx in s["decode"]:
        add(f"decode b{b}", [1] * b, [rng.randint(ctx // 2, 3 * ctx // 2) for _ in range(b)])
    for num, q_len, prefix in s["prefill"]:
        kind = "prefill" if prefix == 0 else "chunked prefill"
        add(f"{kind} {num}x{q_len}", [q_len] * num, [prefix + q_len] * num)
    return cases


def _quantized(cache):
    """int8 codes and float32 scales [blocks, kv_heads, page] of a float cache (the append rule)."""
    from infer_cluster.kernels.kv_append import quantize_int8_ref
    codes, scale = quantize_int8_ref(cache)
    return codes, scale.transpose(1, 2).contiguous()


def case_int8(s, dtype, device):
    """`--int8`: kv_append into an int8 cache, and decode/prefill attention over one, on the same
    shapes (and, for decode, the same context draws) as the float rows, so the ms compare
    directly. GB/s counts the int8 codes plus the float32 scales."""
    import random

    import torch

    from infer_cluster.kernels import attention, attention_triton
    from infer_cluster.kernels.kv_append import kv_append_ref
    from infer_cluster.kernels.kv_append_triton import kv_append_triton
    h, hk, d = s["heads"], s["kv_heads"], s["head_dim"]
    el = torch.tensor([], dtype=dtype).element_size()
    cases = []
    for n in s["tokens"]:
        key, val = _rand((n, hk, d), dtype, device), _rand((n, hk, d), dtype, device)
        num_blocks, bs = max(2 * n // 16, 64), 16
        kc = torch.zeros(num_blocks, bs, hk, d, device=device, dtype=torch.int8)
        vc = torch.zeros_like(kc)
        ks = torch.zeros(num_blocks, hk, bs, device=device)
        vs = torch.zeros_like(ks)
        slots = torch.randperm(num_blocks * bs, device=device)[:n].to(torch.int64)
        args = (key, val, kc, vc, slots, ks, vs)
        cases.append(Case("kv_append int8", f"{n}x{hk}x{d} bs{bs}",
                          lambda a=args: kv_append_triton(*a), lambda a=args: kv_append_ref(*a),
                          n * hk * 2 * (el * d + d + 4),
                          reset=lambda a=args: [t.zero_() for t in a[2:4] + a[5:]],
                          output=lambda a=args: (a[2], a[3], a[5], a[6])))
    rng = random.Random(0)  # the same draws as case_attention's decode rows

    def add(name, q_lens, ctx_lens):
        q, kc, vc, bt, qsl, lens = _paged_batch(q_lens, ctx_lens, h, hk, d, 16, dtype, device)
        (kc, ks), (vc, vs) = _quantized(kc), _quantized(vc)
        mql, scale = max(q_lens), d ** -0.5
        if mql == 1:
            work, metric = sum(ctx_lens) * hk * (d + 4) * 2 + el * 2 * len(q_lens) * h * d, "GB/s"
        else:
            pairs = sum(sum(c - q + j + 1 for j in range(q)) for q, c in zip(q_lens, ctx_lens))
            work, metric = 4.0 * pairs * h * d, "TFLOP/s"
        scales = dict(k_scale=ks, v_scale=vs)
        cases.append(Case(name, f"{len(q_lens)} seqs, q {sum(q_lens)}, ctx {sum(ctx_lens)}",
                          lambda: attention_triton.paged_attention_triton(
                              q, kc, vc, bt, qsl, lens, scale, mql, **scales),
                          lambda: attention.paged_attention_ref(q, kc, vc, bt, qsl, lens, scale,
                                                                **scales), work, metric))

    for b, ctx in s["decode"]:
        add(f"decode int8 b{b}", [1] * b, [rng.randint(ctx // 2, 3 * ctx // 2) for _ in range(b)])
    for num, q_len, prefix in s["prefill"]:
        kind = "prefill" if prefix == 0 else "chunked prefill"
        add(f"{kind} int8 {num}x{q_len}", [q_len] * num, [prefix + q_len] * num)
    return cases


CASES = [case_elementwise, case_attention]

SHAPES = {  # Qwen3-0.6B
    "gpu": dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128,
                tokens=[256, 8192], decode=[(256, 600), (32, 4096), (1, 16384)],
                prefill=[(8, 1024, 0), (1, 8192, 0), (4, 512, 2048)]),
    "interpret": dict(hidden=64, inter=96, heads=4, kv_heads=2, head_dim=32, tokens=[8],
                      decode=[(4, 40)], prefill=[(2, 16, 0), (1, 8, 24)]),
}


def _time(fn, sync, warmup, iters):
    """Median milliseconds of fn(): CUDA events on a GPU, wall clock otherwise."""
    import torch
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _call_for_check(c, fn):
    if c.reset is None:
        return fn()
    c.reset()
    fn()
    out = c.output()
    return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


def _max_err(a, b):
    if isinstance(a, tuple):
        return max(_max_err(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def run_case(c, sync, warmup, iters):
    import torch
    row = dict(kernel=c.kernel, shape=c.shape, metric=c.metric)
    try:
        got = _call_for_check(c, c.triton)
        row["max_abs_err"] = _max_err(got, _call_for_check(c, c.torch))
        row["ms_triton"] = _time(c.triton, sync, warmup, iters)
    except Exception as e:  # report and carry on: one broken case must not hide the rest
        row["error"] = f"triton: {type(e).__name__}: {str(e)[:200]}"
        return row
    try:
        row["ms_torch"] = _time(c.torch, sync, max(1, warmup // 5), max(3, iters // 5))
    except Exception as e:  # the float32 references can run out of memory at 8k tokens
        row["torch_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    scale = 1e9 if c.metric == "GB/s" else 1e12
    row["triton_rate"] = c.work / (row["ms_triton"] * 1e-3) / scale
    if "ms_torch" in row:
        row["torch_rate"] = c.work / (row["ms_torch"] * 1e-3) / scale
        row["speedup"] = row["ms_torch"] / row["ms_triton"]
    return row


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(rows):
    head = (f"{'kernel':<24} {'shape':<36} {'ms triton':>10} {'ms torch':>10} {'speedup':>8} "
            f"{'triton':>10} {'torch':>10} {'unit':<7} {'max err':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['kernel']:<24} {r['shape']:<36} ERROR {r['error']}")
            continue
        print(f"{r['kernel']:<24} {r['shape']:<36} {_fmt(r['ms_triton'], '10.4f')} "
              f"{_fmt(r.get('ms_torch'), '10.4f')} {_fmt(r.get('speedup'), '8.2f')} "
              f"{_fmt(r['triton_rate'], '10.1f')} {_fmt(r.get('torch_rate'), '10.1f')} "
              f"{r['metric']:<7} {_fmt(r.get('max_abs_err'), '8.1e')}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", default="bench/results/kernels.json", help="JSON output path")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", default="", help="substring filter on kernel names")
    ap.add_argument("--int8", action="store_true",
                    help="also time the int8 KV cache variants (kv_append, decode, prefill)")
    ap.add_argument("--interpret", action="store_true",
                    help="without CUDA: tiny shapes under TRITON_INTERPRET=1 (times meaningless)")
    args = ap.parse_args(argv)

    import torch
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.interpret:
        print("bench/kernels.py: no CUDA device; nothing to time. "
              "(--interpret runs tiny shapes on the Triton CPU interpreter to smoke-test.)")
        return 0
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import
        print("NOTE: Triton CPU interpreter, tiny shapes: timings are meaningless.")
    device = "cuda" if on_gpu else "cpu"
    dtype = getattr(torch, args.dtype)
    shapes = SHAPES["gpu" if on_gpu else "interpret"]
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    warmup, iters = (args.warmup, args.iters) if on_gpu else (1, 2)
    torch.manual_seed(0)

    rows = []
    for make in CASES + ([case_int8] if args.int8 else []):
        try:
            cases = make(shapes, dtype, device)
        except Exception as e:
            rows.append(dict(kernel=make.__name__, shape="-", metric="",
                             error=f"setup: {type(e).__name__}: {str(e)[:200]}"))
            continue
        for c in cases:
            if args.only in c.kernel:
                rows.append(run_case(c, sync, warmup, iters))
        del cases
        if on_gpu:
            torch.cuda.empty_cache()

    import triton
    meta = dict(device=torch.cuda.get_device_name() if on_gpu else "cpu (interpreter)",
                dtype=args.dtype, torch=torch.__version__, triton=triton.__version__,
                warmup=warmup, iters=iters, interpreted=not on_gpu)
    print(f"# {meta['device']}  dtype={args.dtype}  torch {meta['torch']}  triton {meta['triton']}")
    print_table(rows)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, results=rows), f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
