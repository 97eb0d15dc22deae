"""Decode tuner inputs and timing: the paged decode batches `bench/tune_decode.py` sweeps over.

Owns: the Qwen3-0.6B head shapes (H query / HK KV heads, head_dim D, page PAGE), the cases
(`build_case`, `make_cases`: pages shuffled across the cache, padding entries pointing at a spare
page, tight or graph-width block tables), the timers (`time_graph`: CUDA-graph replays rotating
input copies; `time_eager`: one call between CUDA events, as bench/kernels.py), the correctness
check against a reference output (`check`) and the device copy bandwidth. Knows nothing of
configs, stages or the CLI (bench/tune_decode.py). Imports torch only inside functions, so
`--smoke` can set TRITON_INTERPRET before anything loads triton.

SMOKE (set by `tune_decode.py --smoke`): tiny batches on the CPU interpreter, wall-clock timing.
To add a case: a (name, context lengths, copies) entry in `make_cases` (and its SMOKE twin).
"""

from __future__ import annotations

import statistics
import time

H, HK, D, PAGE = 16, 8, 128, 16
GRAPH_WIDTH = 40960 // PAGE
SMOKE = False  # --smoke: CPU interpreter, tiny batches, wall-clock timing (checks the script only)


def sync():
    import torch
    if not SMOKE:
        torch.cuda.synchronize()


def build_case(name, ctx_lens, copies, width, device, dtype, seed):
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)
    blocks = [(c + PAGE - 1) // PAGE for c in ctx_lens]
    width = max(width, max(blocks))
    total = sum(blocks) * copies
    k_cache = torch.randn(total + 1, PAGE, HK, D, generator=gd, device=device).to(dtype)
    v_cache = torch.randn(total + 1, PAGE, HK, D, generator=gd, device=device).to(dtype)
    ids = torch.randperm(total, generator=g).to(torch.int32)
    batches, used = [], 0
    n = len(ctx_lens)
    for _ in range(copies):
        bt = torch.full((n, width), total, dtype=torch.int32)   # padding -> the spare page
        for i, b in enumerate(blocks):
            bt[i, :b] = ids[used:used + b]
            used += b
        q = torch.randn(n, H, D, generator=gd, device=device).to(dtype)
        qsl = torch.arange(n + 1, dtype=torch.int32, device=device)
        lens = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
        batches.append((q, k_cache, v_cache, bt.to(device), qsl, lens))
    el = torch.tensor([], dtype=dtype).element_size()
    work = el * sum(ctx_lens) * HK * D * 2 + el * 2 * n * H * D  # as bench/kernels.py counts
    return dict(name=name, batches=batches, work=work, ctx_total=sum(ctx_lens), num_seqs=n,
                width=width, ctx_max=max(ctx_lens))


def make_cases(device, dtype, graph_width=False, b1_copies=4):
    import random
    rng = random.Random(0)
    specs = [("b256", [rng.randint(100, 1100) for _ in range(256)], 1),
             ("b32", [rng.randint(2048, 6144) for _ in range(32)], 1),
             ("b1", [12728], b1_copies)]
    if SMOKE:
        specs = [("b256", [rng.randint(10, 60) for _ in range(2)], 1),
                 ("b32", [rng.randint(100, 200)], 1), ("b1", [300], 2)]
    cases = []
    for i, (name, lens, copies) in enumerate(specs):
        width = (GRAPH_WIDTH if not SMOKE else 64) if graph_width else 0
        c = build_case(name + (" graph-width" if graph_width else ""), lens, copies, width,
                       device, dtype, seed=i)
        c["key"] = name
        cases.append(c)
    return cases


def time_graph(fn, case, outs, reps, iters):
    import torch
    batches = case["batches"]
    if SMOKE:
        samples = []
        for r in range(iters):
            t0 = time.perf_counter()
            fn(batches[r % len(batches)], outs[r % len(batches)])
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples), samples
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch.cuda.graph expects
        for r in range(len(batches)):
            fn(batches[r], outs[r])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(reps):
            i = r % len(batches)
            fn(batches[i], outs[i])
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / reps)
    del g
    return statistics.median(samples), samples


def time_eager(fn, case, outs, iters):
    """bench/kernels.py's way: events around one eager call (host launch overhead included)."""
    import torch
    batches = case["batches"]
    if SMOKE:
        return time_graph(fn, case, outs, 1, iters)[0]
    for r in range(5):
        fn(batches[r % len(batches)], outs[r % len(batches)])
    torch.cuda.synchronize()
    samples = []
    for r in range(iters):
        i = r % len(batches)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(batches[i], outs[i])
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return statistics.median(samples)


def check(fn, case, ref):
    import torch
    b = case["batches"][0]
    out = torch.full_like(b[0], float("nan"))
    fn(b, out)
    sync()
    if not torch.isfinite(out).all():
        return float("nan"), False
    diff = (out.float() - ref.float()).abs()
    ok = bool((diff <= 2e-2 + 2e-2 * ref.float().abs()).all())
    return diff.max().item(), ok


def copy_bandwidth():
    """Copy bandwidth as `bench/roofline.py` measures it: 1 GiB, the best of 30 after a warm-up
    (H200, 2026-12-02: a 512 MiB copy measured 2% slower in the same call, 4,134 against 4,221
    GB/s, which flattered every share)."""
    from bench.roofline import copy_GBps
    return copy_GBps()
