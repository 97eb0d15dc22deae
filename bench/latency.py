"""Batch-1 decode latency (TPOT) vs its bandwidth bound (weight bytes / measured bandwidth).

Runs one request at a time (prompt `--prompt-len`, `--output-len` new tokens, ignore_eos) through
the offline engine's step API, timing every decode step; reports the median TPOT, TTFT, and the
bound from bench/roofline.py. Writes JSON. `--sampling` picks the request kind, with the same
parameters as bench/throughput.py's kinds (greedy by default; `all` times each kind in turn on
one engine, and writes one JSON row per kind). TTFT of longer prompts through the mixed-step
graphs as a serving engine captures them: `--prompt-len 1100 --max-num-seqs 256
--graph-max-tokens 512` (eager past 512 tokens) against `--graph-max-tokens 2048`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402
from bench.throughput import ALL_KINDS, SAMPLING_KINDS, sampling_params  # noqa: E402

ASYNC_MODES = {"on": True, "off": False, "auto": "auto"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b-shape")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--show-first-steps", action="store_true",
                    help="print each step's time and phases (ms) up to a request's first token")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--graph-max-tokens", type=int, default=None,
                    help="EngineConfig.graph_max_tokens (default: the engine's): prompts of up to this "
                         "many tokens replay the mixed-step graphs, longer ones run eagerly (TTFT)")
    ap.add_argument("--max-num-seqs", type=int, default=8,
                    help="the engine's max_num_seqs: the mixed-step graphs are captured for this many "
                         "sequences, so a serving value (256) shows what padded buckets cost a prompt")
    ap.add_argument("--async-scheduling", default="auto", choices=sorted(ASYNC_MODES),
                    help="schedule step n+1 while step n runs (auto: on for one rank on CUDA)")
    ap.add_argument("--sampling", default="greedy", choices=[*SAMPLING_KINDS, "all"],
                    help="request kind (bench/throughput.py's SAMPLING_KINDS); all: each in turn")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--pipeline-parallel-size", type=int, default=1)
    ap.add_argument("--out", default="bench/results/latency.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.worker import LLM

    extra = {} if args.graph_max_tokens is None else {"graph_max_tokens": args.graph_max_tokens}
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              num_kv_blocks=256, enforce_eager=args.enforce_eager, max_model_len=args.max_model_len, **extra,
              async_scheduling=ASYNC_MODES[args.async_scheduling],
              tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    kinds = list(ALL_KINDS) if args.sampling == "all" else [args.sampling]
    rows = {kind: time_kind(llm, kind, args) for kind in kinds}
    device = None
    if torch.cuda.is_available():
        from bench.roofline import measure_device, model_numbers
        device = measure_device()
        # T GPUs each read 1/T of the weights at once; P stages read theirs one after another
        bound_ms = (model_numbers(args.model)["weight_bytes"] / args.tensor_parallel_size
                    / (device["copy_GBps"] * 1e9) * 1e3)
        for res in rows.values():
            res["tpot_bound_ms"] = bound_ms
            res["fraction_of_bound"] = bound_ms / res["tpot_ms_p50"]
    for res in rows.values():
        res["tensor_parallel_size"] = args.tensor_parallel_size
        res["pipeline_parallel_size"] = args.pipeline_parallel_size
        print(json.dumps(res, indent=1))
    if len(rows) == 1:
        out = next(iter(rows.values()))
    else:
        out = {"model": args.model, "kinds": rows}
    if device is not None:
        out["device"] = device
    write_json(args.out, out)


def time_kind(llm, kind: str, args) -> dict:
    """Batch-1 TTFT and TPOT of `args.repeats` requests of one kind (after one warm-up request)."""
    ttfts, tpots = [], []
    span = min(5000, llm.engine.spec.vocab_size - 10)  # prompt ids in [10, 10 + span)
    for r in range(args.repeats + 1):
        prompt = [(r * 131 + j * 7) % span + 10 for j in range(args.prompt_len)]
        rid = llm.add_request(prompt, sampling_params(kind, [args.output_len], seed=r)[0])
        stamps = []
        t0 = time.perf_counter()
        done = False
        first_steps = []  # (seconds, phase seconds added) of the steps before the first token
        while not done:
            if not stamps and args.show_first_steps:
                t_step, before = time.perf_counter(), dict(llm.engine.stats()["step_seconds"])
            deltas = llm.step()
            if not stamps and args.show_first_steps:
                after = llm.engine.stats()["step_seconds"]
                first_steps.append((time.perf_counter() - t_step,
                                    {k: round(1e3 * (v - before.get(k, 0.0)), 3) for k, v in after.items()
                                     if v - before.get(k, 0.0) > 0}))
            for d in deltas:
                if d.request_id == rid:
                    stamps.append(time.perf_counter())
                    done = d.finished
        if first_steps and r > 0:
            print(f"{kind} repeat {r}: steps up to the first token: " + "; ".join(
                f"{1e3 * sec:.2f} ms {phases}" for sec, phases in first_steps))
        if r == 0:
            continue  # warm-up
        ttfts.append(stamps[0] - t0)
        tpots.extend(b - a for a, b in zip(stamps, stamps[1:]))
    return {"model": args.model, "sampling": kind, "async_scheduling": llm.engine.async_scheduling,
            "prompt_len": args.prompt_len, "max_num_seqs": args.max_num_seqs,
            "graph_max_tokens": llm.engine.config.graph_max_tokens,
            "ttft_ms": statistics.median(ttfts) * 1e3, "tpot_ms_p50": statistics.median(tpots) * 1e3,
            "tpot_ms_p90": sorted(tpots)[int(0.9 * len(tpots))] * 1e3}

if __name__ == "__main__":
    main()
