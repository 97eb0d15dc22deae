"""The sampler alone on a workload-A-sized batch: milliseconds per call for each request kind
(and how much of it is `draw`'s launch phase, before the one sync),
and (with `--profile`) torch.profiler's top operators, to see what a kind adds to a step.

Rows carry prompts and outputs of a few hundred tokens, as in workload A mid-run; logits are
random normal, bf16 as the model returns them. Writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402

KINDS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=50, seed=7),
    "penalties": dict(temperature=0.7, repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.2),
    "logprobs": dict(temperature=0.0, logprobs=5),
    "top_p_only": dict(temperature=0.8, top_p=0.9, seed=7),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cprofile", action="store_true",
                    help="also run each kind's calls under cProfile and print the top functions by own time "
                         "(where the host time of a call goes: Python, torch dispatch, kernel launches)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated request kinds to run (default: all of {', '.join(KINDS)})")
    ap.add_argument("--out", default="bench/results/sampler_profile.json")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"unknown kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")

    import torch

    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker.sampling.sampler import Sampler
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    results, host_results = {}, {}
    for kind in kinds:
        kw = KINDS[kind]
        sampler = Sampler(torch.Generator().manual_seed(0))
        params = SamplingParams(max_tokens=2048, **kw)
        rows = [SamplingRequestState(params, [int(t) for t in torch.randint(10, args.vocab, (400,), generator=g)],
                                     [int(t) for t in torch.randint(10, args.vocab, (300,), generator=g)],
                                     None, (2,), f"r{i}") for i in range(args.rows)]
        logits = [torch.randn(args.rows, args.vocab, generator=g).to(dev, torch.bfloat16) for _ in range(4)]

        host = [0.0]

        def call(i):
            x = logits[i % 4].clone()
            t0 = time.perf_counter()
            draw = sampler.draw(x, rows, logits_writable=True)  # the launch phase: no sync
            host[0] += time.perf_counter() - t0
            values = draw.values.flatten().tolist() if draw.values is not None else None
            out = sampler.finish(draw, draw.transfer.tolist(), values)
            for r, t in zip(rows, out.token_ids):
                r.output_token_ids.append(t)
        for i in range(5):
            call(i)
        if dev == "cuda":
            torch.cuda.synchronize()
        host[0] = 0.0
        t = time.perf_counter()
        for i in range(args.iters):
            call(i)
        if dev == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / args.iters * 1e3
        host_ms = host[0] / args.iters * 1e3
        results[kind] = ms
        host_results[kind] = host_ms
        print(f"{kind:<12} {ms:8.3f} ms per call, {host_ms:7.3f} ms of it in `draw` before the sync "
              f"({args.rows} rows x {args.vocab})", flush=True)
        if args.cprofile and kind != "greedy":
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for i in range(args.iters):
                call(i)
            prof.disable()
            print(f"--- {kind}: cProfile of {args.iters} calls, top by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        if args.profile and kind != "greedy":
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
            with profile(activities=acts) as prof:
                for i in range(5):
                    call(i)
                if dev == "cuda":
                    torch.cuda.synchronize()
            key = "self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=40))
    write_json(args.out, {"rows": args.rows, "vocab": args.vocab, "ms_per_call": results,
                          "draw_host_ms_per_call": host_results,
                          "sampler_kernels": os.environ.get("INFER_CLUSTER_SAMPLER_KERNELS", "1")})


if __name__ == "__main__":
    main()
