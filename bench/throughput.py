"""Offline throughput: our engine vs HF transformers on the same model and prompts, one run.

Workload (nano-vllm's): N sequences, prompt and output lengths uniform in [lo, hi], ignore_eos.
Prints one table (output tokens/s for each system and the ratio) and writes JSON.

HF baselines: `sequential` runs `generate` on each prompt alone (its own output length; the
CPU default), `continuous` uses transformers' continuous batching `generate_batch`
(`attn_implementation="paged|sdpa"`; the GPU default; one max_new_tokens for all, so its rate is
its generated tokens over its time). `--hf-max-seqs` limits how many prompts HF runs (it is
slow); its rate is still tokens/s over those.

`--sampling` picks the request kind (greedy | sampled | penalties | logprobs | top_p; `all` runs the first four
in one process, on one engine, and prints each one's rate and its ratio to greedy; HF runs only
for greedy). The kinds are issue 10's: sampled = temperature 0.8, top_p 0.9, top_k 50, a seed
per request; penalties = repetition 1.1 + presence 0.3 + frequency 0.2 at temperature 0.7;
logprobs = greedy with logprobs=5; top_p = temperature 0.8, top_p 0.9 alone, a seed per request (what
OpenAI-style clients send). `--repeats N` runs the kinds round-robin N times and keeps
each kind's best run (CPU timings drift; every run's rate is printed and kept as
`runs_tokens_per_s`). Each run also records the process's CPU time
(`time.process_time`, all threads): on a machine shared with other jobs, tokens per CPU-second
(with `--torch-threads 1`) moves far less with the load than wall-clock tokens/s.

Examples:
  python bench/throughput.py --model tiny-random --num-seqs 64 --prompt-len 16 128 --output-len 16 128
  python bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \\
      --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024
  python bench/throughput.py --model small-random-151k --sampling all --hf none \\
      --num-seqs 64 --prompt-len 16 128 --output-len 32 64       # the CPU form of issue 10's table
  python bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --hf none \
      --pipeline-parallel-size 2 --pipeline-microbatches off    # A/B pipeline micro-batches (auto = on on CUDA)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_timeline import ProfileWindow  # noqa: E402
from bench.host_timers import HostTimers  # noqa: E402
from bench.report import run_info, write_json  # noqa: E402
from bench.workload import random_workload  # noqa: E402

ASYNC_MODES = {"on": True, "off": False, "auto": "auto"}


SAMPLING_KINDS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=50),  # plus a seed per request
    "penalties": dict(repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.2,
                      temperature=0.7),
    "logprobs": dict(temperature=0.0, logprobs=5),
    # top-p alone, as OpenAI-style clients send it (not in `all`: its rows whose kept set is wider
    # than their candidates are redone in `Sampler.finish`, the slow path to watch)
    "top_p": dict(temperature=0.8, top_p=0.9),  # plus a seed per request
}
ALL_KINDS = ("greedy", "sampled", "penalties", "logprobs")


def sampling_params(kind: str, out_lens: list[int], seed: int) -> list:
    from infer_cluster.protocol import SamplingParams

    extra = SAMPLING_KINDS[kind]
    return [SamplingParams(max_tokens=n, ignore_eos=True, **extra,
                           **({"seed": seed + i} if kind in ("sampled", "top_p") else {}))
            for i, n in enumerate(out_lens)]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"],
                    help="KV cache storage (EngineConfig.kv_cache_dtype)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[16, 128], metavar=("LO", "HI"))
    ap.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("LO", "HI"))
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--graph-max-tokens", type=int, default=None,
                    help="EngineConfig.graph_max_tokens: steps of up to this many tokens that are not "
                         "decode-only replay CUDA graphs too (default: the engine's)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--speculative-config", default=None, metavar="JSON",
                    help="EngineConfig.speculative_config, e.g. '{\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 4, \"disable_by_batch_size\": 32}' (workload A at "
                         "batch 256 against speculation off: run once with it and once without)")
    ap.add_argument("--async-scheduling", default="auto", choices=sorted(ASYNC_MODES),
                    help="schedule step n+1 while step n runs (auto: on on CUDA, any T and P)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-microbatches", default="auto", choices=["auto", "on", "off"],
                    help="with --pipeline-parallel-size P > 1: keep P micro-batches in flight (on) "
                         "or run one step at a time (off; auto = on where stages replay CUDA graphs), "
                         "to A/B the pipeline")
    ap.add_argument("--hf", default="auto", choices=["auto", "sequential", "continuous", "none"])
    ap.add_argument("--hf-max-seqs", type=int, default=None)
    ap.add_argument("--hf-config", nargs="+", default=None, metavar="JSON",
                    help="continuous mode: one or more transformers ContinuousBatchingConfig settings as JSON "
                         "(e.g. '{\"use_cuda_graph\": true, \"max_memory_percent\": 0.8}'); each runs in turn "
                         "and the fastest is the baseline (all are reported). Keys this transformers lacks "
                         "are reported and dropped")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sampling", default="greedy", choices=[*SAMPLING_KINDS, "all"])
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (Python's default 0.005 s)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads before start")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="profile the last timed run of each kind (torch.profiler), write its Chrome trace to "
                         "DIR and print its GPU timeline: compute idle, gaps, kernels by family (bench/gpu_timeline.py)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="cProfile the last timed run of each kind and print its N costliest functions "
                         "by own time and by cumulative time (where the host's step time goes)")
    ap.add_argument("--host-timers", action="store_true",
                    help="wall-clock timers around the engine's and the sampler's functions in the last timed run "
                         "of each kind: calls, ms a step and us a call of each (bench/host_timers.py; far "
                         "lighter than --cprofile)")
    ap.add_argument("--step-timeline", action="store_true",
                    help="CUDA events around each step of the last timed run of each kind (rank 0's stream): "
                         "device time per step kind and batch size, and the device's idle time between steps "
                         "(bench/sched_timeline.py); costs no profiler overhead")
    ap.add_argument("--out", default="bench/results/throughput.json")
    return ap.parse_args(argv)


def run_ours(args, prompts, out_lens, kinds):
    import torch

    from infer_cluster.worker import LLM

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, device=args.device,
              kv_cache_dtype=args.kv_cache_dtype,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
              **({} if args.graph_max_tokens is None else {"graph_max_tokens": args.graph_max_tokens}),
              tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size, max_model_len=args.max_model_len,
              async_scheduling=ASYNC_MODES[args.async_scheduling],
              pipeline_microbatches=args.pipeline_microbatches,
              **({} if args.speculative_config is None else {"speculative_config": args.speculative_config}))
    runs = {}
    gc_timer = GcTimer()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)  # the GIL hand-over between engine and text threads
    for kind in kinds:  # warm-up (lazy init, kernels) of every kind before any timing
        llm.generate(prompts[:2], sampling_params(kind, out_lens[:2], args.seed), use_tqdm=False)
    vocab = llm.engine.spec.vocab_size
    for r in range(args.repeats):
        for ki, kind in enumerate(kinds):
            params = sampling_params(kind, out_lens, args.seed)
            # Same lengths, other ids for every timed run: no run may find another's prompts in
            # the prefix cache (that would skip its prefill and flatter the later kinds).
            shift = 7919 * (1 + r * len(kinds) + ki)
            run_prompts = [[2 + (t + shift) % (vocab - 2) for t in p] for p in prompts]
            _sync()
            phases0, gc0 = dict(llm.stats()["step_seconds"]), gc_timer.snapshot()
            t, c = time.perf_counter(), time.process_time()
            trace = args.trace if r == args.repeats - 1 else None
            prof = cProfile.Profile() if args.cprofile and r == args.repeats - 1 else None
            timeline = _step_timeline(llm, args.step_timeline and r == args.repeats - 1)
            timers = HostTimers() if args.host_timers and r == args.repeats - 1 else contextlib.nullcontext()
            with ProfileWindow(trace, f"{kind}_kv_{args.kv_cache_dtype}"), timeline as tl, timers as ht:
                if prof:
                    prof.enable()
                outs = llm.generate(run_prompts, params, use_tqdm=len(kinds) == 1)
                if prof:
                    prof.disable()
            _sync()
            elapsed, cpu = time.perf_counter() - t, time.process_time() - c
            n_tokens = sum(len(o.token_ids) for o in outs)
            # This run's engine time by phase; "outside the step" is the generate loop's own work.
            phases = {k: round(v - phases0.get(k, 0.0), 3) for k, v in llm.stats()["step_seconds"].items()}
            phases["outside the step"] = round(elapsed - sum(phases.values()), 3)
            phases["gc (within the above)"] = [round(b - a, 3) for a, b in zip(gc0, gc_timer.snapshot())]
            timeline_summary = tl.gpu_summary() if tl is not None else None
            if timeline_summary is not None:
                print(f"--- step timeline, {kind}: {timeline_summary}")
            if prof:
                print(f"--- cProfile, {kind} (host time per function; cProfile slows Python calls)")
                for key in ("tottime", "cumulative"):
                    pstats.Stats(prof).sort_stats(key).print_stats(args.cprofile)
            run = {"tokens": n_tokens, "seconds": elapsed, "tokens_per_s": n_tokens / elapsed,
                   "cpu_seconds": cpu, "tokens_per_cpu_s": n_tokens / cpu, "phases": phases}
            if timeline_summary is not None:
                run["step_timeline"] = timeline_summary
            if ht is not None:
                ht.print(kind)
                run["host_timers"] = ht.table()
            best = runs.setdefault(kind, run)
            # every run's rate, beside the best: on the H200 hosts single runs of one tree moved
            # the int8 kinds' ratios by +-5% (bench/RESULTS.md, "Request kinds")
            best.setdefault("runs_tokens_per_s", []).append(round(n_tokens / elapsed, 1))
            for key in ("seconds", "cpu_seconds"):  # each figure's best run
                best[key] = min(best[key], run[key])
            best["tokens_per_s"] = n_tokens / best["seconds"]
            best["tokens_per_cpu_s"] = n_tokens / best["cpu_seconds"]
    info = dict(runs[kinds[0]])
    decoder = llm.engine.spec_decoder
    if decoder is not None:  # speculating: how much it verified and what the governor measured
        stats = llm.stats()
        info["speculation"] = {k: stats[k] for k in ("num_spec_draft_tokens", "num_spec_accepted_tokens")}
        if decoder.governor is not None:
            info["speculation"]["governor"] = {str(k): v for k, v in decoder.governor.as_dict().items()}
        print("speculation:", info["speculation"])
    info.update({"num_kv_blocks": llm.stats()["num_total_blocks"], "device": str(llm.engine.runner.device),
                 "dtype": str(llm.engine.runner.dtype), "kv_cache_dtype": args.kv_cache_dtype,
                 "preemptions": llm.stats()["num_preemptions"],
                 "async_scheduling": llm.engine.async_scheduling,
                 "pipeline_depth": llm.engine.pipeline_depth,
                 "step_seconds": llm.stats()["step_seconds"], "sampling": runs})
    path, dtype, device = llm.engine.model_path, llm.engine.runner.dtype, llm.engine.runner.device
    llm.close()
    return info, path, dtype, device


def _step_timeline(llm, on: bool):
    """`SchedTimeline` with the engine's per-step CUDA events when `on` (CUDA only), else a no-op."""
    if not on or llm.engine.runner.device.type != "cuda":
        return contextlib.nullcontext()
    from bench.sched_timeline import SchedTimeline
    return SchedTimeline(llm.engine.scheduler, llm.engine)


