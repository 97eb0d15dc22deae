"""Timing of GPU work inside one CUDA graph, for the benchmark scripts.

Owns: `best_replay_s(step, calls, replays)`: `step(i)` once outside the capture (compiles and
picks kernels), then a graph of `step(0..calls-1)`, warmed by one replay; returns the best
replay's seconds divided by `calls`. Best, not median: the figure a kernel can reach, as the
GEMV table (bench/gemv.py) and the fused MLP chain (bench/fused_mlp.py) compare them. To extend (a median, per-call samples):
add an argument here rather than another copy in a bench script.
"""

from __future__ import annotations

from typing import Callable


def best_replay_s(step: Callable[[int], None], calls: int, replays: int) -> float:
    import torch
    step(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            step(i)
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del graph
    return best / calls
