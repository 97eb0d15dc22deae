"""Speculative decoding (n-gram prompt lookup, or a draft model): tokens/s with it on and off, batch 1 and 8, on an
input-grounded workload: chat-templated "rewrite / correct / repeat this passage" and code-edit
prompts over about `--input-chars` / 4 tokens of input (English from tests/data, code from this
repository), greedy, so the model copies much of its input.

Runs, in one process: `off` and `on` (the engine's defaults: CUDA graphs,
async scheduling where they apply; verify steps are synchronous, run as decode steps up to 48
positions and replay the mixed-step graphs above), and on request `off_eager` / `on_eager`
(enforce_eager, synchronous). By default every run's engine is built first and the rounds
alternate between them (`--interleave`), so a drift of the host's speed falls on all alike.
Reports tok/s per batch size (every batch size decodes the same conversations: `--rounds`
rounds of the largest batch, more rounds of a smaller one; summed), the ratios and
each round's ratio (min / median / max), batch-1 TPOT from the request metrics, the
acceptance per position, and how far greedy outputs agree with the first run: identical on the
CPU in float32; in bf16 a verify step computes a position in a batch of other shape than
decoding does (other GEMV and attention launches), so near-ties can flip a token and the outputs
part there (`agreement`: the share of each output before its first difference, averaged).

    python bench/spec_decode.py --batch 1 --output-len 16 --input-chars 600   # CPU smoke
    python bench/spec_decode.py                                              # GPU: SmolLM2, 1 and 8
    python bench/spec_decode.py --schema      # the same, every answer a JSON object (structured outputs)
    python bench/spec_decode.py --method draft_model --draft-model NAME --load-format dummy
        # the draft's mechanics (its forwards, two KV pools) with random weights; the draft
        # loads like the target (same load_format, device, dtype)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import run_info, write_json  # noqa: E402
from bench.step_log import StepLog  # noqa: E402
from bench.throughput import SAMPLING_KINDS  # noqa: E402

TASKS = ["Rewrite this passage in plain modern English, keeping every sentence:",
         "Correct the spelling and punctuation of this passage and return it in full:",
         "Repeat this passage exactly, word for word:"]
CODE_TASK = "Rename the variable `req` to `request` everywhere in this code and return the whole file:"
CODE_FILES = ["worker/sched/block_allocator.py", "worker/sched/request.py", "worker/kv/block_table.py"]


# `--schema`: every request answers in this JSON object (a structured-outputs request), its
# string field holding the passage the task asks for, so prompt lookup still finds the copy.
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SCHEMA_ASK = ' Answer with a JSON object whose "text" field holds the whole result.'


# The runs compared (speculating, baseline), where both ran.
PAIRS = (("on", "off"), ("on_eager", "off_eager"), ("on", "off_eager"), ("on_rowwise", "off"),
         ("on", "on_rowwise"), ("on_fixed", "off"), ("on", "on_fixed"), ("on_nochain", "off"),
         ("on", "on_nochain"), ("on_noplain", "off"), ("on", "on_noplain"))


RUNS = ("off", "on", "off_eager", "on_eager", "on_rowwise", "on_fixed", "on_nochain", "on_noplain")


def _run_name(name: str) -> str:
    """A `--runs` name: one of `RUNS` or on_rowsN."""
    if name in RUNS or (name.startswith("on_rows") and name[len("on_rows"):].isdigit()):
        return name
    raise argparse.ArgumentTypeError(f"{name!r} is not a run: {', '.join(RUNS)} or on_rowsN")


def _pairs(runs) -> tuple:
    """`PAIRS`, and each `on_rowsN` run against `off` and against `on`."""
    rows = tuple((name, base) for name in runs if name.startswith("on_rows") for base in ("off", "on"))
    return PAIRS + rows


def kind_params(kind: str) -> dict:
    """`--kind`: bench/throughput.py's request kind (`SAMPLING_KINDS`), seeded wherever it
    samples so a run reproduces (speculation draws a seeded request's own numbers)."""
    params = dict(SAMPLING_KINDS[kind])
    if params.get("temperature", 1.0) > 0:
        params["seed"] = 0
    return params


def conversations(n: int, chars: int) -> list[list[dict]]:
    """n chat prompts: passages of the novel with a rewrite / correct / repeat task, every
    fourth a code edit of one of this repository's files."""
    text = (ROOT / "tests/data/pride_and_prejudice_ch1-2.txt").read_text().split("\n", 2)[2]
    out = []
    for i in range(n):
        if i % 4 == 3:
            code = (ROOT / CODE_FILES[i // 4 % len(CODE_FILES)]).read_text()
            out.append([{"role": "user", "content": f"{CODE_TASK}\n\n```python\n{code[:chars]}\n```"}])
            continue
        start = (i * 997) % max(1, len(text) - chars)
        start = text.find("\n\n", start) + 2 if text.find("\n\n", start) >= 0 else 0
        out.append([{"role": "user", "content": f"{TASKS[i % len(TASKS)]}\n\n{text[start:start + chars]}"}])
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--input-chars", type=int, default=4000, help="passage length (~4 chars a token)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds at the largest batch size, each over the next conversations; a "
                         "smaller batch decodes the same conversations in more rounds (batch 1 at "
                         "256 tokens is ~0.1 s on an H200: one round is mostly noise)")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup", type=int, nargs=2, default=[3, 4], metavar=("MIN", "MAX"),
                    help="prompt_lookup_min / _max (the engine's defaults)")
    ap.add_argument("--method", choices=["ngram", "draft_model"], default="ngram")
    ap.add_argument("--draft-model", default=None, help="the draft (model path or embedded name) "
                    "for --method draft_model; default: the target itself")
    ap.add_argument("--load-format", default="auto", help="auto or dummy (target and draft)")
    ap.add_argument("--disable-by-batch-size", type=int, default=None,
                    help="speculative_config.disable_by_batch_size (no proposals in steps with this "
                         "many running requests or more): run several batch sizes to find where it pays")
    ap.add_argument("--adaptive", default="on", choices=["on", "off"],
                    help="speculative_config.adaptive: on (the default) speculates only where it measured "
                         "it to pay; off speculates in every step (what verification alone gives)")
    ap.add_argument("--runs", nargs="+", default=["off", "on"],
                    type=_run_name,
                    help="on_rowwise: speculation on, but a verify step's decode rows each read "
                         "their own KV (INFER_CLUSTER_VERIFY_RUNS=0), the A/B of reading a "
                         "request's KV once per chunk of its rows; on_fixed: every step speculates "
                         "(adaptive off), the A/B of the governor; on_nochain: no chained verify "
                         "steps (INFER_CLUSTER_SPEC_CHAIN=0: the host proposes and schedules every "
                         "verify step after the one before is collected); on_noplain: chains start "
                         "after host-scheduled verify steps only (INFER_CLUSTER_SPEC_CHAIN_PLAIN=0), "
                         "never from a plain step; on_rowsN (e.g. on_rows128): "
                         "verify steps run as decode steps up to N positions "
                         "(INFER_CLUSTER_VERIFY_MAX_ROWS, 48 by default), so a row gets up to "
                         "N // batch - 1 proposals")
    ap.add_argument("--interleave", default="on", choices=["on", "off"],
                    help="on: build every run's engine first, then alternate them round by round "
                         "(a drift of the host's speed, which moved batch-1 TPOT by up to 45%% "
                         "within one H200 call, falls on every run alike; the engines share "
                         "--gpu-memory-utilization equally); off: one engine after another")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="at most the draft's positions (a small draft may reach fewer than the target)")
    ap.add_argument("--schema", action="store_true",
                    help="every request under a JSON schema (structured outputs): prompt lookup proposes "
                         "within the grammar, each proposed position masked")
    ap.add_argument("--graph-max-tokens", type=int, default=None,
                    help="EngineConfig.graph_max_tokens for every engine (a batch-8 round's ~9k prompt "
                         "tokens pass 2,048, the default, and run eagerly)")
    ap.add_argument("--kind", default="greedy", choices=list(SAMPLING_KINDS),
                    help="the requests' sampling: bench/throughput.py's request kinds, seeded where "
                         "they sample")
    ap.add_argument("--step-log", action="store_true",
                    help="record every step's start and kind (prompt, host-scheduled verify, chained "
                         "verify, plain) and print, per run and batch size, each kind's steps and ms "
                         "a step and when a round's first (decode) step started (bench/step_log.py)")
    ap.add_argument("--out", default="bench/results/spec_decode.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.protocol import SamplingParams

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    if args.method == "draft_model":
        spec = {"method": "draft_model", "num_speculative_tokens": args.k,
                "model": args.draft_model or args.model}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": args.k,
                "prompt_lookup_min": args.lookup[0], "prompt_lookup_max": args.lookup[1]}
    if args.disable_by_batch_size is not None:
        spec["disable_by_batch_size"] = args.disable_by_batch_size
    spec["adaptive"] = args.adaptive == "on"
    eager = {"enforce_eager": True, "async_scheduling": False}
    modes = {"off": {}, "off_eager": eager, "on": {"speculative_config": spec},
             "on_eager": {**eager, "speculative_config": spec},
             # verify rows each read their own KV (the A/B of `row_span` runs)
             "on_rowwise": {"speculative_config": spec, "_env": {"INFER_CLUSTER_VERIFY_RUNS": "0"}},
             # every step speculates (the governor's A/B)
             "on_fixed": {"speculative_config": {**spec, "adaptive": False}},
             # every verify step proposed and scheduled by the host (the chain's A/B)
             "on_nochain": {"speculative_config": spec, "_env": {"INFER_CLUSTER_SPEC_CHAIN": "0"}},
             # chains start after host-scheduled verify steps only (the A/B of starting them
             # from a plain step)
             "on_noplain": {"speculative_config": spec, "_env": {"INFER_CLUSTER_SPEC_CHAIN_PLAIN": "0"}}}
    for name in args.runs:  # on_rowsN: verify steps run as decode steps up to N positions
        if name.startswith("on_rows"):
            modes[name] = {"speculative_config": spec,
                           "_env": {"INFER_CLUSTER_VERIFY_MAX_ROWS": name[len("on_rows"):]}}
    convs = conversations(max(args.batch) * args.rounds, args.input_chars)
    params = SamplingParams(max_tokens=args.output_len, **kind_params(args.kind),
                            structured_outputs={"json": SCHEMA} if args.schema else None)
    if args.schema:  # the tasks ask for the JSON object too
        for conv in convs:
            task, _, body = conv[-1]["content"].partition("\n\n")
            conv[-1]["content"] = f"{task}{SCHEMA_ASK}\n\n{body}"
    if args.interleave == "on" and len(args.runs) > 1:
        results, outputs, paired = _interleaved(args, modes, convs, params, sync)
    else:
        (results, outputs), paired = _one_after_another(args, modes, convs, params, sync), {}
    identical = all(outputs[(name, b)] == outputs[(args.runs[0], b)] for name in args.runs for b in args.batch)
    agreement = {name: {b: _agreement(outputs[(name, b)], outputs[(args.runs[0], b)]) for b in args.batch}
                 for name in args.runs[1:]}
    ratios = {}
    for on, base in _pairs(args.runs):
        if on in results and base in results:
            ratios[f"{on}/{base}"] = {b: results[on][b]["tokens_per_s"] / results[base][b]["tokens_per_s"]
                                      for b in args.batch}
    print(f"{args.kind} outputs identical across runs: {identical}; agreement with {args.runs[0]}: {agreement}")
    for key, by_batch in ratios.items():
        print(f"{key}: " + ", ".join(f"batch {b} {r:.2f}x" for b, r in by_batch.items()))
    for key, by_batch in paired.items():
        print(f"{key} per round (min / median / max): " + ", ".join(
            f"batch {b} {min(r):.2f} / {sorted(r)[len(r) // 2]:.2f} / {max(r):.2f}" for b, r in by_batch.items()))
    result = {**run_info(), "model": args.model, "kind": args.kind, "graph_max_tokens": args.graph_max_tokens, "load_format": args.load_format, "speculative_config": spec, "batch": args.batch,
              "input_chars": args.input_chars, "schema": SCHEMA if args.schema else None, "output_len": args.output_len, "rounds": args.rounds,
              "interleave": args.interleave == "on" and len(args.runs) > 1, "runs": results,
              "ratios": ratios, "ratios_per_round": paired, "identical": identical, "agreement": agreement}
    write_json(args.out, json.loads(json.dumps(result)))  # int batch keys become strings
    return result