class GcTimer:
    """Seconds the garbage collector ran (any thread), by generation, through `gc.callbacks`."""

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start

    def snapshot(self) -> list:
        return list(self.seconds)


def _sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_hf_best(mode, model_path, dtype, device, load_format, prompts, out_lens, configs):
    """HF's rate with each continuous-batching config in `configs` (None: transformers' defaults);
    the fastest is the baseline, every try is kept under "tries"."""
    tries = []
    for cb in configs or [None]:
        try:
            tries.append(run_hf(mode, model_path, dtype, device, load_format, prompts, out_lens, cb))
        except Exception as exc:  # one config that this transformers rejects must not end the rest
            print(f"HF baseline ({mode}, {cb}) failed: {type(exc).__name__}: {exc}")
            tries.append({"config": cb, "error": f"{type(exc).__name__}: {exc}"})
        print(f"HF {mode} {cb or 'defaults'}: " + (f"{tries[-1]['tokens_per_s']:.1f} tok/s"
                                                 if "tokens_per_s" in tries[-1] else "failed"))
    ok = [t for t in tries if "tokens_per_s" in t]
    if not ok:
        raise RuntimeError(tries[-1]["error"])
    best = dict(max(ok, key=lambda t: t["tokens_per_s"]))
    if len(tries) > 1:
        best["tries"] = tries
    return best


