"""Workload A's output tok/s as a share of the roofline, per layout and request kind: one PNG.

Owns: reading the headline figures (docs/figures/headline.json: each figure with its value,
unit, device, date, commit and the bench/RESULTS.md anchor it comes from), reading fresh results
(`--results DIR`: the JSON of bench/throughput.py, bench/dp_scaling.py and bench/roofline.py,
which replace the headline figure of the same device, model shape, layout and kind), the shares,
one table on stdout and the chart (matplotlib, Agg backend: one panel per device and model shape,
a group of bars per layout, a bar per request kind).

The roofline is bench/roofline.py's one-GPU ceiling for workload A on that device and model shape
(decode at the measured copy bandwidth, prefill at the measured bf16 matmul rate). A layout on N
GPUs (T=2, P=2, DP=2) is read against N times it: each splits the weight and KV bytes, or the
requests, over N GPUs. Fresh results count only for workload A itself (256 requests, prompt and
output lengths uniform in [100, 1024], bf16 KV cache); others in DIR are passed over.

    pip install -e '.[bench]'        # matplotlib
    python bench/chart.py [--results bench/results] [--out docs/figures/throughput.png]

To add a layout or a kind: nothing here; give the figure its `layout` / `kind` in the headline
JSON (or run it), and LAYOUT_ORDER / KIND_ORDER only decide where it is drawn.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADLINE = os.path.join(ROOT, "docs", "figures", "headline.json")
OUT = os.path.join(ROOT, "docs", "figures", "throughput.png")
KIND_ORDER = ("greedy", "sampled", "penalties", "logprobs", "top_p")
LAYOUT_ORDER = ("T", "P", "DP")  # then by GPU count
MODEL_NAMES = {"qwen3-0.6b-shape": "Qwen3-0.6B shape", "llama-3-8b-shape": "Llama-3-8B shape"}
WORKLOAD_A = {"num_seqs": 256, "prompt_len": [100, 1024], "output_len": [100, 1024]}


def device_short(name: str | None) -> str | None:
    """"NVIDIA H100 80GB HBM3" -> "H100"; a name without such a model number stays whole."""
    if not name:
        return None
    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    return m.group(1) if m else name


def layout_name(tp: int, pp: int) -> str:
    if tp == 1 and pp == 1:
        return "T=1"
    if pp == 1:
        return f"T={tp}"
    if tp == 1:
        return f"P={pp}"
    return f"T={tp} P={pp}"


def _key(fig: dict) -> tuple:
    return (fig["bench"], fig["device"], fig["model"], fig.get("layout"), fig.get("kind"))


def load_headline(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["figures"]


def _is_workload_a(w: dict | None) -> bool:
    """Workload A itself: its sizes and the benchmark's own lengths (seed 0; a JSON without a
    seed predates `--seed`), not a held-out seed's."""
    return (w is not None and {k: v for k, v in w.items() if k != "seed"} == WORKLOAD_A
            and w.get("seed", 0) == 0)


def _from_throughput(d: dict) -> list[dict]:
    if not _is_workload_a(d.get("workload")) or d.get("layout", {}).get("kv_cache_dtype", "auto") != "auto":
        return []
    run, lay = d.get("run", {}), d.get("layout", {})
    tp, pp = lay.get("tensor_parallel_size", 1), lay.get("pipeline_parallel_size", 1)
    return [{"bench": "throughput", "device": device_short(run.get("device_name")), "gpus": tp * pp,
             "model": d["model"], "layout": layout_name(tp, pp), "kind": kind,
             "value": r["tokens_per_s"], "unit": "tok/s", "date": run.get("date"),
             "commit": run.get("commit"), "anchor": None}
            for kind, r in d.get("ours", {}).get("sampling", {}).items()]


def _from_dp_scaling(d: dict) -> list[dict]:
    w, run = d.get("workload", {}), d.get("run", {})
    if not (w.get("per_replica") and w.get("num_requests") == 256
            and w.get("input_len") == w.get("output_len") == "100:1024"):
        return []
    args = w.get("serve_args", [])
    model = args[args.index("--model") + 1] if "--model" in args[:-1] else None
    return [{"bench": "throughput", "device": device_short(run.get("device_name")), "gpus": r["dp"],
             "model": model, "layout": f"DP={r['dp']}", "kind": "greedy",
             "value": r["output_tokens_per_s"], "unit": "tok/s", "date": run.get("date"),
             "commit": run.get("commit"), "anchor": None}
            for r in d.get("runs", []) if r.get("dp", 1) > 1 and model]


def _from_roofline(d: dict) -> list[dict]:
    w = d.get("workload")
    if (w is not None and not _is_workload_a(w)) or d.get("kv_cache_dtype", "auto") != "auto":
        return []  # the chart's shares are of workload A's bf16-cache ceiling
    run = d.get("run", {})
    device = device_short(run.get("device_name") or d.get("device", {}).get("device"))
    return [{"bench": "roofline", "device": device, "gpus": 1, "model": d["model"],
             "value": d["ceiling_tokens_per_s"], "unit": "tok/s", "date": run.get("date"),
             "commit": run.get("commit"), "anchor": None}]


def figures_from_results(folder: str) -> list[dict]:
    """Workload-A figures of the bench JSON files in `folder` (others and unreadable files skipped)."""
    readers = {"throughput": _from_throughput, "dp_scaling": _from_dp_scaling, "roofline": _from_roofline}
    figs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path) as f:
                d = json.load(f)
            reader = readers.get(d.get("bench")) if isinstance(d, dict) else None
            found = reader(d) if reader else []
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        figs += [fig for fig in found if fig["device"] and fig["device"] != "cpu"]
    return figs


