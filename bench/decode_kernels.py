"""Which kernels one batch-1 decode step launches, and what each costs on the GPU.

Runs the engine eagerly (no CUDA graph, so the profiler sees every launch) on one request of
the Qwen3-0.6B shape and profiles `--steps` decode steps: prints kernels per step and the
operator table by GPU time. The CUDA graph replays the same kernels, so this is the list to
fuse or speed up when batch-1 TPOT sits above its bandwidth bound (bench/step_profile.py).
The first line names the kernel switches in force (`INFER_CLUSTER_GEMV`, `INFER_CLUSTER_NORM_FUSE`):
run it once per setting to see what a fusion removes from the step.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_num_seqs=8, num_kv_blocks=256,
              max_model_len=2048, enforce_eager=True, warmup=False)
    rid = llm.add_request(list(range(10, 138)), SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    for _ in range(8):
        llm.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            llm.step()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    switches = " ".join(f"{k}={os.environ.get(k, '1')}" for k in ("INFER_CLUSTER_GEMV", "INFER_CLUSTER_NORM_FUSE"))
    print(f"[{switches}] {len(events) / args.steps:.0f} GPU kernels per decode step; "
          f"{sum(e.device_time_total for e in events) / args.steps / 1e3:.3f} ms of GPU time per step")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
    llm.abort(rid)
    llm.close()


if __name__ == "__main__":
    main()
