"""Per-step cost of a tensor-parallel replica: how much longer one decode step takes at T=2 than
at T=1 on the same model (CPU with gloo by default; `--device cuda` on 2 GPUs). On the CPU the
tiny model's compute is small, so the difference is mostly communication: the step's delivery
and the model's own collectives.

Runs `runner.execute(out)` directly on a synthetic decode `SchedulerOutput` (B sequences of
`--context` tokens each, every row sampled), `--steps` times after a warm-up, at T=1 and T=2,
and reports the median step time of each and their difference. Every rank gets one torch
thread. Writes JSON.

    python bench/step_overhead.py --batch 1 32 128 --out bench/results/step_overhead.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402


def decode_step(batch: int, context: int, block_size: int):
    from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

    blocks_per_seq = -(-(context + 1) // block_size)
    reqs = []
    for i in range(batch):
        blocks = list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
        reqs.append(ScheduledRequest(f"r{i}", [7 + i % 100], context, blocks, True))
    return SchedulerOutput(requests=reqs, num_batched_tokens=batch)


def time_steps(runner, out, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        runner.execute(out)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        runner.execute(out)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--context", type=int, default=256, help="tokens already in each sequence")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default="bench/results/step_overhead.json")
    args = ap.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = str(max(args.tp))  # each rank takes OMP_NUM_THREADS / world
    import torch

    from infer_cluster.worker import LLM

    torch.set_num_threads(1)
    block_size = 16
    need = max(args.batch) * -(-(args.context + 1) // block_size) + 1
    results = {"model": args.model, "device": args.device, "context": args.context, "steps": args.steps,
               "rows": []}
    for tp in args.tp:
        with LLM(args.model, device=args.device, dtype=args.dtype, tensor_parallel_size=tp,
                 block_size=block_size, num_kv_blocks=need, max_num_seqs=max(args.batch),
                 max_num_batched_tokens=max(256, max(args.batch))) as llm:
            runner = llm.engine.runner
            for batch in args.batch:
                times = time_steps(runner, decode_step(batch, args.context, block_size),
                                   args.steps, args.warmup)
                row = dict(tp=tp, batch=batch, median_us=statistics.median(times) * 1e6,
                           p10_us=sorted(times)[len(times) // 10] * 1e6)
                results["rows"].append(row)
                print(f"T={tp} batch={batch:4d}: median {row['median_us']:8.1f} us/step "
                      f"(p10 {row['p10_us']:.1f})", flush=True)
    by = {(r["tp"], r["batch"]): r["median_us"] for r in results["rows"]}
    for batch in args.batch:
        if (1, batch) in by and (2, batch) in by:
            extra = by[(2, batch)] - by[(1, batch)]
            results.setdefault("t2_minus_t1_us", {})[batch] = extra
            print(f"batch={batch:4d}: T=2 costs {extra:+.1f} us/step over T=1")
    write_json(args.out, results)


if __name__ == "__main__":
    main()