def merge(headline: list[dict], fresh: list[dict]) -> list[dict]:
    """The headline figures with each fresh figure replacing the one of the same key."""
    by_key = {_key(f): f for f in headline}
    by_key.update({_key(f): f for f in fresh})
    return list(by_key.values())


def _layout_sort(layout: str) -> tuple:
    kind, _, n = layout.partition("=")
    return (LAYOUT_ORDER.index(kind) if kind in LAYOUT_ORDER else len(LAYOUT_ORDER),
            int(n) if n.isdigit() else 0, layout)


def _kind_sort(kind: str) -> tuple:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def shares(figures: list[dict]) -> dict:
    """{(device, model): {"roofline": figure, "rows": [(layout, kind, share, figure), ...]}} for every
    throughput figure whose device and model have a roofline."""
    roof = {(f["device"], f["model"]): f for f in figures if f["bench"] == "roofline"}
    panels: dict = {}
    for f in figures:
        r = roof.get((f["device"], f["model"]))
        if f["bench"] != "throughput" or r is None:
            continue
        panel = panels.setdefault((f["device"], f["model"]), {"roofline": r, "rows": []})
        panel["rows"].append((f["layout"], f["kind"], f["value"] / (r["value"] * f["gpus"]), f))
    for panel in panels.values():
        panel["rows"].sort(key=lambda row: (_layout_sort(row[0]), _kind_sort(row[1])))
    return panels  # panels in the order the figures first name their device and model


def print_table(panels: dict) -> None:
    print(f"{'device':<7}{'model':<18}{'layout':<7}{'kind':<10}{'tok/s':>10}{'roofline':>10}"
          f"{'share':>7}  {'commit':<8} date")
    for (device, model), panel in panels.items():
        for layout, kind, share, f in panel["rows"]:
            ceiling = panel["roofline"]["value"] * f["gpus"]
            print(f"{device:<7}{model:<18}{layout:<7}{kind:<10}{f['value']:>10,.0f}{ceiling:>10,.0f}"
                  f"{share:>7.0%}  {f.get('commit') or '-':<8} {f.get('date') or '-'}")


def draw(panels: dict, out: str) -> str:
    """Writes the chart of `panels` (from `shares`) to `out` as PNG; returns `out`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("no throughput figure has a roofline for its device and model")
    kinds = sorted({row[1] for p in panels.values() for row in p["rows"]}, key=_kind_sort)
    colors = dict(zip(kinds, ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")))
    groups = [sorted({row[0] for row in p["rows"]}, key=_layout_sort) for p in panels.values()]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.5 * sum(len(g) + 0.7 for g in groups) + 0.8, 3.3),
                             sharey=True, squeeze=False,
                             gridspec_kw={"width_ratios": [len(g) + 0.7 for g in groups]})
    top = max(1.0, max(row[2] for p in panels.values() for row in p["rows"]) * 1.12)
    width = 0.8 / len(kinds)
    for ax, layouts, ((device, model), panel) in zip(axes[0], groups, panels.items()):
        for i, layout in enumerate(layouts):
            rows = [row for row in panel["rows"] if row[0] == layout]  # in kind order, centred on i
            for j, (_, kind, share, _) in enumerate(rows):
                x = i + (j - (len(rows) - 1) / 2) * width
                ax.bar(x, share, width * 0.92, color=colors[kind])
                ax.text(x, share + top * 0.01, f"{share:.0%}", ha="center", va="bottom", fontsize=6)
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(layouts)), layouts)
        ax.set_xlim(-0.6, len(layouts) - 0.4)
        ax.set_ylim(0, top)
        roof = panel["roofline"]
        ax.set_title(f"{device}, {MODEL_NAMES.get(model, model)}\nroofline {roof['value']:,.0f} tok/s a GPU",
                     fontsize=8.5)
        ax.tick_params(labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0][0].yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    axes[0][0].set_ylabel("output tok/s / roofline", fontsize=8.5)
    handles = [matplotlib.patches.Patch(color=colors[k], label=k) for k in kinds]
    fig.suptitle("Workload A: output tok/s as a share of the roofline (dashed: 100%)", fontsize=10,
                 y=0.985)
    fig.legend(handles=handles, loc="upper center", ncol=len(kinds), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.93))
    dates = sorted({row[3].get("date") for p in panels.values() for row in p["rows"] if row[3].get("date")})
    span = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "")
    fig.text(0.01, 0.01, f"Measured {span}; figures, commits and sources: docs/figures/headline.json "
             "(bench/RESULTS.md). A layout on N GPUs is read against N x the one-GPU roofline "
             "(bench/roofline.py).", fontsize=6, color="0.3")
    fig.tight_layout(rect=(0, 0.05, 1, 0.9))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headline", default=HEADLINE, help="checked-in headline figures (JSON)")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="fresh bench JSON to merge over the headline figures (e.g. bench/results)")
    ap.add_argument("--out", default=OUT, help="PNG to write")
    args = ap.parse_args(argv)
    figures = load_headline(args.headline)
    if args.results:
        fresh = figures_from_results(args.results)
        print(f"{len(fresh)} fresh figures from {args.results}")
        figures = merge(figures, fresh)
    panels = shares(figures)
    print_table(panels)
    print(f"wrote {draw(panels, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
