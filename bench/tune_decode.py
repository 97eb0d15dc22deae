"""Decode attention tuner: times launch variants of `kernels.attention_triton.decode_attention`.

Owns: a sweep over `decode_attention(config=..., num_splits=...)` variants (tile tokens, warps,
pipeline stages, split count) on realistic paged decode batches (Qwen3-0.6B head shapes: 16 q /
8 KV heads, head_dim 128, page 16, pages shuffled across the cache), a check of every variant
against `paged_attention_ref` (bf16 tolerance, output poisoned with NaN first), the stages, the
CLI, and a table plus JSON. The batches, timers and check live in bench/tune_decode_cases.py;
this file decides what to run and ranks it. Times are CUDA-graph replays (each replay runs
`reps` back-to-back calls, rotating input copies so the batch-1 KV does not sit in L2), median of
`--iters` replays: that is how decode runs in the engine, without Python launch overhead. Final
rows also time one eager call between CUDA events, as bench/kernels.py does (host launch
overhead included). To add a stage A candidate, append to CONFIGS; a new case goes into
bench/tune_decode_cases.py.

Cases: b256 (lengths uniform in [100, 1100]), b32 (uniform in [2048, 6144]), b1 (12728 tokens),
with tight block tables (as wide as the longest sequence) and "graph-width" tables 2560 pages
wide (the engine's CUDA-graph buffers are sized for max_model_len 40960). A copy of the old
kernel module at .tune/attention_triton_base.py, if present, is timed as "baseline". Compiles
are spread over `--jobs` processes first (they share Triton's disk cache).

Stages: A, every config in CONFIGS at the split counts `split_candidates` gives; B, the split
rule (programs_per_sm, min_partition) for the config with the best geometric mean over the cases,
measured on both table widths; final, baseline vs the winner with its rule (graph and eager).
The winner goes to OUT/winner.json, which `--with-config` (or, for pytest,
PYTEST_PLUGINS=bench.tune_decode TUNE_DECODE_CONFIG=winner.json) applies as the default in-process,
so tests and bench/kernels.py can vet a candidate before it is written into DECODE_TUNED.

Usage: python3 bench/tune_decode.py [--out DIR] [--quick] [--final] [--jobs N] [--budget S]
       python3 bench/tune_decode.py --with-config winner.json --bench-kernels --only decode
  --final: no sweep; baseline vs the current defaults, both table widths, graph and eager.
  --smoke: CPU interpreter, tiny batches (checks this script, times meaningless).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]
sys.path.insert(0, _ROOT)

from bench import tune_decode_cases as tc  # noqa: E402
from bench.tune_decode_cases import (D, HK, PAGE, build_case, check, copy_bandwidth,  # noqa: E402
                                     make_cases, sync, time_eager, time_graph)

BASE_PATH = os.path.join(_ROOT, ".tune", "attention_triton_base.py")


def cfg(block_n, warps, stages):
    return dict(block_n=block_n, num_warps=warps, num_stages=stages)


# Stage A candidates: (tile tokens, warps, pipeline stages). The KV-head packing and tl.sum
# variants measured in 379bd37 lost everywhere and were removed (docs/kernels.md).
CONFIGS = [
    cfg(64, 4, 2), cfg(64, 4, 3), cfg(128, 4, 2), cfg(128, 8, 2), cfg(32, 4, 3), cfg(32, 2, 3),
    cfg(32, 4, 4), cfg(64, 8, 3), cfg(16, 2, 4), cfg(16, 4, 4), cfg(64, 4, 4), cfg(128, 4, 3),
]
QUICK = CONFIGS[:4]


def cfg_name(c):
    if c is None:
        return "default"
    if c == "baseline":
        return "baseline"
    return f"n{c['block_n']} w{c['num_warps']} s{c['num_stages']}"


def split_candidates(num_seqs, ctx_max):
    """Powers of two whose grids hold 256..8192 programs (plus 1 when >= 1024 without)."""
    base = num_seqs * HK
    out = [1] if base >= 1024 else []
    s = 2
    while s <= 256 and s * 16 <= ctx_max:
        if 256 <= base * s <= 8192:
            out.append(s)
        s *= 2
    return out or [1]


# ---------------------------------------------------------------------------------------------
# runners

def load_baseline():
    if not os.path.exists(BASE_PATH):
        return None
    spec = importlib.util.spec_from_file_location("attention_triton_base", BASE_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_fn(variant, splits, base_mod):
    """fn(batch, out) running one decode call into `out`."""
    from infer_cluster.kernels.attention_triton import decode_attention
    scale = D ** -0.5
    if variant == "baseline":
        def run(b, out):
            base_mod.decode_attention(*b, scale, out)
        return run

    def run(b, out):
        decode_attention(*b, scale, out, num_splits=splits, config=variant)
    return run


# ---------------------------------------------------------------------------------------------
# parallel warm compile

def _compile_worker(jobs):
    """Compile (config, splits) pairs on a tiny batch with the same head shapes and strides:
    the split-dependent and table-width arguments are not specialised, so the real runs hit
    Triton's disk cache."""
    import torch
    from infer_cluster.kernels.attention_triton import decode_attention
    torch.cuda.init()
    lens = [40, 300]
    case = build_case("warm", lens, 1, 0, "cuda", torch.bfloat16, seed=99)
    b = case["batches"][0]
    out = torch.empty_like(b[0])
    errors = []
    for config, splits in jobs:
        try:
            decode_attention(*b, D ** -0.5, out, num_splits=splits, config=config)
            torch.cuda.synchronize()
        except Exception as e:  # reported again (with the row) by the main process
            errors.append(f"{cfg_name(config)} S{splits}: {type(e).__name__}")
    return errors


