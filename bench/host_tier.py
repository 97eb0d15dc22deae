"""Host KV tier on a shared-prefix workload whose prefixes do not all fit the device pool
(issue 14): the same requests with `kv_offload_gib` off and on, in one process.

Workload: `--num-requests` requests over `--num-prefixes` distinct prefixes of `--prefix-len`
tokens, interleaved (request i uses prefix i mod P, so a prefix comes back after every other
prefix ran), each with its own short suffix and a short greedy output. The device pool is capped
(`num_kv_blocks`) so that only `--fit-prefixes` requests' worth of blocks fit: without the tier
every prefix is evicted before it comes back and is recomputed; with it, evicted prefixes are
copied to host memory and copied back. The host tier is sized to hold every prefix (plus the
requests' own full blocks) unless `--kv-offload-gib` says otherwise.
Prints wall time, requests/s, prompt+output tokens/s, tokens computed and host hits per run, the
speed-up (target >= 2x on the GPU), and checks that both runs gave the same tokens.

  python bench/host_tier.py                 # GPU: Qwen3-0.6B shape, dummy weights, bf16
  python bench/host_tier.py --cpu-small     # CPU: tiny-random, small scale (checks + a ratio)
  python bench/host_tier.py --copy-modes kernel,runs   # one tier-on run per copy path
  python bench/host_tier.py --scheduler-only --device cpu   # host-side bookkeeping alone, full scale
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_timeline import ProfileWindow  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--load-format", default="dummy", choices=["auto", "dummy"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--num-prefixes", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=4000)
    ap.add_argument("--suffix-len", type=int, default=10)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--fit-prefixes", type=int, default=4, help="requests' worth of blocks in the device pool")
    ap.add_argument("--kv-offload-gib", type=float, default=None, help="default: every prefix fits")
    ap.add_argument("--copy-modes", default=None,
                    help="tier-on runs, one per host<->device copy path (kernel, runs, gather; default: the engine's, see worker/kv/copy.py)")
    ap.add_argument("--prefill-splits", type=int, default=None,
                    help="override kernels/attention_prefill_triton.PREFILL_SPLITS (split KV for short queries)")
    ap.add_argument("--warmup-requests", type=int, default=24,
                    help="untimed runs first, tier off and on, with this many requests (Triton compiles "
                         "kernels per process on first use; without it the first timed run pays them)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--cpu-small", action="store_true",
                    help="tiny-random on CPU: 64 requests over 16 prefixes of 256 tokens")
    ap.add_argument("--scheduler-only", action="store_true",
                    help="no model: time the scheduler + host-tier bookkeeping alone (host seconds per step)")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="profile each run (torch.profiler), write its Chrome trace to DIR and print "
                         "its GPU timeline (bench/gpu_timeline.py); use a smaller --num-requests")
    ap.add_argument("--trace-on-only", action="store_true", help="with --trace: profile the tier-on runs only")
    ap.add_argument("--time-copies", action="store_true",
                    help="time (host wall) each part of the host-tier copy path and print the totals")
    ap.add_argument("--timeline", action="store_true",
                    help="record the scheduler's host-side timeline per run (bench/sched_timeline.py): "
                         "per-request load / wait / compute phases, rows per step, loads in flight")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="cProfile the tier-on run's host side and print its N costliest functions")
    ap.add_argument("--out", default="bench/results/host_tier.json")
    args = ap.parse_args(argv)
    if args.cpu_small:
        args.model, args.load_format, args.dtype, args.device = "tiny-random", "auto", "auto", "cpu"
        args.num_requests, args.prefix_len, args.max_model_len = 64, 256, 512
        args.max_num_batched_tokens = 2048
    return args


def make_prompts(args, vocab: int) -> list[list[int]]:
    prefixes = [[2 + (p * 7919 + t * 31) % (vocab - 2) for t in range(args.prefix_len)]
                for p in range(args.num_prefixes)]
    return [prefixes[i % args.num_prefixes] + [2 + (i * 131 + t) % (vocab - 2) for t in range(args.suffix_len)]
            for i in range(args.num_requests)]


def run(args, kv_offload_gib: float, num_kv_blocks: int, copy_mode: str = "kernel"):
    import torch

    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, device=args.device,
              kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size, num_kv_blocks=num_kv_blocks,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              kv_offload_gib=kv_offload_gib)
    try:
        pool = getattr(llm.engine.runner, "host_pool", None)
        if pool is not None:
            pool.set_copy_mode(copy_mode)
        prompts = make_prompts(args, llm.engine.spec.vocab_size)
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
        before = llm.stats()
        sync = torch.cuda.synchronize if llm.engine.runner.device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        cprof = None
        if getattr(args, "cprofile", 0) and kv_offload_gib:
            import cProfile
            cprof = cProfile.Profile()
            cprof.enable()
        trace = args.trace if (kv_offload_gib or not getattr(args, "trace_on_only", False)) else None
        with ProfileWindow(trace, f"tier_{'on' if kv_offload_gib else 'off'}_{copy_mode}"), \
                _CopyTimers(args.time_copies) as timers, _maybe_timeline(args.timeline, llm) as tl:
            outs = llm.generate(prompts, params, use_tqdm=False)
            sync()
        if cprof is not None:
            import pstats
            cprof.disable()
            pstats.Stats(cprof).sort_stats("tottime").print_stats(args.cprofile)
        if tl is not None:
            print(f"timeline, tier {'on' if kv_offload_gib else 'off'}: {tl.summary()} {tl.gpu_summary()}")
        if timers.totals:
            print("host time in the copy path: " + ", ".join(
                f"{k} {v[0]:.3f} s/{v[1]}" for k, v in sorted(timers.totals.items())))
        seconds = time.perf_counter() - t
        s = llm.stats()
        tokens = sum(len(p) for p in prompts) + sum(len(o.token_ids) for o in outs)
        info = {"kv_offload_gib": kv_offload_gib, "seconds": seconds,
                "requests_per_s": len(prompts) / seconds, "tokens_per_s": tokens / seconds,
                "num_scheduled_tokens": s["num_scheduled_tokens"] - before["num_scheduled_tokens"],
                "cached_tokens_device": sum(o.num_cached_tokens for o in outs),
                "cached_tokens_host": sum(o.num_cached_tokens_host for o in outs),
                "num_preemptions": s["num_preemptions"] - before["num_preemptions"],
                "num_kv_blocks": s["num_total_blocks"], "num_host_blocks": s["num_host_blocks"],
                "host_stored_blocks": s["host_stored_blocks"], "host_hit_blocks": s["host_hit_blocks"],
                "swap_seconds": s["step_seconds"].get("swap", 0.0),
                "load_waits": llm.engine.scheduler.num_load_waits,
                "step_seconds": s["step_seconds"], "copy_mode": pool.copy_mode if pool is not None else None,
                "device": str(llm.engine.runner.device)}
        return info, [o.token_ids for o in outs]
    finally:
        llm.close()
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _maybe_timeline:
    """`SchedTimeline` over the engine's scheduler when `on`, else None."""

    def __init__(self, on: bool, llm):
        self.tl = None
        if on:
            from bench.sched_timeline import SchedTimeline
            self.tl = SchedTimeline(llm.engine.scheduler, llm.engine)

    def __enter__(self):
        return self.tl.__enter__() if self.tl is not None else None

    def __exit__(self, *exc):
        return self.tl.__exit__(*exc) if self.tl is not None else False


