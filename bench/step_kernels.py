"""Where a workload-A decode step spends its GPU time, by kernel family.

Starts workload A (256 requests, prompt and output lengths uniform in [100, 1024], greedy,
ignore_eos) in the offline engine with CUDA graphs, steps until every prompt has been prefilled,
then profiles `--steps` decode steps and prints GPU time per step by kernel family (attention,
GEMM, norm, ...) with each family's share. Run it with `--kv-cache-dtype auto` and `int8` to see
how much of a step the KV bytes can win back (issue 14's int8 target).

  python bench/step_kernels.py --kv-cache-dtype int8

`--phase prefill` profiles the steps that prefill the prompts instead (workload A's mixed steps:
GEMMs at the bf16 peak, the prefill attention kernel, `qkv_prep` over ~8k tokens).

`--leave-out norm|prep|gemm` builds the engine with that kernel launching nothing (the RMSNorms,
`qkv_prep`, the Gluon mid-size GEMMs): the steps' results are then wrong and their unprofiled
span is what to read. The span's drop against a run without it is what the kernel costs in the
step's chain, the most that fusing it away could win (bench/tpot_ablation.py does the same for
batch-1 TPOT).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAMILIES = (("attention", ("attn", "attention", "decode", "prefill")),
            ("gemm", ("gemm", "gemv", "sm90", "cutlass", "cublas", "nvjet", "linear")),
            ("norm", ("norm",)), ("rotary/append", ("rotary", "rope", "append", "qkv_prep")),
            ("activation", ("silu", "act")), ("sampling", ("argmax", "reduce", "topk", "sort")))


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


LEAVE_OUT = {"norm": ("norm_triton", "_rms_norm_kernel"), "prep": ("qkv_prep_triton", "_qkv_prep_kernel"),
             "gemm": ("gemm_gluon", "_gemm_kernel")}


def leave_out(name: str) -> None:
    """Replace kernel family `name` (LEAVE_OUT) by `tpot_ablation.NoLaunch`, before the engine is
    built."""
    import importlib

    from bench.tpot_ablation import NoLaunch
    module, attr = LEAVE_OUT[name]
    setattr(importlib.import_module(f"infer_cluster.kernels.{module}"), attr, NoLaunch())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--top", type=int, default=8, help="kernels listed by name")
    ap.add_argument("--phase", choices=["decode", "prefill"], default="decode",
                    help="prefill: profile the steps that prefill the 256 prompts (mixed steps) "
                         "instead of decode steps after them")
    ap.add_argument("--leave-out", choices=sorted(LEAVE_OUT), default=None,
                    help="that kernel launches nothing: read the span (module docstring)")
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.workload import random_workload
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    if args.leave_out:
        leave_out(args.leave_out)
        print(f"left out: {args.leave_out} ({'.'.join(LEAVE_OUT[args.leave_out])} launches nothing; "
              f"the outputs are wrong, the span is what to read)")
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_model_len=args.max_model_len,
              kv_cache_dtype=args.kv_cache_dtype)
    prompts, outputs = random_workload(args.num_seqs, (100, 1024), (100, 1024), llm.engine.spec.vocab_size)
    for p, n in zip(prompts, outputs):
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sched = llm.engine.scheduler

    def prefill_all() -> int:
        n = 0
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or sched.waiting:
            llm.step()
            n += 1
        return n

    if args.phase == "prefill":
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            steps = prefill_all()
            sync()
        report(prof, steps, f"kv_cache_dtype={args.kv_cache_dtype}: the {steps} steps that prefill "
                            f"{args.num_seqs} prompts", args.top)
        llm.close()
        return 0
    steps = prefill_all()
    for _ in range(3):
        llm.step()
    sync()
    batch = len(sched.running)
    ctx = sum(r.num_tokens for r in sched.running) / max(1, batch)
    # The step's span without the profiler: with PDL a kernel starts before the one ahead of it
    # ends, so the kernels' summed durations below overstate the step.
    span_ms = 0.0
    if torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            llm.step()
        end.record()
        sync()
        span_ms = start.elapsed_time(end) / args.steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        sync()
    report(prof, args.steps, f"kv_cache_dtype={args.kv_cache_dtype}: {steps} steps to prefill everything; "
                             f"then {args.steps} decode steps at batch {batch}, mean context {ctx:.0f} tokens "
                             f"(a step's span unprofiled, the {args.steps} steps before: {span_ms:.2f} ms)",
           args.top)
    llm.close()
    return 0


def report(prof, steps: int, title: str, top: int) -> None:
    """GPU time a step by kernel family, then the `top` kernels by name."""
    import torch

    per_fam: dict[str, float] = defaultdict(float)
    per_name: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_fam[family(e.name)] += e.device_time_total / 1e3 / steps
            per_name[e.name] += e.device_time_total / 1e3 / steps
            launches[e.name] += 1
    total = sum(per_fam.values())
    print(f"{title}: {total:.2f} ms of kernels a step")
    for fam, ms in sorted(per_fam.items(), key=lambda kv: -kv[1]):
        print(f"  {fam:<14} {ms:7.3f} ms  {100 * ms / total:5.1f}%")
    print(f"  top kernels ({sum(launches.values()) / steps:.0f} launches a step; ms a step, "
          f"launches a step, us each):")
    for name, ms in sorted(per_name.items(), key=lambda kv: -kv[1])[:top]:
        n = launches[name] / steps
        print(f"    {ms:7.3f} ms {n:6.1f} x {1e3 * ms / n:6.2f} us  {name[:100]}")


if __name__ == "__main__":
    sys.exit(main())
