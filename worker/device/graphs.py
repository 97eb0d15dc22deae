"""CUDA graphs' life: `capture_mid_serving` (capture while the engine serves) and
`release_graphs` (drop graphs once the device is done with them).

Used by the decode and mixed-step graphs (worker/runner/), the sampler's draw graphs
(worker/sampling/draw_graphs.py) and the grammar's masked argmax
(worker/structured/mask_graphs.py).
"""

from __future__ import annotations

import torch


def capture_mid_serving(body, device: torch.device, pool=None) -> tuple:
    """(graph, what `body()` returned) with `body`'s device work captured, not run. Captured on a
    side stream after the current one's queued work, without `torch.cuda.graph`'s device sync
    and `empty_cache`: this runs mid-serving, where emptying the allocator's cache made the next
    steps allocate afresh. `pool`: a graph memory pool to share (`graph.pool()` of another)."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            result = body()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # the capture was invalidated by that error: report the error
                pass
            raise
        graph.capture_end()
    current.wait_stream(side)
    return graph, result


def release_graphs(graphs: dict, *stores, device=None) -> None:
    """Clear `graphs` (captured graphs) and `stores` (what they read or write) after the device
    finished its queued work, which waits only if there are graphs; they are cleared even if
    that wait fails (a device error after a peer died). `device`: the one to wait for (default:
    the current one)."""
    try:
        if graphs:
            torch.cuda.synchronize(device)
    finally:
        graphs.clear()
        for store in stores:
            store.clear()