def _engine(args, mode: dict, share: float, convs: list):
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM
    mode = dict(mode)
    with mock.patch.dict(os.environ, mode.pop("_env", {})):  # read while the engine is built
        graphs = {} if args.graph_max_tokens is None else {"graph_max_tokens": args.graph_max_tokens}
        llm = LLM(args.model, device=args.device, dtype=args.dtype, load_format=args.load_format,
                  gpu_memory_utilization=share, max_model_len=args.max_model_len, **graphs, **mode)
    # warm-up; with --schema under the schema too, so no run's first request compiles it
    llm.chat(convs[:1], SamplingParams(temperature=0, max_tokens=8, structured_outputs=(
        {"json": SCHEMA} if args.schema else None)), use_tqdm=False)
    return llm


def _row(outs: list, seconds: float, b: int, before: dict, after: dict) -> dict:
    """tokens, seconds, tokens/s, prompt tokens, batch-1 TPOT and TTFT (from the request
    metrics) and the acceptance of a set of outputs."""
    tokens = sum(len(o.token_ids) for o in outs)
    row = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs)}
    if b == 1:
        tpots = [(o.metrics.finish_time - o.metrics.first_token_time) / (len(o.token_ids) - 1)
                 for o in outs if o.metrics is not None and o.metrics.finish_time
                 and o.metrics.first_token_time and len(o.token_ids) > 1]
        if tpots:
            row["tpot_ms"] = sum(tpots) / len(tpots) * 1e3
        # the rest of a request's time: its prefill and first token (a ~1k-token prompt)
        ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs
                 if o.metrics is not None and o.metrics.first_token_time]
        if ttfts:
            row["ttft_ms"] = sum(ttfts) / len(ttfts) * 1e3
    drafts = after["num_spec_draft_tokens"] - before["num_spec_draft_tokens"]
    if drafts:
        row["acceptance"] = (after["num_spec_accepted_tokens"] - before["num_spec_accepted_tokens"]) / drafts
    return row


