"""Host launch time against GPU time of one step, by step kind: a decode step (CUDA graph), a
short prefill beside decode rows, short prefills alone, a long prefill (mixed-step CUDA graphs
up to `--graph-max-tokens` tokens, eager above or with 0).
A step whose host launch takes longer than its GPU work leaves the GPU idle: this tells how
much a workload with many small mixed steps (the host-tier workload: one 10-token suffix per
request after its prefix loaded) pays for eager launches.

Runs `ModelRunner.execute(out)` directly on synthetic `SchedulerOutput`s (every sequence has
`--context` tokens in the KV pool; their KV values are whatever the pool holds), `--steps`
times after a warm-up: "launch" is the wall time of the call, "step" adds the device sync.

    python bench/mixed_step.py                       # GPU: Qwen3-0.6B shape, dummy weights, bf16
    python bench/mixed_step.py --model tiny-random --device cpu --dtype float32 --steps 5 --context 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402


def make_step(rows, context: int, block_size: int):
    """`rows`: query lengths, one per sequence; a row of length q computes positions
    context .. context + q - 1 and samples its last one."""
    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

    per_seq = -(-(context + max(rows)) // block_size)
    reqs = []
    for i, q in enumerate(rows):
        blocks = list(range(i * per_seq, (i + 1) * per_seq))
        reqs.append(ScheduledRequest(f"r{i}", [7 + (i + j) % 100 for j in range(q)], context, blocks, True))
    return SchedulerOutput(requests=reqs, num_batched_tokens=sum(rows))


KINDS = {
    "decode b4 (graph)": [1, 1, 1, 1],
    "prefill 10 + 3 decode rows": [10, 1, 1, 1],
    "prefill 4 x 10": [10, 10, 10, 10],
    "prefill 1 x 10": [10],
    "prefill 1 x 512": [512],
}


def _cprofile(runner, out, sync, steps: int) -> None:
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        runner.execute(out)
    sync()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def _kernels(runner, out, sync, steps: int, top: int = 10) -> None:
    """GPU time per step by kernel name (the heaviest `top`), from torch.profiler."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.execute(out)
        sync()
    by_name = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time_total
            by_name[e.name][1] += 1
    rows = sorted(((k, v[0] / steps, v[1] / steps) for k, v in by_name.items()), key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"    GPU kernels: {total:8.1f} us per step")
    for name, us, calls in rows[:top]:
        print(f"    {us:8.1f} us  {calls:5.1f}x  {name[:90]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=4000)
    ap.add_argument("--graph-max-tokens", type=int, default=512, help="0: small steps that are not decode-only run eagerly")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cprofile", default=None, metavar="KIND",
                    help="also profile the host side of this kind's steps (cProfile; top functions by own time)")
    ap.add_argument("--prefill-splits", type=int, default=None,
                    help="override kernels/attention_prefill_triton.PREFILL_SPLITS (split KV for short queries)")
    ap.add_argument("--kernels", action="store_true",
                    help="also profile each kind (torch.profiler) and print its GPU kernels per step")
    ap.add_argument("--out", default="bench/results/mixed_step.json")
    args = ap.parse_args(argv)
    import torch

    if args.prefill_splits:
        from infer_cluster.kernels import attention_prefill_triton
        attention_prefill_triton.PREFILL_SPLITS = args.prefill_splits

    from infer_cluster.worker import LLM

    block_size = 16
    need = 4 * -(-(args.context + 512) // block_size) + 1
    rows = []
    with LLM(args.model, load_format="dummy", device=args.device, dtype=args.dtype, block_size=block_size,
             num_kv_blocks=need, max_num_seqs=8, max_model_len=args.context + 1024,
             max_num_batched_tokens=1024, graph_max_tokens=args.graph_max_tokens) as llm:
        runner = llm.engine.runner
        cuda = runner.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        for name, q in KINDS.items():
            out = make_step(q, args.context, block_size)
            for _ in range(args.warmup):
                runner.execute(out)
            sync()
            launch, step = [], []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                runner.execute(out)
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                launch.append(t1 - t0)
                step.append(t2 - t0)
            row = dict(kind=name, rows=q, launch_ms=statistics.median(launch) * 1e3,
                       step_ms=statistics.median(step) * 1e3)
            rows.append(row)
            if args.cprofile == name:
                _cprofile(runner, out, sync, args.steps)
            print(f"{name:>28}: launch {row['launch_ms']:7.2f} ms   launch + sync {row['step_ms']:7.2f} ms", flush=True)
            if args.kernels:
                _kernels(runner, out, sync, args.steps)
    write_json(args.out, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
