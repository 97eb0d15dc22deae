"""Start-up cost, first run against warm runs, and the tokenizer's effect, in one process.

Starts an engine (timed: weights, KV sizing, graph capture, warm-up), then runs the same kind
of workload three times with fresh prompts each time (so the prefix cache cannot help a later
run): `first` is what a user gets right after start, `warm` the median of the other two.
`--tokenizer bytelevel|metaspace` swaps in a full-vocabulary tokenizer of that kind
(bench/tokenizer_kinds.py) so every sampled id really decodes; `model` keeps the model's own.

Example (GPU, workload A):
  python bench/cold_start.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \\
      --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --tokenizer metaspace
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402
from bench.workload import random_workload  # noqa: E402


class CompileLog:
    """Records each Triton specialization compiled in this process (an in-process cache miss,
    whether or not the disk cache had it) while installed; `with CompileLog() as log:` installs
    it and puts the previous hook back on exit. Also used by tests/parity/test_gpu_compiles.py."""

    def __init__(self):
        self.lines: list[str] = []
        self._previous = None

    def __enter__(self):
        import triton
        self._previous = triton.knobs.runtime.jit_cache_hook
        triton.knobs.runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc):
        import triton
        triton.knobs.runtime.jit_cache_hook = self._previous
        return False

    def _hook(self, *args, **kw):
        self.lines.append(str(kw.get("repr", args[:1]))[:400])
        return None  # never skip the compile

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[16, 128], metavar=("LO", "HI"))
    ap.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("LO", "HI"))
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"])
    ap.add_argument("--log-compiles", action="store_true",
                    help="list every Triton kernel specialization first compiled after start-up "
                         "(triton.knobs.runtime.jit_cache_hook): what the warm-up missed")
    ap.add_argument("--tokenizer", default="model", choices=["model", "bytelevel", "metaspace"])
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                    help="engine warm-up at start (default: the engine's, on for CUDA)")
    ap.add_argument("--speculative-config", default=None, metavar="JSON",
                    help='speculative decoding, as for serve: e.g. \'{"method": "ngram", '
                         '"num_speculative_tokens": 15}\' (start-up then includes the verify graphs)')
    ap.add_argument("--out", default="bench/results/cold_start.json")
    return ap.parse_args(argv)


def _sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv=None):
    args = parse_args(argv)
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM
    from infer_cluster.worker.loading.loader import load_hf_config, resolve_model_path

    vocab = load_hf_config(resolve_model_path(args.model)).vocab_size
    tmp = tempfile.TemporaryDirectory()
    tokenizer = None
    if args.tokenizer != "model":
        from bench.tokenizer_kinds import build_tokenizer
        tokenizer = str(build_tokenizer(args.tokenizer, vocab, tmp.name))
    t = time.perf_counter()
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, tokenizer=tokenizer,
              kv_cache_dtype=args.kv_cache_dtype, warmup=args.warmup,
              speculative_config=json.loads(args.speculative_config) if args.speculative_config else None)
    _sync()
    startup = time.perf_counter() - t
    runs = []
    compiles = CompileLog().__enter__() if args.log_compiles else None
    for seed in (1, 2, 3):
        prompts, out_lens = random_workload(args.num_seqs, tuple(args.prompt_len), tuple(args.output_len),
                                            vocab, seed)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in out_lens]
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        _sync()
        elapsed = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in outs)
        chars = sum(len(o.text) for o in outs)
        runs.append({"seed": seed, "tokens": n, "seconds": elapsed, "tokens_per_s": n / elapsed,
                     "text_chars": chars})
        if compiles is not None:
            runs[-1]["compiles"] = compiles.take()
            print(f"run {seed}: {len(runs[-1]['compiles'])} kernel specializations compiled")
            for line in runs[-1]["compiles"]:
                print("   ", line)
    if compiles is not None:
        compiles.__exit__(None, None, None)
    stats = llm.stats()
    warm = sorted(r["tokens_per_s"] for r in runs[1:])
    warm_tps = sum(warm) / len(warm)
    result = {"model": args.model, "speculative_config": args.speculative_config, "tokenizer": args.tokenizer, "kv_cache_dtype": args.kv_cache_dtype, "device": str(llm.engine.runner.device),
              "startup_seconds": startup, "warmup_seconds": stats["warmup_seconds"],
              "runs": runs, "first_tokens_per_s": runs[0]["tokens_per_s"], "warm_tokens_per_s": warm_tps,
              "first_over_warm": runs[0]["tokens_per_s"] / warm_tps,
              "step_seconds": stats["step_seconds"]}
    llm.close()
    print(f"\nmodel={args.model} tokenizer={args.tokenizer} device={result['device']} "
          f"seqs={args.num_seqs} prompt={args.prompt_len} output={args.output_len}")
    print(f"start-up {startup:.1f} s (warm-up {stats['warmup_seconds']:.1f} s)")
    for name, r in zip(("first", "warm-1", "warm-2"), runs):
        print(f"{name:<8}{r['tokens']:>10}{r['seconds']:>10.2f} s{r['tokens_per_s']:>12.1f} tok/s"
              f"{r['text_chars']:>12} chars")
    print(f"first / warm = {result['first_over_warm']:.3f}")
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
