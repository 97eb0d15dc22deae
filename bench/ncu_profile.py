"""One kernel launch under Nsight Compute's hardware counters, summarised: where its warps stall,
by instruction and opcode, against the throughput and occupancy it reached.

Owns: running `ncu` (full section set, source counters, clocks left alone) on the first launch of a
kernel after `--skip` others in any command, and the summary of the report (`summarize`):
duration, DRAM throughput, issue-slot use, registers, shared memory and resident warps, the warp
stall reasons, stall samples and executed instructions by opcode, shared-memory accesses with
bank conflicts, and the hottest instructions. Needs `ncu` (CUDA toolkit) and a machine whose
counters it may read; the parsing runs anywhere (tests/unit/test_ncu_profile.py).

  python bench/ncu_profile.py --kernel _decode_kernel --out DIR -- \\
      python3 bench/decode_grid.py --batch 256 --context 1024 --kv int8 --spread 0.9 \\
      --longest-first --iters 2 --reps 1 --out /tmp/g.json

Writes DIR/NAME.ncu-rep (open it in Nsight Compute), DIR/NAME.txt (the details page) and
DIR/NAME_sass.csv (per-instruction counters), and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import os
import re
import shutil
import subprocess
import sys

# Lines of the details page worth a glance, by their label.
DETAIL_LABELS = ("Duration", "DRAM Throughput", "L2 Cache Throughput", "L1/TEX Cache Throughput",
                 "Memory Throughput", "Issue Slots Busy",
                 "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit Registers",
                 "Block Limit Shared Mem", "Achieved Active Warps Per SM",
                 "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    cands = sorted(glob.glob("/usr/local/cuda*/bin/ncu") + glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return cands[-1] if cands else None


def details(text: str) -> dict[str, str]:
    """{label: "value unit"} for DETAIL_LABELS from an `ncu --page details` print (first match)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s+(.+?)\s{2,}(\S+(?:/\S+)?)?\s+([\d,.]+)\s*$", line)
        if m and m.group(1) in DETAIL_LABELS and m.group(1) not in out:
            out[m.group(1)] = f"{m.group(3)} {m.group(2) or ''}".strip()
    return out


def _num(row, key) -> float:
    try:
        return float(row.get(key) or 0)
    except ValueError:
        return 0.0


def _opcode(sass: str) -> str:
    parts = sass.split()
    op = parts[1] if parts and parts[0].startswith("@") and len(parts) > 1 else (parts[0] if parts else "")
    return op.split(".")[0]


def sass_rows(lines) -> list[dict]:
    """Rows of an `ncu --page source --csv --print-source sass` export (its first line names the
    kernel; the second is the header)."""
    reader = csv.reader(lines)
    rows = list(reader)
    header = next((r for r in rows if "Source" in r and "Address" in r), None)
    if header is None:
        raise ValueError("no SASS header (Address, Source, ...) in the source export")
    start = rows.index(header) + 1
    return [dict(zip(header, r)) for r in rows[start:] if len(r) == len(header)]


def summarize(rows: list[dict], top: int = 12) -> dict:
    """Stall reasons (share of samples), opcodes (share of samples, share of executed
    instructions), shared accesses with excess wavefronts, and the `top` hottest instructions."""
    total = sum(_num(r, SAMPLES) for r in rows) or 1.0
    executed = sum(_num(r, EXECUTED) for r in rows) or 1.0
    reasons = [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]
    stalls = {k[len("stall_"):]: sum(_num(r, k) for r in rows) / total for k in reasons}
    by_op, ex_op = collections.Counter(), collections.Counter()
    for r in rows:
        op = _opcode(r.get("Source", ""))
        by_op[op] += _num(r, SAMPLES) / total
        ex_op[op] += _num(r, EXECUTED) / executed
    conflicts = [dict(sass=r["Source"].strip(), executed=_num(r, EXECUTED),
                      wavefronts=_num(r, "L1 Wavefronts Shared"),
                      excess=_num(r, "L1 Wavefronts Shared Excessive"))
                 for r in rows if _num(r, "L1 Wavefronts Shared Excessive") > 0]
    hot = sorted(rows, key=lambda r: -_num(r, SAMPLES))[:top]
    return dict(
        samples=total,
        stalls=dict(sorted(stalls.items(), key=lambda kv: -kv[1])),
        opcodes=[(op, share, ex_op[op]) for op, share in by_op.most_common()],
        conflicts=conflicts,
        hot=[(r.get("Address", "")[-5:], r.get("Source", "").strip(), _num(r, SAMPLES) / total,
              max(reasons, key=lambda k: _num(r, k))[len("stall_"):] if reasons else "")
             for r in hot])


def print_summary(info: dict, summary: dict) -> None:
    for label in DETAIL_LABELS:
        if label in info:
            print(f"{label:<36}{info[label]}")
    print("warp stalls (share of samples):",
          ", ".join(f"{k} {v:.0%}" for k, v in list(summary["stalls"].items())[:8]))
    print(f"{'opcode':<10}{'stalls':>8}{'executed':>10}")
    for op, share, ex in summary["opcodes"][:15]:
        print(f"{op:<10}{share:>8.1%}{ex:>10.1%}")
    if summary["conflicts"]:
        excess = sum(c["excess"] for c in summary["conflicts"])
        waves = sum(c["wavefronts"] for c in summary["conflicts"])
        print(f"shared accesses with bank conflicts: {len(summary['conflicts'])} instructions, "
              f"{excess:.0f} of their {waves:.0f} wavefronts excess")
    print("hottest instructions:")
    for addr, sass, share, why in summary["hot"]:
        print(f"  {addr} {share:6.2%} {why:<16}{sass[:70]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", required=True, help="kernel name (a regex)")
    ap.add_argument("--skip", type=int, default=2, help="launches of the kernel to let pass first")
    ap.add_argument("--out", default="bench/results/ncu", help="folder for the report and exports")
    ap.add_argument("--name", default=None, help="file stem (default: the kernel name)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to profile")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to profile after --")
    ncu = find_ncu()
    if ncu is None:
        print("bench/ncu_profile.py: ncu not found (CUDA toolkit's Nsight Compute); nothing run")
        return 1
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name or re.sub(r"\W", "_", args.kernel))
    run = subprocess.run([ncu, "--clock-control", "none", "-k", f"regex:{args.kernel}",
                          "--launch-skip", str(args.skip), "--launch-count", "1", "--set", "full",
                          "--import-source", "yes", "-f", "-o", stem, *cmd],
                         capture_output=True, text=True, timeout=args.timeout)
    if not os.path.exists(stem + ".ncu-rep"):
        print(run.stdout[-2000:], run.stderr[-2000:], sep="\n")
        print(f"bench/ncu_profile.py: no report (ncu exit {run.returncode}); no launch of "
              f"{args.kernel!r} after {args.skip} skipped, or the counters are not readable here")
        return 1
    page = subprocess.run([ncu, "--import", stem + ".ncu-rep", "--page", "details"],
                          capture_output=True, text=True, check=True).stdout
    src = subprocess.run([ncu, "--import", stem + ".ncu-rep", "--page", "source", "--csv",
                          "--print-source", "sass"], capture_output=True, text=True, check=True).stdout
    with open(stem + ".txt", "w") as f:
        f.write(page)
    with open(stem + "_sass.csv", "w") as f:
        f.write(src)
    print_summary(details(page), summarize(sass_rows(src.splitlines())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