class _CopyTimers:
    """With `on`, wrap the host-tier copy path's functions (HostKVPool.swap, the staged copier's
    chunk copies, kv_swap launches, block-id uploads) with wall-clock timers for the block;
    `totals[name] = [seconds, calls]`. Restores them on exit."""

    def __init__(self, on: bool):
        self.on, self.totals, self._saved = on, {}, []

    def __enter__(self):
        if not self.on:
            return self
        from infer_cluster.worker.kv import copy as kv_copy; from infer_cluster.worker.kv import copy_dma as kv_copy_dma
        targets = [(kv_copy.HostKVPool, "swap"), (kv_copy.HostKVPool, "wait_loads"),
                   (kv_copy_dma.StagedCopier, "_in"), (kv_copy_dma.StagedCopier, "_out"),
                   (kv_copy_dma, "kv_swap"), (kv_copy_dma, "block_ids_on"), (kv_copy, "block_ids_on")]
        for owner, name in targets:
            fn = getattr(owner, name)
            self._saved.append((owner, name, fn))
            setattr(owner, name, self._wrap(f"{getattr(owner, '__name__', owner)}.{name}", fn))
        return self

    def _wrap(self, label, fn):
        totals = self.totals

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                entry = totals.setdefault(label, [0.0, 0])
                entry[0] += time.perf_counter() - t
                entry[1] += 1
        return timed

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        return False