def _cb_config(cb: dict | None):
    """A ContinuousBatchingConfig from `cb`, keeping the keys this transformers knows."""
    if not cb:
        return None, {}
    import inspect

    from transformers.generation import ContinuousBatchingConfig
    known = set(inspect.signature(ContinuousBatchingConfig.__init__).parameters)
    dropped = {k: v for k, v in cb.items() if k not in known}
    if dropped:
        print(f"HF: this transformers' ContinuousBatchingConfig has no {sorted(dropped)}; dropped")
    return ContinuousBatchingConfig(**{k: v for k, v in cb.items() if k in known}), dropped


def run_hf(mode, model_path, dtype, device, load_format, prompts, out_lens, cb=None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs, dropped = {"dtype": dtype}, {}
    if mode == "continuous":
        kwargs["attn_implementation"] = "paged|sdpa"
    if load_format == "dummy":
        config = AutoConfig.from_pretrained(str(model_path))
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), **kwargs).to(device)
    model.eval()
    n_tokens = 0
    t = time.perf_counter()
    # no_grad, not inference_mode: HF's continuous batching updates its cache from a worker
    # thread, which may not touch inference tensors created here.
    with torch.no_grad():
        if mode == "sequential":
            from tqdm.auto import tqdm
            for p, n in tqdm(list(zip(prompts, out_lens)), desc="HF generate", unit="req"):
                g = model.generate(torch.tensor([p], device=device), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0)
                n_tokens += g.shape[1] - len(p)
        else:
            from transformers import GenerationConfig
            cfg = GenerationConfig(max_new_tokens=max(out_lens), do_sample=False, eos_token_id=-1,
                                   pad_token_id=0)
            cb_config, dropped = _cb_config(cb)
            kw = {"continuous_batching_config": cb_config} if cb_config is not None else {}
            res = model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=True, **kw)
            n_tokens = sum(len(r.generated_tokens) for r in res.values())
            if n_tokens == 0:
                raise RuntimeError(f"generate_batch returned no tokens: {list(res.values())[:1]!r}")
    _sync()
    elapsed = time.perf_counter() - t
    out = {"mode": mode, "tokens": n_tokens, "seconds": elapsed, "tokens_per_s": n_tokens / elapsed,
           "num_seqs": len(prompts)}
    if cb:
        out["config"] = cb
        if dropped:
            out["dropped"] = sorted(dropped)
    return out


