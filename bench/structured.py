"""Structured outputs' cost: the same random-length workload with none, half or all of its
requests under a JSON schema (in one process, one engine, `--repeats` passes of each in mirrored
order), batch-1 TPOT with and without a schema (the median of `--tpot-repeats` interleaved runs), and the compile time of the ten test schemas,
cold and cached.

The schema (an array of strings) never forces an early end, so with dummy weights a constrained
request still writes about as many tokens as a free one; every run reports its own token count,
and the ratios compare output tokens per second. Issue 42's targets: all constrained >= 0.90 of
unconstrained, half >= 0.95, batch-1 TPOT <= 1.1x.

    python bench/structured.py                      # CPU smoke on tiny-random
    python bench/structured.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \\
        --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096   # GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import run_info, write_json  # noqa: E402
from bench.workload import random_workload  # noqa: E402

SCHEMA = {"type": "array", "items": {"type": "string"}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-seqs", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[16, 64], metavar=("LO", "HI"))
    ap.add_argument("--output-len", type=int, nargs=2, default=[16, 64], metavar=("LO", "HI"))
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2,
                    help="passes of each kind (none, half, all; free and schema at batch 1), in "
                         "mirrored order (A B C C B A ...), summed")
    ap.add_argument("--tokenizer", default=None,
                    help="another tokenizer (a model name or path), e.g. a real model's large vocabulary "
                         "beside a dummy-weight shape, so the masks cost what they cost on a real model")
    ap.add_argument("--tpot-tokens", type=int, default=256)
    ap.add_argument("--tpot-repeats", type=int, default=6,  # 0: no batch-1 runs
                    help="batch-1 runs of each kind, interleaved; TPOT is their median (one H200 "
                         "host's runs of one kind spread up to 1.6x, 2026-11-29)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request's temperature, constrained or not (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="every request's (1.0: none); a penalty runs the sampler's general path")
    ap.add_argument("--logprobs", type=int, default=None, help="every request's top logprobs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/structured.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    tokenizer = None
    if args.tokenizer:
        from infer_cluster.worker.loading.loader import resolve_model_path
        tokenizer = args.tokenizer if os.path.isdir(args.tokenizer) else str(resolve_model_path(args.tokenizer))
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, tokenizer=tokenizer)
    vocab = llm.engine.spec.vocab_size
    prompts, out_lens = random_workload(args.num_seqs, tuple(args.prompt_len), tuple(args.output_len),
                                        vocab, args.seed)

    def params(n: int, constrained: bool) -> SamplingParams:
        return SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, logprobs=args.logprobs,
                              max_tokens=n, ignore_eos=True,
                              structured_outputs={"json": SCHEMA} if constrained else None)

    # warm-up: kernels, the grammar pool and its TokenizerInfo
    llm.generate(prompts[:2], [params(8, False), params(8, True)], use_tqdm=False)
    runs = {}
    kinds = (("none", 0), ("half", 2), ("all", 1))
    # none, half, all, then all, half, none, ...: a drift of the host's speed over the call falls
    # on every kind alike (one pass each moved "all" from 0.97 to 0.77 between machines)
    order = [kind for r in range(args.repeats) for kind in (kinds if r % 2 == 0 else kinds[::-1])]
    for ri, (name, every) in enumerate(order):
        shift = 7919 * (ri + 1)  # other ids per run: no prefix-cache hits across runs
        run_prompts = [[2 + (t + shift) % (vocab - 2) for t in p] for p in prompts]
        ps = [params(n, bool(every) and i % every == 0) for i, n in enumerate(out_lens)]
        sync()
        phases0 = dict(llm.stats()["step_seconds"])
        t = time.perf_counter()
        outs = llm.generate(run_prompts, ps, use_tqdm=False)
        sync()
        elapsed = time.perf_counter() - t
        n_tokens = sum(len(o.token_ids) for o in outs)
        # the engine's host time per phase over the run (where a constrained run's time goes)
        phases = {k: round(v - phases0.get(k, 0.0), 3) for k, v in llm.stats()["step_seconds"].items()}
        run = runs.setdefault(name, {"tokens": 0, "seconds": 0.0, "passes": []})
        run["tokens"] += n_tokens
        run["seconds"] += elapsed
        run["passes"].append({"tokens_per_s": n_tokens / elapsed, "host_phase_seconds": phases})
        print(f"{name:>5}: {n_tokens} tokens in {elapsed:.2f} s = {n_tokens / elapsed:.1f} tok/s; "
              f"host phases, s: {phases}")
    for run in runs.values():
        run["tokens_per_s"] = run["tokens"] / run["seconds"]
    for name in ("half", "all"):
        runs[name]["vs_none"] = runs[name]["tokens_per_s"] / runs["none"]["tokens_per_s"]
        per_pass = [p["tokens_per_s"] / q["tokens_per_s"] for p, q in zip(runs[name]["passes"], runs["none"]["passes"])]
        print(f"{name:>5} / none: {runs[name]['vs_none']:.3f} over {args.repeats} passes each (per pass: "
              + ", ".join(f"{r:.3f}" for r in per_pass) + ")")

    tpot, decode_s = {}, {"free": [], "schema": []}
    pair = (("free", False), ("schema", True))
    for name, constrained in [k for r in range(args.tpot_repeats) for k in (pair if r % 2 == 0 else pair[::-1])]:
        n = args.tpot_tokens
        llm.generate([prompts[0]], params(4, constrained), use_tqdm=False)
        sync()
        phases0 = dict(llm.stats()["step_seconds"])
        t = time.perf_counter()
        out = llm.generate([prompts[0]], params(n, constrained), use_tqdm=False)[0]
        sync()
        phases = {k: round((v - phases0.get(k, 0.0)) * 1e3 / n, 4) for k, v in llm.stats()["step_seconds"].items()}
        tpot[f"{name}_phase_ms_per_token"] = phases
        print(f"batch-1 {name}: host phases, ms per token: {phases}")
        m = out.metrics
        decode = (m.finish_time - m.first_token_time) if m and m.finish_time else time.perf_counter() - t
        decode_s[name].append(decode / max(1, len(out.token_ids) - 1))
    if args.tpot_repeats:
        for name, values in decode_s.items():
            tpot[name] = statistics.median(values)
            tpot[f"{name}_runs"] = values
        tpot["ratio"] = tpot["schema"] / tpot["free"]
        print(f"batch-1 TPOT: free {tpot['free'] * 1e3:.2f} ms, schema {tpot['schema'] * 1e3:.2f} ms "
              f"({tpot['ratio']:.2f}x)")

    compile_ms = {}
    try:
        from tests.structured.schemas import BOUNDED
    except ImportError:  # an installed package without the tests
        BOUNDED = {}
    from infer_cluster.protocol import StructuredOutputsParams
    pool = llm.engine.structured.pool
    for name, schema in BOUNDED.items():
        so = StructuredOutputsParams(json=schema)
        t = time.perf_counter()
        pool.submit(so).result()
        cold = time.perf_counter() - t
        t = time.perf_counter()
        pool.submit(so).result()
        compile_ms[name] = {"cold_ms": cold * 1e3, "cached_ms": (time.perf_counter() - t) * 1e3}
    if compile_ms:
        colds = [v["cold_ms"] for v in compile_ms.values()]
        print(f"compile of {len(colds)} schemas: cold {min(colds):.2f}..{max(colds):.2f} ms, "
              f"cached {max(v['cached_ms'] for v in compile_ms.values()):.3f} ms at most")
    result = {**run_info(), "model": args.model, "tokenizer": args.tokenizer, "device": str(llm.engine.runner.device),
              "async_scheduling": llm.engine.async_scheduling, "num_seqs": args.num_seqs,
              "prompt_len": args.prompt_len, "output_len": args.output_len, "schema": SCHEMA,
              "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                           "repetition_penalty": args.repetition_penalty, "logprobs": args.logprobs},
              "workload": runs, "tpot_s": tpot, "compile_ms": compile_ms}
    llm.close()
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
