"""Host side of a steady decode step's inputs: what `DynamicContext.prepare` launches on the
device and how long it takes on the host, for async scheduling's steady steps (every row's
input id is the previous step's pending draw, rows in the same order), the same for
`GraphInputs.stage` (worker/runner/graph_inputs.py: what a single-rank CUDA decode step runs
instead of `prepare` and the graph's copies; on CUDA it also launches one Triton read and
records one event, which the op count leaves out), and how long `Sampler.classify` (which rows
need which sampler feature) takes for greedy and for sampled rows.

Counts the tensor operations `prepare` dispatches (views and slices left out: they launch
nothing) with a `TorchDispatchMode`, and times `prepare` (median of `--repeats` rounds of
`--calls` calls) per batch size. On `--device cuda` each counted op is a kernel launch between
two graph replays (docs/kernels.md, "What the step spends outside the layers"); on the CPU the
time is the host's share only. To compare trees, run it from each checkout, alternating, on one machine.

    python bench/prepare_cost.py --batch 1 64 256 --out bench/results/prepare_cost.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402
from bench.step_overhead import decode_step  # noqa: E402

_NO_LAUNCH = {"split", "split_with_sizes", "slice", "view", "alias", "as_strided", "_reshape_alias",
              "detach", "lift_fresh", "select", "unsqueeze", "squeeze", "t", "expand"}


def steady_step(batch: int, context: int, block_size: int):
    """A decode step of `batch` rows, each continuing the previous draw's row of its index."""
    out = decode_step(batch, context, block_size)
    for r in out.requests:
        r.pending_input = True
    return out


def timed_us(fn, calls: int, repeats: int, sync=None) -> float:
    """Median over `repeats` rounds of the mean microseconds of one of `calls` calls."""
    rounds = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync is not None:
            sync()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def classify_us(batch: int, kind: str, calls: int, repeats: int) -> float:
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker.sampling.sampler import Sampler
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState

    params = SamplingParams(temperature=0) if kind == "greedy" else SamplingParams(temperature=0.8, top_p=0.9)
    rows = [SamplingRequestState(params, [1, 2], [3], None, (2,), request_id=f"r{i}") for i in range(batch)]
    sampler = Sampler()
    return timed_us(lambda: sampler.classify(rows, 151936), calls, repeats)


def launched_ops(fn) -> list[str]:
    """Names of the tensor ops `fn()` dispatches that are not views."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in _NO_LAUNCH:
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        fn()
    return rec.ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--context", type=int, default=512, help="tokens per sequence before the step")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=200, help="prepare calls per timed round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results/prepare_cost.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.worker.kv.block_table import BlockTableMirror
    from infer_cluster.worker.runner.context import DynamicContext
    from infer_cluster.worker.runner.graph_inputs import GraphInputs

    device = torch.device(args.device)
    blocks = -(-(args.context + 1) // args.block_size)
    ctx = DynamicContext(num_layers=1, num_blocks=max(args.batch) * blocks + 1, block_size=args.block_size,
                         num_kv_heads=1, head_dim=8, dtype=torch.float16, device=device)
    rows = []
    staged = GraphInputs(max(args.batch), blocks, device)
    staged.open_host()
    for batch in args.batch:
        out = steady_step(batch, args.context, args.block_size)
        draw = torch.arange(batch, dtype=torch.int64, device=device)
        prev_rows = list(range(batch))
        call = lambda: ctx.prepare(out, draw, prev_rows)  # noqa: E731
        call()  # warm-up (the block-table mirror fills)
        ops = launched_ops(call)
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
        mirror = BlockTableMirror()
        stage = lambda: staged.stage(out, mirror, args.block_size, batch, draw, prev_rows)  # noqa: E731
        stage()
        stage_ops = launched_ops(stage)
        row = dict(batch=batch, ops=len(ops), op_names=sorted(set(ops)),
                   prepare_us=timed_us(call, args.calls, args.repeats, sync),
                   graph_inputs_ops=len(stage_ops), graph_inputs_op_names=sorted(set(stage_ops)),
                   graph_inputs_us=timed_us(stage, args.calls, args.repeats, sync),
                   classify_greedy_us=classify_us(batch, "greedy", args.calls, args.repeats),
                   classify_sampled_us=classify_us(batch, "sampled", args.calls, args.repeats))
        rows.append(row)
        print(f"batch {batch:4d}: {row['ops']} ops {row['op_names']}; prepare {row['prepare_us']:.1f} us; "
              f"graph inputs {row['graph_inputs_ops']} ops {row['graph_inputs_op_names']}, "
              f"{row['graph_inputs_us']:.1f} us; "
              f"classify greedy {row['classify_greedy_us']:.1f} us, sampled {row['classify_sampled_us']:.1f} us")
    write_json(args.out, dict(device=str(device), context=args.context, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
