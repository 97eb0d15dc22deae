"""`kernels/row_stats` on the sampler's shape: milliseconds and GB/s per launch variant, each
checked against `row_stats_ref` first, plus the torch ops it replaces (float32 copy +
logsumexp, argmax, block-maxima top-k). Tells whether the defaults (`_NB`, `_SPLITS`,
`_WARPS` in kernels/row_stats_triton.py) are still the best.

  python bench/row_stats.py [--rows 256] [--vocab 151936] [--out bench/results/row_stats.json]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 32])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="bench/results/row_stats.json")
    args = ap.parse_args(argv)
    import torch

    from bench.report import write_json
    from infer_cluster.kernels.row_stats import row_stats_ref
    from infer_cluster.kernels.row_stats_triton import row_stats_triton

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / args.iters * 1e3

    results = []
    for rows in args.rows:
        x = (3 * torch.randn(rows, args.vocab, device="cuda")).to(torch.bfloat16)
        ref_lse, ref_bmax = row_stats_ref(x)
        nbytes = x.numel() * x.element_size()
        base = timed(lambda: torch.logsumexp(x.float(), dim=-1))
        print(f"rows {rows}: logsumexp(x.float()) {base:.4f} ms; argmax {timed(lambda: x.argmax(-1)):.4f} ms")
        for nb, splits, warps in itertools.product((8, 16, 32), (8, 16, 32, 64), (2, 4, 8)):
            cfg = dict(nb=nb, splits=splits, num_warps=warps)
            lse, bmax = row_stats_triton(x, config=cfg)
            ok = torch.allclose(lse, ref_lse, atol=1e-4, rtol=1e-5) and torch.equal(bmax, ref_bmax)
            ms = timed(lambda: row_stats_triton(x, config=cfg))
            results.append(dict(rows=rows, **cfg, ms=ms, gbs=nbytes / ms / 1e6, ok=ok))
        best = sorted((r for r in results if r["rows"] == rows and r["ok"]), key=lambda r: r["ms"])[:5]
        default = [r for r in results if r["rows"] == rows and (r["nb"], r["splits"], r["num_warps"]) == (32, 8, 4)]
        for r in default + best:
            print(f"  nb {r['nb']:>2} splits {r['splits']:>2} warps {r['num_warps']}: {r['ms']:.4f} ms "
                  f"{r['gbs']:.0f} GB/s ok={r['ok']}")
        bad = [r for r in results if r["rows"] == rows and not r["ok"]]
        if bad:
            print(f"  {len(bad)} variants disagree with the reference: {bad[:3]}")
    write_json(args.out, dict(device=torch.cuda.get_device_name(), results=results))


if __name__ == "__main__":
    main()