def warm_compile(pairs, jobs):
    if jobs <= 1 or not pairs:
        return
    import multiprocessing as mp
    # One job per distinct compile: SPLIT on/off, and the reduce's BLOCK_S.
    seen, todo = set(), []
    for config, splits in pairs:
        key = (json.dumps(config, sort_keys=True), splits > 1,
               1 << max(0, (splits - 1).bit_length()))
        if key not in seen:
            seen.add(key)
            todo.append((config, splits))
    by_cfg = {}
    for config, splits in todo:  # a config's variants stay in one process (one decode compile)
        by_cfg.setdefault(json.dumps(config, sort_keys=True), []).append((config, splits))
    chunks = [[]for _ in range(jobs)]
    for i, group in enumerate(sorted(by_cfg.values(), key=len, reverse=True)):
        min(chunks, key=len).extend(group)
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(jobs) as pool:
            errs = [e for r in pool.map(_compile_worker, [c for c in chunks if c]) for e in r]
        print(f"# warm compile: {len(todo)} variants on {jobs} processes in "
              f"{time.time() - t0:.1f}s; {len(errs)} failed", flush=True)
    except Exception as e:  # fall back to compiling on first use
        print(f"# warm compile failed ({type(e).__name__}: {e}); compiling serially", flush=True)


# ---------------------------------------------------------------------------------------------

def run_row(rows, variant, splits, case, ref, base_mod, reps, iters, eager=False, stage=""):
    import torch
    row = dict(stage=stage, case=case["name"], config=cfg_name(variant), splits=splits,
               variant=variant if isinstance(variant, dict) else None)
    try:
        fn = make_fn(variant, splits, base_mod)
        row["max_err"], row["ok"] = check(fn, case, ref)
        outs = [torch.empty_like(b[0]) for b in case["batches"]]
        row["ms"], samples = time_graph(fn, case, outs, reps, iters)
        row["ms_spread"] = [min(samples), max(samples)]
        row["gbs"] = case["work"] / (row["ms"] * 1e-3) / 1e9
        if eager:
            row["ms_eager"] = time_eager(fn, case, outs, iters)
            row["gbs_eager"] = case["work"] / (row["ms_eager"] * 1e-3) / 1e9
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        sync()
    rows.append(row)
    print(fmt_row(row), flush=True)
    return row


def fmt_row(r):
    if "error" in r:
        return f"{r['case']:<20} {r['config']:<26} S{r['splits'] or '-':<4} ERROR {r['error']}"
    eager = f" eager {r['ms_eager']:.4f} ms {r['gbs_eager']:7.0f}" if "ms_eager" in r else ""
    return (f"{r['case']:<20} {r['config']:<26} S{str(r['splits'] or '-'):<4} {r['ms']:8.4f} ms "
            f"{r['gbs']:7.0f} GB/s  err {r['max_err']:.1e}{'' if r['ok'] else ' FAIL'}{eager}")


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def rule_splits(case, pps, min_partition, dev):
    import torch
    from infer_cluster.kernels.attention_triton import plan_decode_splits
    return plan_decode_splits(case["num_seqs"], HK, case["width"] * PAGE,
                              torch.device(dev), None, pps, min_partition)


