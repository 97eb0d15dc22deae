"""The speculation governor replayed offline at a batch size: rounds of `--batch` greedy requests
decode together, step by step, under the engine's own `SpecGovernor` and shadow rule, against
speculating in every step and against not speculating.

Why: on the H200 (930b717, SmolLM2, k = 15) batch 8 measured 1.23x of off with the governor and
1.42x speculating in every step in one call's interleaved rounds, while a per-step log of other
conversations had the governor's runs faster. A greedy request's tokens do not depend on
speculation, so from outputs made once (bench/spec_replay.py's `--outputs` file) the proposals,
what each verify step accepts and every decision of the governor replay exactly; only the step
costs are a model, and they come in as arguments.

Model: a round starts with every request past its prefill (its first token out). Each step the
governor decides from the simulated clock (`start_step(now, ...)`, `verified`, `shadowed`, as
the engine calls them); a speculating step proposes by prompt lookup for every decoding row
(at most `row_limit(k, batch)` a row and never past the output) and costs `verify_ms[rows]` if
any row got a proposal, else it runs as a plain step. A plain step costs `plain_ms[rows]`, plus
`switch_ms` right after a verify step (the async pipeline refills). Rows finish at the end of
their recorded output. Left out: prefill, the host's noise, and the sampled requests' law
(greedy only). The defaults are the H200's per-step medians at 930b717 (bench/RESULTS.md#
speculative-decoding): it ranks policies; the GPU benchmark (bench/spec_decode.py --runs off on
on_fixed) measures them.

    python bench/spec_replay_batch.py --outputs FILE.json --batch 8        # saved outputs
    python bench/spec_replay_batch.py --outputs FILE.json --batch 1 2 4 8 --k 15
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import run_info, write_json  # noqa: E402

# H200, 930b717, SmolLM2 at ~1.3k-token contexts, greedy (the governor's run of the per-step
# log; ms by rows, the median gap between two step starts)
PLAIN_MS = {1: 0.60, 2: 0.68, 3: 1.0, 4: 0.95, 5: 0.98, 6: 0.99, 7: 1.04, 8: 1.0}
VERIFY_MS = {1: 1.34, 2: 1.53, 3: 1.56, 4: 1.48, 5: 1.68, 6: 1.60, 7: 1.67, 8: 1.70}
SWITCH_MS = 0.3
MODES = ("off", "fixed", "governor")


class ReplayRequest:
    """What the governor's shadow reads of a request (`num_tokens`, `all_token_ids`,
    `is_finished`), over a recorded output, and its prompt-lookup index."""

    def __init__(self, prompt: list[int], output: list[int], min_n: int, max_n: int):
        from infer_cluster.worker.spec_decode.ngram import NgramIndex

        self.output = output
        self.all_token_ids = list(prompt) + list(output[:1])
        self.done = min(1, len(output))  # output tokens out (the prefill gave the first)
        self.index = NgramIndex(min_n, max_n)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.done >= len(self.output)

    def proposals(self, limit: int) -> list[int]:
        room = min(limit, len(self.output) - self.done - 1)
        return self.index.propose(self.all_token_ids, room) if room > 0 else []

    def advance(self, n: int) -> None:
        self.all_token_ids.extend(self.output[self.done:self.done + n])
        self.done += n


def _cost(table: dict, rows: int) -> float:
    return table[rows] if rows in table else table[max(k for k in table if k <= rows)]


def replay_round(data: list[dict], mode: str, k: int, min_n: int, max_n: int,
                 plain_ms: dict, verify_ms: dict, switch_ms: float) -> dict:
    """One round: `data`'s requests decoded together under `mode` ("off", "fixed": speculate
    in every step, "governor": as the engine's `adaptive`). Milliseconds, tokens, steps."""
    from infer_cluster.worker.spec_decode.governor import SpecGovernor
    from infer_cluster.worker.spec_decode.ngram import row_limit
    from infer_cluster.worker.spec_decode.shadow import ShadowAcceptance
    from infer_cluster.worker.spec_decode.verify import num_accepted

    reqs = [ReplayRequest(d["prompt"], d["output"], min_n, max_n) for d in data]
    governor: Optional[SpecGovernor] = None
    shadow: Optional[ShadowAcceptance] = None
    if mode == "governor":
        governor = SpecGovernor(lambda batch: row_limit(k, batch) + 1)
        shadow = ShadowAcceptance(lambda req, batch: req.proposals(row_limit(k, batch)))
    now = 0.0
    tokens = plain = verify = 0
    last_verified = False
    while True:
        running = [r for r in reqs if not r.is_finished]
        if not running:
            break
        rows = len(running)
        speculating = mode == "fixed" or (governor is not None and governor.decide(rows, True))
        drafts = {}
        if speculating:
            limit = row_limit(k, rows)
            drafts = {id(r): r.proposals(limit) for r in running}
        elif shadow is not None and governor.wants_shadow(rows):
            got = shadow.step(running)
            if got is not None:
                governor.shadowed(rows, got)
        if governor is not None:
            governor.start_step(now / 1e3, rows, speculating, True)
        if any(drafts.values()):
            gave = []
            for r in running:
                d = drafts[id(r)]
                n = min(num_accepted(d, r.output[r.done:]) + 1, len(r.output) - r.done)
                r.advance(n)
                gave.append(n)
            if governor is not None:
                governor.verified(sum(gave) / len(gave))
            now += _cost(verify_ms, rows)
            tokens += sum(gave)
            verify += 1
            last_verified = True
        else:
            for r in running:
                r.advance(1)
            now += _cost(plain_ms, rows) + (switch_ms if last_verified else 0.0)
            tokens += rows
            plain += 1
            last_verified = False
    return {"ms": now, "tokens": tokens, "plain_steps": plain, "verify_steps": verify}


