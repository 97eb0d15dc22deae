"""One decode step as the GPU runs it in the CUDA graph: every kernel in order, its time and the
idle gap before it.

Starts the offline engine with CUDA graphs (Qwen3-0.6B shape, dummy bf16 weights), runs one
request (`--batch N`: N requests, each a `--prompt-len` prompt) to a steady decode, profiles
`--steps` steps with `torch.profiler` (CUPTI records the kernels inside graph replays), and
prints per step: kernels, GPU busy time, idle gaps, span and period (steps are cut before each
step's upload kernel, so the period is the time per token, the gap at the step boundary
included; `--copies` shows the memcpys there too); then per kernel name the count per step, mean
time and mean gap before it; and the kernel sequence of one step (`--show`).
bench/decode_kernels.py profiles the same step eagerly (launch by launch); this one shows what
the graph replay leaves between kernels, the part no single kernel owns.

  python bench/decode_timeline.py --steps 10 --out bench/results/decode_timeline.json
  python bench/decode_timeline.py --batch 256 --prompt-len 350   # a workload-A-sized step
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402
from bench.throughput import SAMPLING_KINDS, sampling_params  # noqa: E402


def short(name: str) -> str:
    """Kernel names without template arguments and launch suffixes."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return name[:60]


def split_steps(kernels, min_gap_us: float, first: str = ""):
    """Events (start, end, name) sorted by start, cut into steps: before every event named
    `first` (the kernel that opens each step) where the profile has one, else at idle gaps
    >= min_gap_us."""
    cut_at_first = bool(first) and any(name == first for _, _, name in kernels)
    steps, cur, last_end = [], [], None
    for k in kernels:
        if cur and (k[2] == first if cut_at_first else k[0] - last_end >= min_gap_us):
            steps.append(cur)
            cur = []
        cur.append(k)
        last_end = k[1] if last_end is None else max(last_end, k[1])
    if cur:
        steps.append(cur)
    if cut_at_first:  # the profile's first events belong to a step that began before it
        steps = [st for st in steps if st[0][2] == first]
    return steps


def step_rows(steps) -> list[dict]:
    """Per step: events, busy time (their durations summed; PDL overlap can make it exceed the
    span), span (first start to last end), idle (span - busy) and period (this step's first
    start to the next step's: the time per token, boundary included; None for the last)."""
    rows = []
    for i, s in enumerate(steps):
        busy = sum(e - b for b, e, _ in s)
        span = max(e for _, e, _ in s) - s[0][0]
        period = steps[i + 1][0][0] - s[0][0] if i + 1 < len(steps) else None
        rows.append({"kernels": len(s), "busy_us": busy, "span_us": span, "idle_us": span - busy,
                     "period_us": period})
    return rows


def median_known(values):
    """The median of the values that are not None (None if there are none)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1,
                    help="requests decoding together (each a prompt of --prompt-len tokens): the step at "
                         "a workload-A batch, e.g. --batch 256 --prompt-len 350")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-gap-us", type=float, default=15.0,
                    help="an idle gap at least this long separates two steps")
    ap.add_argument("--first-kernel", default="_mapped_read_kernel",
                    help="the kernel that opens every step (the step upload): steps are cut before it, "
                         "so a step's period includes the boundary; '' cuts at idle gaps instead")
    ap.add_argument("--copies", action="store_true",
                    help="keep memcpy / memset events in the timeline (the ids' device-to-host copy, the "
                         "copies into the graph's static buffers), named 'Memcpy DtoH' and so on")
    ap.add_argument("--sampling", default="greedy", choices=list(SAMPLING_KINDS),
                    help="the request's kind (bench/throughput.py's SAMPLING_KINDS): a greedy step replays "
                         "the greedy graph, the others the logits graph and then the sampler's kernels")
    ap.add_argument("--show", type=int, default=1, help="print the kernel sequence of this many steps")
    ap.add_argument("--out", default="bench/results/decode_timeline.json")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("bench/decode_timeline.py: no CUDA device; nothing to profile")
        return 0
    from infer_cluster.worker import LLM

    if args.batch < 1:
        ap.error("--batch must be positive")
    max_tokens = 64 + 4 * args.steps
    blocks = args.batch * -(-(args.prompt_len + max_tokens + 16) // 16) + 64
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=max(8, args.batch),
              num_kv_blocks=max(1024, blocks), max_model_len=4096)
    params = sampling_params(args.sampling, [max_tokens] * args.batch, seed=0)
    rids = [llm.add_request([10 + (i * 7 + t) % 30000 for t in range(args.prompt_len)], p)
            for i, p in enumerate(params)]
    sched = llm.engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        llm.step()  # every prompt prefilled
    for _ in range(32):
        llm.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, short(e.name)) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA
                     and (args.copies or ("Memcpy" not in e.name and "Memset" not in e.name)))
    for rid in rids:
        llm.abort(rid)
    llm.close()
    steps = [s for s in split_steps(kernels, args.step_gap_us, args.first_kernel)
             if len(s) > 50]  # decode steps only
    if not steps:
        print("no decode step found in the profile")
        return 1
    per_name = defaultdict(lambda: {"n": 0, "us": 0.0, "gap_us": 0.0})
    rows = step_rows(steps)
    typical = statistics.median(r["kernels"] for r in rows)
    if any(r["kernels"] > 1.5 * typical for r in rows):
        print(f"warning: a step holds more than 1.5x the median {typical:.0f} events: a step without "
              f"{args.first_kernel or 'a long idle gap'} merged into the one before it")
    for s in steps:
        prev_end = None
        for b, e, name in s:
            d = per_name[name]
            d["n"] += 1
            d["us"] += e - b
            d["gap_us"] += 0.0 if prev_end is None else max(0.0, b - prev_end)
            prev_end = e if prev_end is None else max(prev_end, e)
    n = len(steps)
    med = {k: median_known(r[k] for r in rows) for k in rows[0]}
    period = f", period {med['period_us']:.1f} us" if med["period_us"] is not None else ""
    print(f"{args.sampling}: {n} decode steps (median): {med['kernels']:.0f} kernels, span {med['span_us']:.1f} us{period}, "
          f"busy {med['busy_us']:.1f} us, idle between kernels {med['idle_us']:.1f} us "
          f"({med['idle_us'] / max(med['kernels'] - 1, 1):.2f} us per boundary)")
    table = sorted(per_name.items(), key=lambda kv: -kv[1]["us"])
    print(f"{'kernel':<60} {'per step':>8} {'mean us':>8} {'gap us':>7} {'us/step':>8}")
    for name, d in table:
        print(f"{name:<60} {d['n'] / n:>8.1f} {d['us'] / d['n']:>8.2f} {d['gap_us'] / d['n']:>7.2f} "
              f"{d['us'] / n:>8.1f}")
    sequences = []
    for s in steps[:args.show]:
        print("--- one step: start us, kernel us, gap before us, kernel")
        prev_end, seq = s[0][0], []
        for b, e, name in s:
            seq.append([round(b - s[0][0], 2), round(e - b, 2), round(b - prev_end, 2), name])
            print(f"{seq[-1][0]:9.1f} {seq[-1][1]:7.2f} {seq[-1][2]:6.2f}  {name}")
            prev_end = max(prev_end, e)
        sequences.append(seq)
    write_json(args.out, {"model": args.model, "sampling": args.sampling, "prompt_len": args.prompt_len,
                          "batch": args.batch, "steps": rows,
                          "median": med, "per_kernel": {k: v for k, v in table}, "sequences": sequences,
                          "copies": args.copies, "first_kernel": args.first_kernel,
                          "device": torch.cuda.get_device_name()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
