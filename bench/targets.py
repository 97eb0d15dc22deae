"""Workload A's figures against their targets, from the JSON that `gpu_suite.sh targets` writes.

Reads, in DIR, `roofline_s{N}[_int8].json` and `wla_s{N}[_int8].json` for every seed N found
(bench/roofline.py and bench/throughput.py, each roofline run just before its workload in the
same call), and `decode_grid.json` (bench/decode_grid.py) if present, and prints one table:
per seed the bf16 and int8 rates, each against its own ceiling, the device's idle time between
steps (the host late; from `--step-timeline`), and int8 over bf16; then the
decode grid's share of copy bandwidth per batch, cache and context. The targets are issue 44's
(bf16 at 85% of its ceiling on every seed, int8 at 1.5x bf16, decode attention at 85% of copy
at batch 256); a figure below its target is marked. Plain Python; no GPU needed.

    python bench/targets.py bench/results
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

BF16_SHARE, INT8_RATIO, DECODE_SHARE = 0.85, 1.5, 0.85


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def rows(dirname: str) -> list[dict]:
    """One dict per seed: tok/s, ceiling and share for bf16 and int8 (None where absent)."""
    seeds = sorted({int(m.group(1)) for name in os.listdir(dirname)
                    if (m := re.fullmatch(r"wla_s(\d+)(?:_int8)?\.json", name))})
    out = []
    for seed in seeds:
        row = {"seed": seed}
        for kv, suffix in (("bf16", ""), ("int8", "_int8")):
            run = _load(os.path.join(dirname, f"wla_s{seed}{suffix}.json"))
            roof = _load(os.path.join(dirname, f"roofline_s{seed}{suffix}.json"))
            tps = run["ours"]["tokens_per_s"] if run else None
            ceiling = roof["ceiling_tokens_per_s"] if roof else None
            timeline = (run or {}).get("ours", {}).get("step_timeline") or {}
            row[kv] = {"tok_s": tps, "ceiling": ceiling,
                       "share": tps / ceiling if tps and ceiling else None,
                       # the device's wait for the host between steps (`--step-timeline`)
                       "idle_ms": timeline.get("gpu_idle_between_steps_ms"),
                       "commit": (run or {}).get("run", {}).get("commit")}
        b, i = row["bf16"]["tok_s"], row["int8"]["tok_s"]
        row["int8_over_bf16"] = i / b if b and i else None
        out.append(row)
    return out


def _fmt(x, pattern: str, target=None) -> str:
    if x is None:
        return "-"
    mark = " <" if target is not None and x < target else ""
    return pattern.format(x) + mark


def report(dirname: str) -> str:
    lines = [f"{'seed':>4} {'bf16 tok/s':>11} {'ceiling':>8} {'share':>8} {'idle ms':>8} {'int8 tok/s':>11} "
             f"{'ceiling':>8} {'share':>7} {'idle ms':>8} {'int8/bf16':>10}"]
    seeds = rows(dirname)
    for r in seeds:
        b, i = r["bf16"], r["int8"]
        lines.append(f"{r['seed']:>4} {_fmt(b['tok_s'], '{:,.0f}'):>11} {_fmt(b['ceiling'], '{:,.0f}'):>8} "
                     f"{_fmt(b['share'], '{:.1%}', BF16_SHARE):>8} {_fmt(b['idle_ms'], '{:.0f}'):>8} "
                     f"{_fmt(i['tok_s'], '{:,.0f}'):>11} {_fmt(i['ceiling'], '{:,.0f}'):>8} "
                     f"{_fmt(i['share'], '{:.1%}'):>7} {_fmt(i['idle_ms'], '{:.0f}'):>8} "
                     f"{_fmt(r['int8_over_bf16'], '{:.3f}x', INT8_RATIO):>10}")
    grid = _load(os.path.join(dirname, "decode_grid.json"))
    if grid:
        lines.append("decode attention, share of copy bandwidth (batch, cache: ~context tokens)")
        by: dict = {}
        for g in grid["rows"]:
            if g.get("of_copy") is not None:
                by.setdefault((g["batch"], g["kv"]), []).append((g["context"], g["of_copy"]))
        for (batch, kv), cells in sorted(by.items(), key=lambda kv_: (-kv_[0][0], kv_[0][1])):
            target = DECODE_SHARE if batch == 256 else None
            lines.append(f"  {batch:>4} {kv:>5}: " + "  ".join(
                f"{ctx}: {_fmt(share, '{:.0%}', target)}" for ctx, share in sorted(cells)))
    commits = sorted({r[kv]["commit"] for r in seeds for kv in ("bf16", "int8") if r[kv]["commit"]})
    lines.append(f"runs at commit {', '.join(commits) or '?'}")
    lines.append("'<' marks a figure below its target (bf16 85% of its ceiling, int8 1.5x bf16, "
                 "decode 85% of copy at batch 256)")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the directory `gpu_suite.sh targets` wrote its JSON into")
    args = ap.parse_args(argv)
    print(report(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