def print_summary(rows, summary, elapsed, out_path):
    print("\n# summary (CUDA-graph replay; GB/s = KV + q + out bytes / time; eager = one call "
          "between events, as bench/kernels.py)")
    print(f"{'case':<20} {'config':<26} {'splits':>6} {'ms':>8} {'GB/s':>6} {'max err':>8} "
          f"{'eager ms':>9} {'GB/s':>6}")
    for r in rows:
        if r["stage"] == "final" and "error" not in r:
            print(f"{r['case']:<20} {r['config']:<26} {str(r['splits'] or 'rule'):>6} "
                  f"{r['ms']:8.4f} {r['gbs']:6.0f} {r['max_err']:8.1e} {r['ms_eager']:9.4f} "
                  f"{r['gbs_eager']:6.0f}")
    for k, v in summary["best_per_case"].items():
        print(f"best {k:<15} {v['config']:<26} {v['splits']:>6} {v['ms']:8.4f} {v['gbs']:6.0f}")
    for x in summary["ranking"][:8]:
        print(f"rank {x['config']:<26} geomean {x['geomean_gbs']:5.0f}  " + "  ".join(
            f"{k} S{v['splits']} {v['gbs']:.0f}" for k, v in x["per_case"].items()))
    fails = [r for r in rows if "error" in r or not r.get("ok", False)]
    print(f"# {len(rows)} rows, {len(fails)} failed/errored; {elapsed:.0f}s; wrote {out_path}")
    for r in fails[:8]:
        print("#  ", fmt_row(r)[:300])


def apply_tuned(path):
    """Make a winner.json config the CUDA half-precision default in this process (to validate
    a candidate with the unchanged tests and bench/kernels.py before it is committed)."""
    import infer_cluster.kernels.attention_triton as at
    with open(path) as f:
        at.DECODE_TUNED.update(json.load(f)["config"])
    print(f"# tune_decode: DECODE_TUNED = {at.DECODE_TUNED}", flush=True)