def scheduler_only(args, num_kv_blocks: int, num_host_blocks: int) -> dict:
    """The host-side work of the workload without a model: schedule + update with a fixed
    sampled token, tier off and on. Returns seconds, steps and copies per run."""
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker.sched.block_allocator import BlockAllocator
    from infer_cluster.worker.sched.host_tier import HostTier
    from infer_cluster.worker.sched.request import Request
    from infer_cluster.worker.sched.scheduler import Scheduler
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    out = {}
    for name, host in (("off", 0), ("on", num_host_blocks)):
        sched = Scheduler(BlockAllocator(num_kv_blocks, args.block_size), 256, args.max_num_batched_tokens,
                          args.max_model_len, HostTier(host) if host else None)
        for i, prompt in enumerate(make_prompts(args, 151936)):
            sched.add(Request(str(i), prompt, params, i))
        steps = swaps = 0
        t = time.perf_counter()
        while sched.has_unfinished():
            step = sched.schedule()
            steps += 1
            swaps += len(step.swap_in) + len(step.swap_out)
            sched.update(step, {r.request_id: 5 for r in step.requests if r.needs_sample})
        seconds = time.perf_counter() - t
        out[name] = {"seconds": seconds, "steps": steps, "block_copies": swaps}
        print(f"scheduler only, tier {name:>3}: {seconds:.3f} s for {steps} steps "
              f"({1e3 * seconds / steps:.3f} ms/step), {swaps} block copies listed")
    return out


def bytes_per_block(args) -> int:
    """Bytes of one KV block of this model (all layers), as the runner sizes it."""
    import torch

    from infer_cluster.worker.runner.context import DynamicContext
    from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path
    from infer_cluster.worker.models.decoder import ModelSpec
    spec = ModelSpec.from_hf_config(load_hf_config(resolve_model_path(args.model)))
    dev_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(
        args.dtype, torch.bfloat16 if dev_cuda else torch.float32)
    if args.kv_cache_dtype == "int8":
        dtype = torch.int8
    return DynamicContext.bytes_per_block(spec.num_layers, args.block_size, spec.num_kv_heads,
                                          spec.head_dim, dtype)


def main(argv=None):
    args = parse_args(argv)
    if args.prefill_splits:
        from infer_cluster.kernels import attention_prefill_triton
        attention_prefill_triton.PREFILL_SPLITS = args.prefill_splits
    from bench.report import write_json
    bs = args.block_size
    per_request = -(-(args.prefix_len + args.suffix_len + args.output_len) // bs)
    num_kv_blocks = args.fit_prefixes * per_request
    gib = args.kv_offload_gib
    if gib is None:  # every prefix, every request's own full blocks, and a quarter more
        blocks = args.num_prefixes * (args.prefix_len // bs) + args.num_requests * 2
        gib = round(1.25 * blocks * bytes_per_block(args) / 2**30, 3)
    print(f"model={args.model} requests={args.num_requests} prefixes={args.num_prefixes}x{args.prefix_len} "
          f"device pool={num_kv_blocks} blocks ({args.fit_prefixes} requests' worth) host tier={gib} GiB")
    if args.scheduler_only:
        from infer_cluster.worker.kv.copy import host_pool_blocks
        res = scheduler_only(args, num_kv_blocks, host_pool_blocks(gib, bytes_per_block(args)))
        write_json(args.out, {"args": vars(args), "scheduler_only": res})
        return 0
    from infer_cluster.worker.kv.copy import DEFAULT_COPY_MODE
    modes = (args.copy_modes or DEFAULT_COPY_MODE).split(",")
    runs = [("off", 0.0, "kernel")] + [("on" if i == 0 else f"on:{m}", gib, m) for i, m in enumerate(modes)]
    if args.warmup_requests > 0:
        warm = argparse.Namespace(**dict(vars(args), num_requests=args.warmup_requests, trace=None,
                                         time_copies=False, timeline=False, cprofile=0))
        took = [run(warm, offload, num_kv_blocks, mode)[0]["seconds"] for _, offload, mode in runs[:2]]
        print("warm-up (untimed; compiles kernels): " + ", ".join(f"{t:.2f} s" for t in took))
    results, tokens = {}, {}
    for name, offload, mode in runs:
        results[name], tokens[name] = run(args, offload, num_kv_blocks, mode)
        r = results[name]
        phases = " ".join(f"{k} {v:.2f}" for k, v in sorted(r["step_seconds"].items()))
        print(f"tier {name:>9}: {r['seconds']:8.2f} s  {r['requests_per_s']:8.2f} req/s  "
              f"{r['tokens_per_s']:10.0f} tok/s  computed {r['num_scheduled_tokens']} tok  "
              f"cached device {r['cached_tokens_device']} host {r['cached_tokens_host']} tok  "
              f"load waits {r['load_waits']}  [s: {phases}]")
    same = all(tokens[name] == tokens["off"] for name, _, _ in runs)
    ratios = {name: results["off"]["seconds"] / results[name]["seconds"] for name, _, _ in runs[1:]}
    for name, ratio in ratios.items():
        print(f"speed-up with the host tier ({name}, copy path {results[name]['copy_mode']}): {ratio:.2f}x "
              f"(target >= 2x)")
    print(f"same tokens in every run: {same}")
    write_json(args.out, {"args": vars(args), "num_kv_blocks": num_kv_blocks, "kv_offload_gib": gib,
                          "runs": results, "speedup": ratios["on"], "speedups": ratios, "same_tokens": same})
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