def replay_batches(data: list[dict], batch: int, k: int, min_n: int, max_n: int,
                   plain_ms: dict, verify_ms: dict, switch_ms: float) -> dict:
    """Every mode over `data` in rounds of `batch` requests (a last short round dropped):
    per mode the summed ms, tokens and steps, and each mode's speedup over off."""
    rounds = [data[i:i + batch] for i in range(0, len(data) - batch + 1, batch)]
    out = {}
    for mode in MODES:
        per_round = [replay_round(r, mode, k, min_n, max_n, plain_ms, verify_ms, switch_ms) for r in rounds]
        out[mode] = {key: sum(p[key] for p in per_round) for key in per_round[0]} if per_round else {}
        out[mode]["per_round_ms"] = [p["ms"] for p in per_round]
    for mode in MODES[1:]:
        if out[mode].get("ms"):
            out[mode]["speedup"] = out["off"]["ms"] / out[mode]["ms"]
    return out


def _table(text: Optional[str], default: dict) -> dict:
    """`--plain-ms 1=0.6,8=1.0`: ms by rows (a batch between two keys takes the lower one)."""
    if not text:
        return default
    return {int(a): float(b) for a, b in (kv.split("=") for kv in text.split(","))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outputs", required=True,
                    help="greedy outputs saved by bench/spec_replay.py --outputs FILE")
    ap.add_argument("--batch", type=int, nargs="+", default=[8])
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--lookup", default="3-4", help="MIN-MAX prompt lookup window")
    ap.add_argument("--plain-ms", default=None, help="ms by rows, e.g. 1=0.6,2=0.68,8=1.0")
    ap.add_argument("--verify-ms", default=None, help="ms by rows, e.g. 1=1.34,8=1.7")
    ap.add_argument("--switch-ms", type=float, default=SWITCH_MS,
                    help="added to a plain step right after a verify step")
    ap.add_argument("--out", default="bench/results/spec_replay_batch.json")
    args = ap.parse_args(argv)

    data = json.loads(Path(args.outputs).read_text())
    lo, hi = (int(x) for x in args.lookup.split("-"))
    plain_ms, verify_ms = _table(args.plain_ms, PLAIN_MS), _table(args.verify_ms, VERIFY_MS)
    results = {}
    for b in args.batch:
        r = results[b] = replay_batches(data, b, args.k, lo, hi, plain_ms, verify_ms, args.switch_ms)
        print(f"batch {b}: " + "; ".join(
            f"{m} {r[m]['ms']:.0f} ms, {r[m]['plain_steps']} plain / {r[m]['verify_steps']} verify steps"
            + (f", {r[m]['speedup']:.2f}x" if "speedup" in r[m] else "") for m in MODES if r[m]), flush=True)
    result = {**run_info(), "outputs": args.outputs, "k": args.k, "lookup": args.lookup,
              "plain_ms": plain_ms, "verify_ms": verify_ms, "switch_ms": args.switch_ms,
              "results": results}
    write_json(args.out, json.loads(json.dumps(result)))
    return result


if __name__ == "__main__":
    main()
