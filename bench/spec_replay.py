"""Prompt lookup's settings replayed offline: how many tokens a batch-1 verify step would give
for each (k, prompt_lookup_min, prompt_lookup_max), from greedy outputs generated once.

Why: a greedy request's tokens do not depend on speculation (verify.py), so once its output is
known, the proposals `NgramIndex` makes at each step and how many of them the output accepts
follow without running the model again. Many settings are then compared in seconds on a CPU;
only the step costs need a GPU, and they come in as arguments (`--plain-ms`, `--verify-ms`; the
defaults are the H200's at dde22f1, bench/RESULTS.md#speculative-decoding): a plain step gives 1
token for `plain_ms`, a verify step of k proposals gives the accepted ones plus one for
`verify_ms[k]`, and the estimate is the off time over the on time. That model leaves out the
governor (`adaptive`, which skips verify steps it measured not to pay) and prefill, so it ranks
settings; the GPU benchmark (bench/spec_decode.py) measures them.

The replay is the engine's own rule at batch 1 with `adaptive` off: after the prefill's token,
each step proposes up to min(k, max_tokens - len(output) - 1) tokens from prompt + output (none:
a plain step) and keeps the leading proposals the output repeats, then one token.
tests/spec_decode/test_replay.py checks it against the engine's counts.

    python bench/spec_replay.py                         # SmolLM2 on the CPU, 24 conversations
    python bench/spec_replay.py --outputs FILE.json     # reuse outputs saved by an earlier run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import run_info, write_json  # noqa: E402
from bench.spec_decode import conversations  # noqa: E402

# H200, dde22f1, SmolLM2 at ~1,300 tokens (bench/RESULTS.md): a plain batch-1 step, and a
# verify step's host launch (0.85 ms) plus its decode graph (k + 1 rows, padded: 0.97 ms at
# 4-8 rows, 1.07 at 9-16, 1.30 at 17-32).
PLAIN_MS = 0.70
VERIFY_MS = {k: 0.85 + (0.97 if k + 1 <= 8 else 1.07 if k + 1 <= 16 else 1.30) for k in range(1, 33)}


def replay(prompt: list[int], output: list[int], k: int, min_n: int, max_n: int,
           max_tokens: int, stats) -> dict:
    """One request's steps after its prefill: plain and verify steps and tokens; its proposals
    and acceptances go to `stats` (the engine's `SpecStats`)."""
    from infer_cluster.worker.spec_decode.ngram import NgramIndex
    from infer_cluster.worker.spec_decode.verify import num_accepted

    index = NgramIndex(min_n, max_n)
    tokens = list(prompt) + list(output[:1])
    done = 1
    steps = {"plain": 0, "verify": 0, "tokens": 0}
    while done < len(output):
        room = min(k, max_tokens - done - 1)
        drafts = index.propose(tokens, room) if room > 0 else []
        a = num_accepted(drafts, output[done:])
        n = min(a + 1, len(output) - done)
        steps["verify" if drafts else "plain"] += 1
        if drafts:
            stats.record(len(drafts), a)
        tokens.extend(output[done:done + n])
        done += n
        steps["tokens"] += n
    return steps


def replay_all(data: list[dict], k: int, min_n: int, max_n: int, max_tokens: int,
               plain_ms: float, verify_ms: float) -> dict:
    """Every request of `data` replayed: steps, tokens, tokens a verify step, the engine's
    speculation counters and the estimated speedup."""
    from infer_cluster.worker.spec_decode.verify import SpecStats

    stats = SpecStats(k)
    rows = [replay(d["prompt"], d["output"], k, min_n, max_n, max_tokens, stats) for d in data]
    plain = sum(r["plain"] for r in rows)
    verify = sum(r["verify"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    on_ms = plain * plain_ms + verify * verify_ms
    return {"plain_steps": plain, "verify_steps": verify, "tokens": tokens,
            "tokens_per_verify": (tokens - plain) / verify if verify else 0.0, **stats.as_dict(),
            "estimated_speedup": tokens * plain_ms / on_ms if on_ms else 1.0}


def generate(args) -> list[dict]:
    """Greedy outputs of the conversations (prompt ids, output ids), speculation off."""
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM
    from infer_cluster.worker.text.chat import render_chat

    llm = LLM(args.model, device=args.device, dtype=args.dtype, load_format=args.load_format,
              max_model_len=args.max_model_len)
    prompts = [render_chat(llm.engine.tokenizer, c) for c in conversations(args.conversations, args.input_chars)]
    started = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.output_len), use_tqdm=False)
    print(f"generated {sum(len(o.token_ids) for o in outs)} tokens for {len(outs)} conversations "
          f"in {time.perf_counter() - started:.1f} s", flush=True)
    llm.close()
    return [{"prompt": p, "output": o.token_ids} for p, o in zip(prompts, outs)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--input-chars", type=int, default=4000, help="passage length (~4 chars a token)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--outputs", default=None,
                    help="a JSON file of outputs: read if it exists, else generated and written there")
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 12, 16])
    ap.add_argument("--lookup", nargs="+", default=["2-4", "3-4", "3-8", "3-16", "4-16"],
                    help="MIN-MAX prompt lookup windows")
    ap.add_argument("--plain-ms", type=float, default=PLAIN_MS)
    ap.add_argument("--verify-ms", type=float, default=None,
                    help="one verify step's cost for every k (default: by k, the H200's)")
    ap.add_argument("--out", default="bench/results/spec_replay.json")
    args = ap.parse_args(argv)

    if args.outputs and Path(args.outputs).exists():
        data = json.loads(Path(args.outputs).read_text())
    else:
        data = generate(args)
        if args.outputs:
            Path(args.outputs).write_text(json.dumps(data))
    results = []
    for k in args.k:
        verify_ms = args.verify_ms if args.verify_ms is not None else VERIFY_MS[k]
        for window in args.lookup:
            lo, hi = (int(x) for x in window.split("-"))
            s = replay_all(data, k, lo, hi, args.output_len, args.plain_ms, verify_ms)
            results.append({"k": k, "prompt_lookup_min": lo, "prompt_lookup_max": hi, **s})
            print(f"k {k:2d} lookup {lo}-{hi:<2d}: {s['verify_steps']:5d} verify and {s['plain_steps']:5d} "
                  f"plain steps, {s['tokens_per_verify']:.2f} tokens a verify step, estimated "
                  f"{s['estimated_speedup']:.2f}x", flush=True)
    result = {**run_info(), "model": args.model, "conversations": len(data), "output_len": args.output_len,
              "plain_ms": args.plain_ms, "results": results}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
