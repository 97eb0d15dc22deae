"""One batch-1 decode step as the GPU runs it in the CUDA graph: every kernel in order, its time
and the idle gap before it.

Starts the offline engine with CUDA graphs (Qwen3-0.6B shape, dummy bf16 weights), runs one
request to a steady decode, profiles `--steps` steps with `torch.profiler` (CUPTI records the
kernels inside graph replays), and prints per step: kernels, GPU busy time, idle gaps, span; then
per kernel name the count per step, mean time and mean gap before it; and the kernel sequence of
one step (`--show`). bench/decode_kernels.py profiles the same step eagerly (launch by launch);
this one shows what the graph replay leaves between kernels, the part no single kernel owns.

  python bench/decode_timeline.py --steps 10 --out bench/results/decode_timeline.json
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


def short(name: str) -> str:
    """Kernel names without template arguments and launch suffixes."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"\(.*", "", name)
    return name[:60]


def split_steps(kernels, min_gap_us: float):
    """Kernels (start, end, name) sorted by start, cut into steps at idle gaps >= min_gap_us."""
    steps, cur, last_end = [], [], None
    for k in kernels:
        if cur and k[0] - last_end >= min_gap_us:
            steps.append(cur)
            cur = []
        cur.append(k)
        last_end = k[1] if last_end is None else max(last_end, k[1])
    if cur:
        steps.append(cur)
    return steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-gap-us", type=float, default=15.0,
                    help="an idle gap at least this long separates two steps")
    ap.add_argument("--show", type=int, default=1, help="print the kernel sequence of this many steps")
    ap.add_argument("--out", default="bench/results/decode_timeline.json")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("bench/decode_timeline.py: no CUDA device; nothing to profile")
        return 0
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=8, num_kv_blocks=1024,
              max_model_len=4096)
    rid = llm.add_request(list(range(10, 10 + args.prompt_len)),
                          SamplingParams(temperature=0, max_tokens=64 + 4 * args.steps, ignore_eos=True))
    for _ in range(32):
        llm.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, short(e.name)) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name
                     and "Memset" not in e.name)
    llm.abort(rid)
    llm.close()
    steps = [s for s in split_steps(kernels, args.step_gap_us) if len(s) > 50]  # decode steps only
    if not steps:
        print("no decode step found in the profile")
        return 1
    per_name = defaultdict(lambda: {"n": 0, "us": 0.0, "gap_us": 0.0})
    rows = []
    for s in steps:
        busy = sum(e - b for b, e, _ in s)
        span = s[-1][1] - s[0][0]
        rows.append({"kernels": len(s), "busy_us": busy, "span_us": span, "idle_us": span - busy})
        prev_end = None
        for b, e, name in s:
            d = per_name[name]
            d["n"] += 1
            d["us"] += e - b
            d["gap_us"] += 0.0 if prev_end is None else max(0.0, b - prev_end)
            prev_end = e if prev_end is None else max(prev_end, e)
    n = len(steps)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{n} decode steps (median): {med['kernels']:.0f} kernels, span {med['span_us']:.1f} us, "
          f"busy {med['busy_us']:.1f} us, idle between kernels {med['idle_us']:.1f} us "
          f"({med['idle_us'] / max(med['kernels'] - 1, 1):.2f} us per boundary)")
    table = sorted(per_name.items(), key=lambda kv: -kv[1]["us"])
    print(f"{'kernel':<60} {'per step':>8} {'mean us':>8} {'gap us':>7} {'us/step':>8}")
    for name, d in table:
        print(f"{name:<60} {d['n'] / n:>8.1f} {d['us'] / d['n']:>8.2f} {d['gap_us'] / d['n']:>7.2f} "
              f"{d['us'] / n:>8.1f}")
    for s in steps[:args.show]:
        print("--- one step: start us, kernel us, gap before us, kernel")
        prev_end = s[0][0]
        for b, e, name in s:
            print(f"{b - s[0][0]:9.1f} {e - b:7.2f} {b - prev_end:6.2f}  {name}")
            prev_end = max(prev_end, e)
    write_json(args.out, {"model": args.model, "prompt_len": args.prompt_len, "steps": rows,
                          "median": med, "per_kernel": {k: v for k, v in table},
                          "device": torch.cuda.get_device_name()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
