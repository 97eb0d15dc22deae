"""Decode attention over an int8 KV cache vs the bf16 cache, timed as the engine runs it
(CUDA-graph replays, graph-width block tables), on the decode tuner's Qwen3-0.6B batches.

Owns: one table (case, variant, ms, GB/s of bytes actually read, speedup over bf16 defaults, max
error vs `paged_attention_ref` on the same int8 cache) and a JSON file. Variants: the bf16
cache with the tuned defaults, and the int8 cache with the same defaults and with other tile
sizes (`--block-n`), so the int8 default can be revisited from data. Batches, timers and the
correctness check come from `bench/tune_decode_cases.py`. `--smoke` runs tiny batches on the CPU
interpreter (checks the script only; times meaningless).

  python bench/int8_decode.py [--block-n 64 128] [--out bench/results/int8_decode.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _int8_batches(case):
    """The case's batches with the caches quantized once (codes, scales) by the append rule."""
    from infer_cluster.kernels.kv_append import quantize_int8_ref
    k, v = case["batches"][0][1], case["batches"][0][2]
    quant = []
    for cache in (k, v):
        codes, scale = quantize_int8_ref(cache)
        quant.append((codes, scale.transpose(1, 2).contiguous()))
    (kc, ks), (vc, vs) = quant
    return [(q, kc, vc, bt, qsl, lens, ks, vs) for q, _, _, bt, qsl, lens in case["batches"]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--sweep", action="store_true",
                    help="also time block_n x num_warps x num_stages variants of the int8 kernel")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20, help="kernel calls per captured graph")
    ap.add_argument("--out", default="bench/results/int8_decode.json")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny batches")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    from bench import tune_decode_cases as tc
    from bench.report import write_json
    from infer_cluster.kernels.attention import paged_attention_ref
    from infer_cluster.kernels.attention_triton import decode_attention
    tc.SMOKE = args.smoke
    device = "cpu" if args.smoke else "cuda"
    iters = 2 if args.smoke else args.iters
    scale = tc.D ** -0.5
    rows = []
    print(f"{'case':<22}{'variant':<30}{'ms':>9}{'GB/s':>9}{'vs bf16':>9}{'max err':>10}")
    for case in tc.make_cases(device, torch.bfloat16, graph_width=True, b1_copies=4):
        outs = [torch.empty_like(b[0]) for b in case["batches"]]
        base = tc.time_graph(lambda b, o: decode_attention(*b, scale, o), case, outs,
                             args.reps, iters)[0]
        n_tok, n = case["ctx_total"], case["num_seqs"]
        q_bytes = 2 * 2 * n * tc.H * tc.D
        variants = [("bf16 defaults", base, case["work"], None)]
        int8 = _int8_batches(case)
        q, kc, vc, bt, qsl, lens, ks, vs = int8[0]
        ref = paged_attention_ref(q, kc, vc, bt, qsl, lens, scale, k_scale=ks, v_scale=vs)
        configs = [dict(block_n=bn) for bn in args.block_n]
        if args.sweep:
            configs += [dict(block_n=bn, num_warps=w, num_stages=st) for bn in (64, 128, 256)
                        for w in (4, 8) for st in (2, 3, 4)]
        for cfg in configs:
            def fn(b, o, cfg=cfg):
                decode_attention(*b[:6], scale, o, config=cfg, k_scale=b[6], v_scale=b[7])
            int8_case = dict(case, batches=int8)
            ms = tc.time_graph(fn, int8_case, outs, args.reps, iters)[0]
            err = tc.check(fn, int8_case, ref)[0]
            label = "int8 " + " ".join(f"{k.split('_')[-1]}={v}" for k, v in cfg.items())
            variants.append((label, ms, n_tok * tc.HK * (tc.D + 4) * 2 + q_bytes,
                             err))
        for name, ms, work, err in variants:
            row = dict(case=case["name"], variant=name, ms=ms, gbs=work / (ms * 1e-3) / 1e9,
                       speedup=base / ms, max_err=err)
            rows.append(row)
            print(f"{row['case']:<22}{name:<30}{ms:>9.4f}{row['gbs']:>9.0f}{row['speedup']:>9.2f}"
                  f"{'' if err is None else format(err, '10.1e'):>10}")
    meta = dict(device=torch.cuda.get_device_name() if not args.smoke else "cpu (interpreter)",
                torch=torch.__version__, reps=args.reps, iters=iters)
    write_json(args.out, dict(meta=meta, results=rows))
    return rows


if __name__ == "__main__":
    main()