def pytest_configure(config):
    """As a pytest plugin (PYTEST_PLUGINS=bench.tune_decode, reaches xdist workers too):
    TUNE_DECODE_CONFIG=winner.json overrides the defaults for the test run."""
    if os.environ.get("TUNE_DECODE_CONFIG"):
        apply_tuned(os.environ["TUNE_DECODE_CONFIG"])



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="a handful of configs")
    ap.add_argument("--final", action="store_true", help="defaults vs baseline only")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the sweep stages")
    ap.add_argument("--with-config", help="winner.json to apply as the default (see apply_tuned)")
    ap.add_argument("--bench-kernels", nargs=argparse.REMAINDER,
                    help="run bench/kernels.py with these arguments instead of tuning")
    ap.add_argument("--smoke", action="store_true",
                    help="no CUDA needed: interpreter, tiny batches (checks the script only)")
    args = ap.parse_args(argv)

    global CONFIGS
    if args.with_config:
        apply_tuned(args.with_config)
    if args.bench_kernels is not None:
        import runpy
        sys.argv = [os.path.join(_ROOT, "bench", "kernels.py")] + args.bench_kernels
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        tc.SMOKE = True
        CONFIGS = [cfg(16, 4, 1), cfg(32, 4, 1)]
        args.iters, args.jobs = 2, 1
    import torch
    if not torch.cuda.is_available() and not tc.SMOKE:
        print("bench/tune_decode.py: no CUDA device; nothing to time.")
        return 0
    import triton
    dev = "cpu" if tc.SMOKE else "cuda"
    from infer_cluster.kernels.attention import paged_attention_ref
    from infer_cluster.kernels.attention_triton import decode_config
    t_start = time.time()
    dtype = torch.bfloat16
    base_mod = load_baseline()
    configs = [] if args.final else (QUICK if args.quick else CONFIGS)

    cases = make_cases(dev, dtype)
    refs = {c["key"]: paged_attention_ref(*c["batches"][0], D ** -0.5) for c in cases}
    reps = {"b256": 5, "b32": 5, "b1": 40}
    meta = dict(device="cpu (smoke)" if tc.SMOKE else torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, iters=args.iters, reps=reps,
                sms=0 if tc.SMOKE else torch.cuda.get_device_properties(0).multi_processor_count,
                copy_gbs=0.0 if tc.SMOKE else copy_bandwidth(),
                cases={c["key"]: dict(num_seqs=c["num_seqs"], ctx_total=c["ctx_total"],
                                      width=c["width"], bytes=c["work"]) for c in cases},
                default=decode_config(cases[0]["batches"][0][0]))
    print(f"# {meta['device']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"copy {meta['copy_gbs']:.0f} GB/s  default {meta['default']}", flush=True)
    for c in cases:
        print(f"# {c['key']}: {c['num_seqs']} seqs, ctx {c['ctx_total']}, width {c['width']}, "
              f"{c['work'] / 1e6:.1f} MB", flush=True)

    pairs = [(conf, s) for conf in configs for c in cases
             for s in split_candidates(c["num_seqs"], c["ctx_max"])]
    warm_compile(pairs, args.jobs)
    rows = []
    out_path = os.path.join(args.out, "tune_decode.json")
    os.makedirs(args.out, exist_ok=True)

    def save():
        with open(out_path, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)

    # Stage A: every config at its candidate split counts.
    for conf in configs:
        if time.time() - t_start > args.budget:
            print("# sweep budget spent; stopping stage A", flush=True)
            break
        for c in cases:
            for s in split_candidates(c["num_seqs"], c["ctx_max"]):
                run_row(rows, conf, s, c, refs[c["key"]], base_mod, reps[c["key"]],
                        args.iters, stage="A")
        save()

    # Summary: best per case, and the config with the best geometric mean of per-case bests.
    good = [r for r in rows if r["stage"] == "A" and "error" not in r and r["ok"]]
    best_case, per_cfg = {}, {}
    for r in good:
        if r["case"] not in best_case or r["gbs"] > best_case[r["case"]]["gbs"]:
            best_case[r["case"]] = r
        d = per_cfg.setdefault(r["config"], {})
        if r["case"] not in d or r["gbs"] > d[r["case"]]["gbs"]:
            d[r["case"]] = r
    ranked = sorted(((geomean([x["gbs"] for x in d.values()]), name, d)
                     for name, d in per_cfg.items() if len(d) == len(cases)), reverse=True)
    summary = dict(best_per_case={k: dict(config=v["config"], splits=v["splits"], gbs=v["gbs"],
                                          ms=v["ms"]) for k, v in best_case.items()},
                   ranking=[dict(config=n, geomean_gbs=g,
                                 per_case={k: dict(splits=v["splits"], gbs=v["gbs"], ms=v["ms"])
                                           for k, v in d.items()})
                            for g, n, d in ranked[:12]])
    meta["summary"] = summary
    save()

    # Stage B: the split rule for the winning config, on tight and graph-width tables.
    gcases = make_cases(dev, dtype, graph_width=True)
    winner = None
    if ranked:
        win = dict(next(iter(ranked[0][2].values()))["variant"])
        combos = [(pps, mp) for mp in (256, 128, 64) for pps in (1, 2, 4, 8, 16, 32)]
        measured = {}
        for c in cases + gcases:
            for pps, mp in combos:
                s_ = rule_splits(c, pps, mp, dev)
                if (c["name"], s_) not in measured:
                    measured[(c["name"], s_)] = run_row(rows, win, s_, c, refs[c["key"]],
                                                        base_mod, reps[c["key"]], args.iters,
                                                        stage="B")
        scores = []
        for pps, mp in combos:
            got = [measured[(c["name"], rule_splits(c, pps, mp, dev))]
                   for c in cases + gcases]
            if all("error" not in r and r["ok"] for r in got):
                scores.append((geomean([r["gbs"] for r in got]), -combos.index((pps, mp)), pps,
                               mp))
        if scores:
            g, _, pps, mp = max(scores)
            winner = dict(win, programs_per_sm=pps, min_partition=mp)
            meta["rule_scores"] = [dict(geomean=x[0], programs_per_sm=x[2], min_partition=x[3])
                                   for x in sorted(scores, reverse=True)]
            with open(os.path.join(args.out, "winner.json"), "w") as f:
                json.dump(dict(config=winner, geomean_gbs=g), f, indent=1)
            print(f"# winner: {winner} (geomean {g:.0f} GB/s)", flush=True)
    meta["winner"] = winner
    save()

    # Final: baseline vs the winner (its split rule) vs the current default, graph + eager.
    for c in cases + gcases:
        ref = refs[c["key"]]
        if base_mod is not None:
            run_row(rows, "baseline", None, c, ref, base_mod, reps[c["key"]], args.iters,
                    eager=True, stage="final")
        run_row(rows, winner, None, c, ref, base_mod, reps[c["key"]], args.iters,
                eager=True, stage="final")  # winner None: the current defaults
    save()
    print_summary(rows, summary, time.time() - t_start, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