def _print_row(name: str, b: int, row: dict) -> None:
    print(f"{name:>9} batch {b:>2}: {row['tokens']} tokens in {row['seconds']:.2f} s = "
          f"{row['tokens_per_s']:.1f} tok/s" + (f", TPOT {row['tpot_ms']:.2f} ms" if "tpot_ms" in row else "")
          + (f", TTFT {row['ttft_ms']:.1f} ms" if "ttft_ms" in row else "")
          + (f", acceptance {row['acceptance']:.2f}" if "acceptance" in row else ""))
    steps = row.get("steps")
    if steps:  # --step-log
        kinds = ", ".join(f"{k} {v['steps']} x {v['ms_each']:.2f} ms" for k, v in steps.items() if isinstance(v, dict))
        print(f"{name:>9} batch {b:>2} steps: {kinds}; a round's first step at {steps['first_step_ms']} ms, "
              f"first decode step at {steps['first_decode_ms']} ms")


def _finish_run(name: str, llm, run: dict) -> None:
    if name.startswith("on"):
        run["acceptance_per_position"] = llm.stats()["spec_acceptance_per_position"]
        run["chained_steps"] = llm.stats()["num_spec_chained_steps"]
        print(f"{name:>9} chained verify steps: {run['chained_steps']}")
        governor = llm.engine.spec_decoder.governor
        if governor is not None:  # adaptive: what it measured, per batch-size bucket
            run["governor"] = governor.as_dict()
            print(f"{name:>9} governor estimates: {run['governor']}")
    run["phase_seconds"] = llm.engine.phase_seconds  # the host's step phases, every batch together
    print(f"{name:>9} step phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in run["phase_seconds"].items()))


def _interleaved(args, modes: dict, convs: list, params, sync):
    """Every run's engine at once, rounds alternating between them; also each round's ratio of
    "on" to "off" tokens/s (`paired`)."""
    # An engine sizes its KV pool from everything this process holds already (the engines built
    # before it included), so the i-th one is given i + 1 shares: the pools come out equal.
    share = args.gpu_memory_utilization / len(args.runs)
    engines = {name: _engine(args, modes[name], share * (i + 1), convs) for i, name in enumerate(args.runs)}
    logs = {name: StepLog(llm.engine) for name, llm in engines.items()} if args.step_log else {}
    results = {name: {} for name in args.runs}
    outputs, paired = {}, {}
    for b in args.batch:
        outs = {name: [] for name in args.runs}
        seconds = dict.fromkeys(args.runs, 0.0)
        before = {name: engines[name].stats() for name in args.runs}
        per_round = {name: [] for name in args.runs}
        for r in range(_rounds(args, b)):
            for name in (args.runs if r % 2 == 0 else args.runs[::-1]):  # neither always goes first
                sync()
                t = time.perf_counter()
                got = engines[name].chat(convs[r * b:(r + 1) * b], params, use_tqdm=False)
                sync()
                dt = time.perf_counter() - t
                if name in logs:
                    logs[name].round(t, t + dt)
                seconds[name] += dt
                outs[name] += got
                per_round[name].append(sum(len(o.token_ids) for o in got) / dt)
        for name in args.runs:
            row = _row(outs[name], seconds[name], b, before[name], engines[name].stats())
            if name in logs:
                row["steps"] = logs[name].summary()
            results[name][b] = row
            outputs[(name, b)] = [o.token_ids for o in outs[name]]
            _print_row(name, b, row)
        for on, base in _pairs(args.runs):
            if on in per_round and base in per_round:
                paired.setdefault(f"{on}/{base}", {})[b] = [x / y for x, y in zip(per_round[on], per_round[base])]
    for name, llm in engines.items():
        _finish_run(name, llm, results[name])
        if name in logs:
            logs[name].close()
        llm.close()
    return results, outputs, paired


def _rounds(args, batch: int) -> int:
    """Rounds at `batch`: every batch size decodes the same conversations (`--rounds` rounds of
    the largest batch), so a small batch's figure is not the luck of a few conversations' text
    (at batch 1, 12 rounds spread 1.01-3.27x a round on the H200, 2026-11-30)."""
    return args.rounds * max(args.batch) // batch


def _one_after_another(args, modes: dict, convs: list, params, sync) -> tuple[dict, dict]:
    """One engine at a time (all of --gpu-memory-utilization), every batch size, then the next."""
    import torch
    results, outputs = {}, {}
    for name in args.runs:
        llm = _engine(args, modes[name], args.gpu_memory_utilization, convs)
        log = StepLog(llm.engine) if args.step_log else None
        run = {}
        for b in args.batch:
            before = llm.stats()
            sync()
            t = time.perf_counter()
            outs = []
            for r in range(_rounds(args, b)):
                start = time.perf_counter()
                outs += llm.chat(convs[r * b:(r + 1) * b], params, use_tqdm=False)
                if log is not None:
                    sync()
                    log.round(start, time.perf_counter())
            sync()
            run[b] = _row(outs, time.perf_counter() - t, b, before, llm.stats())
            if log is not None:
                run[b]["steps"] = log.summary()
            outputs[(name, b)] = [o.token_ids for o in outs]
            _print_row(name, b, run[b])
        _finish_run(name, llm, run)
        results[name] = run
        llm.close()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results, outputs


def _agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """The mean share of each output before its first token that differs from `want`'s."""
    shares = []
    for a, b in zip(got, want):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shares.append(n / max(1, max(len(a), len(b))) if a != b else 1.0)
    return sum(shares) / max(1, len(shares))


if __name__ == "__main__":
    main()
