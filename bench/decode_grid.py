"""Decode attention against its KV-read floor, per batch size and context bucket, bf16 and int8 KV.

Owns: the grid (batch 64 / 128 / 256 x context ~128 / 512 / 1,024 / 2,048 tokens: workload A's
decode batches), one table and a JSON file. Each cell times the engine's default launch (the
tuned `decode_attention` for bf16, `DECODE_INT8` for int8, graph-width block tables as the CUDA
graphs have them) in CUDA-graph replays, and reports the bytes the kernel must read (K and V of
every context token, q and the output; for int8 the codes and their per-token scales) over the
time, as GB/s and as a share of the device's copy bandwidth measured in the same run. The cases'
KV is copied until a cell streams at least 256 MB a replay, so a small batch cannot sit in the
50 MB L2. Batches, timers and the correctness check come from bench/tune_decode_cases.py; every
cell is checked against `paged_attention_ref` before it is timed.

A cell's contexts spread over +-25% of its bucket by default. Workload A's spread is wider
(prompts of 100-1,024 tokens), and there the last-started long contexts set a launch's end, so
a launch config that wins here can lose in the engine: `--spread 0.9` gives that mix, and
`--longest-first` launches it as decode steps do (`kernels.attention.decode_order`).

  python bench/decode_grid.py [--batch 64 128 256] [--context 128 512 1024 2048] [--out ...]
  --splits 1 2: each cell also with these split counts forced (`decode_attention(num_splits=)`),
    against the default plan (how the wave rule in kernels/attention_decode_plan.py was chosen).
  --config / --bf16-config JSON: override `decode_config` keys of the int8 / bf16 launches,
    e.g. '{"num_warps": 2}'.
  --smoke: CPU interpreter, tiny cells (checks the script only; times meaningless).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_MIN_STREAM = 256 << 20  # bytes of KV a replay streams at least (copies of the case)
_MAX_COPIES = 16


def _lengths(batch: int, context: int, seed: int, spread: float = 0.25) -> list:
    """`batch` context lengths spread over [1 - spread, 1 + spread] x `context` (at least 1)."""
    rng = random.Random(seed)
    return [max(1, rng.randint(int((1 - spread) * context), int((1 + spread) * context)))
            for _ in range(batch)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[128, 512, 1024, 2048])
    ap.add_argument("--kv", nargs="+", choices=["bf16", "int8"], default=["bf16", "int8"])
    ap.add_argument("--config", type=json.loads, default=None,
                    help="JSON object of decode_config keys for the int8 runs")
    ap.add_argument("--bf16-config", type=json.loads, default=None,
                    help="JSON object of decode_config keys for the bf16 runs")
    ap.add_argument("--spread", type=float, default=0.25,
                    help="contexts uniform over (1 +- spread) x the bucket (workload A's: ~0.9)")
    ap.add_argument("--longest-first", action="store_true",
                    help="launch the sequences longest first, as decode steps do (`decode_order`)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reps", type=int, default=10, help="kernel calls per captured graph")
    ap.add_argument("--out", default="bench/results/decode_grid.json")
    ap.add_argument("--splits", type=int, nargs="*", default=[],
                    help="also time each cell with these split counts forced")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny cells")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.batch) or any(c < 1 for c in args.context) or any(n < 1 for n in args.splits):
        ap.error("--batch, --context and --splits values must be positive")
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    from bench import tune_decode_cases as tc
    from bench.int8_decode import _int8_batches, int8_bytes
    from bench.report import write_json
    from infer_cluster.kernels.attention import decode_order, paged_attention_ref
    from infer_cluster.kernels.attention_int8_triton import OP_MMA, cvt_ops
    from infer_cluster.kernels.attention_triton import decode_attention, decode_config
    from infer_cluster.kernels.kv_append import dequantize_int8_ref, quantize_int8_ref

    tc.SMOKE = args.smoke
    if not args.smoke and not torch.cuda.is_available():
        print("bench/decode_grid.py: no CUDA device; nothing to time")
        return []
    device = "cpu" if args.smoke else "cuda"
    batches, contexts = (args.batch, args.context) if not args.smoke else ([3], [20])
    iters, reps = (2, 1) if args.smoke else (args.iters, args.reps)
    scale = tc.D ** -0.5
    copy = 0.0 if args.smoke else tc.copy_bandwidth()
    print(f"copy bandwidth {copy:.0f} GB/s; GB/s = bytes the kernel must read / time")
    print(f"{'batch':>5} {'context':>7} {'kv':>5} {'splits':>7} {'ms':>8} {'GB/s':>6} {'of copy':>8} "
          f"{'vs bf16':>8} {'max err':>8}")
    rows = []
    for bi, batch in enumerate(batches):
        for ci, context in enumerate(contexts):
            lens = _lengths(batch, context, seed=1000 * bi + ci, spread=args.spread)
            kv_bytes = 2 * sum(lens) * tc.HK * tc.D * 2
            copies = 1 if args.smoke else min(_MAX_COPIES, max(1, -(-_MIN_STREAM // kv_bytes)))
            case = tc.build_case(f"b{batch} c{context}", lens, copies, 0 if args.smoke else tc.GRAPH_WIDTH,
                                 device, torch.bfloat16, seed=bi * 10 + ci)
            outs = [torch.empty_like(b[0]) for b in case["batches"]]
            order = None
            if args.longest_first:  # every copy of the case has the same lengths
                order = decode_order(case["batches"][0][5])
            base = None
            for kv in args.kv:
                if kv == "bf16":
                    run_case = case
                    ref = paged_attention_ref(*case["batches"][0], scale)
                    work = case["work"]

                    def fn(b, o, n=None):
                        decode_attention(*b, scale, o, num_splits=n, config=args.bf16_config,
                                         order=order)
                else:
                    run_case = dict(case, batches=_int8_batches(case))
                    q, kc, vc, bt, qsl, ln, ks, vs = run_case["batches"][0]
                    cvt = (args.config or {}).get("cvt") or decode_config(q, torch.int8)["cvt"]
                    if cvt_ops(cvt, kc, vc)[0] == OP_MMA:  # the kernel rounds q to int8: so does the reference
                        q = dequantize_int8_ref(*quantize_int8_ref(q))
                    ref = paged_attention_ref(q, kc, vc, bt, qsl, ln, scale, k_scale=ks, v_scale=vs)
                    work = int8_bytes(sum(lens), batch)

                    def fn(b, o, n=None):
                        decode_attention(*b[:6], scale, o, k_scale=b[6], v_scale=b[7], num_splits=n,
                                         config=args.config, order=order)
                for n in [None, *args.splits]:  # the default plan, then each forced count
                    run = functools.partial(fn, n=n)
                    err, ok = tc.check(run, run_case, ref)
                    ms = tc.time_graph(run, run_case, outs, reps, iters)[0]
                    if n is None:
                        base = ms if kv == "bf16" else base
                    gbs = work / (ms * 1e-3) / 1e9
                    row = dict(batch=batch, context=context, context_total=sum(lens), kv=kv,
                               splits=n or "default", ms=ms, bytes=work, gbs=gbs,
                               of_copy=gbs / copy if copy else None,
                               vs_bf16=base / ms if base and n is None else None, max_err=err, ok=ok,
                               copies=copies)
                    rows.append(row)
                    share = f"{row['of_copy']:.0%}" if copy else "-"
                    speed = f"{row['vs_bf16']:.2f}x" if row["vs_bf16"] else "-"
                    print(f"{batch:>5} {context:>7} {kv:>5} {str(row['splits']):>7} {ms:>8.4f} {gbs:>6.0f} "
                          f"{share:>8} {speed:>8} {err:>8.1e}{'' if ok else '  WRONG (vs reference)'}",
                          flush=True)
            del case, outs
            if not args.smoke:
                torch.cuda.empty_cache()
    meta = dict(device=torch.cuda.get_device_name() if not args.smoke else "cpu (interpreter)",
                torch=torch.__version__, copy_gbs=copy, reps=reps, iters=iters, config=args.config,
                bf16_config=args.bf16_config)
    write_json(args.out, dict(meta=meta, rows=rows))
    return rows


if __name__ == "__main__":
    main()