def main(argv=None):
    args = parse_args(argv)
    from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path

    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    prompts, out_lens = random_workload(args.num_seqs, tuple(args.prompt_len), tuple(args.output_len),
                                        vocab, args.seed)
    kinds = list(ALL_KINDS) if args.sampling == "all" else [args.sampling]
    ours, path, dtype, device = run_ours(args, prompts, out_lens, kinds)
    result = {"bench": "throughput", "model": args.model,
              "workload": {"num_seqs": args.num_seqs, "prompt_len": args.prompt_len,
                           "output_len": args.output_len, "seed": args.seed},
              "layout": {"tensor_parallel_size": args.tensor_parallel_size,
                         "pipeline_parallel_size": args.pipeline_parallel_size,
                         "kv_cache_dtype": args.kv_cache_dtype},
              "run": run_info(), "ours": ours}
    mode = args.hf if args.hf != "auto" else ("continuous" if device.type == "cuda" else "sequential")
    if mode != "none" and kinds != ["greedy"]:
        print("HF baseline skipped: it runs greedy only (use --sampling greedy)")
    elif mode != "none":
        k = args.hf_max_seqs or len(prompts)
        try:
            configs = [json.loads(c) for c in args.hf_config] if args.hf_config else None
            result["hf"] = run_hf_best(mode, path, dtype, device, args.load_format, prompts[:k], out_lens[:k],
                                       configs)
            result["ratio"] = ours["tokens_per_s"] / result["hf"]["tokens_per_s"]
        except Exception as exc:  # an HF API change must not lose our own figures
            print(f"HF baseline ({mode}) failed: {type(exc).__name__}: {exc}")
            result["hf_error"] = f"{type(exc).__name__}: {exc}"
    print(f"\nmodel={args.model} device={ours['device']} dtype={ours['dtype']} seqs={args.num_seqs} "
          f"prompt={args.prompt_len} output={args.output_len} kv_cache_dtype={args.kv_cache_dtype} "
          f"num_kv_blocks={ours['num_kv_blocks']} preemptions={ours['preemptions']}")
    print(f"{'system':<28}{'tokens':>10}{'seconds':>10}{'tok/s':>12}{'/ greedy':>10}"
          f"{'tok/cpu-s':>12}{'/ greedy':>10}")
    greedy = ours["sampling"].get("greedy")
    for kind, run in ours["sampling"].items():
        ratios = (f"{run['tokens_per_s'] / greedy['tokens_per_s']:>10.2f}",
                  f"{run['tokens_per_cpu_s'] / greedy['tokens_per_cpu_s']:>10.2f}") if greedy else ("", "")
        print(f"{'infer-cluster ' + kind:<28}{run['tokens']:>10}{run['seconds']:>10.2f}"
              f"{run['tokens_per_s']:>12.1f}{ratios[0]}{run['tokens_per_cpu_s']:>12.1f}{ratios[1]}")
    if "ratio" in result:
        hf = result["hf"]
        print(f"{'HF transformers (' + hf['mode'] + ')':<28}{hf['tokens']:>10}{hf['seconds']:>10.2f}"
              f"{hf['tokens_per_s']:>12.1f}")
        print(f"ratio (ours / HF): {result['ratio']:.2f}x")
    if args.repeats > 1:
        for kind, run in ours["sampling"].items():
            print(f"runs of {kind} (tok/s, the table has the best):",
                  " / ".join(f"{x:,.1f}" for x in run["runs_tokens_per_s"]))
    for kind, run in ours["sampling"].items():
        print(f"phases of the first timed {kind} run (s):", run["phases"])
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
