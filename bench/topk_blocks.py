"""The sampler's candidate top-k (`sampling_ops.topk_by_blocks`) against variants that replace
torch's `topk` by in-block sorts, per batch size and width, in CUDA graphs (as the draw graphs
replay it; eager launch cost is not what this measures). Every variant's values must equal the
current one's (sorted, highest first). Writes JSON.

  python bench/topk_blocks.py --rows 1 8 32 256 --widths 114 256
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import write_json  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--widths", type=int, nargs="+", default=[114, 256])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--out", default="bench/results/topk_blocks.json")
    args = ap.parse_args(argv)

    import torch

    from infer_cluster.kernels.row_stats import block_maxima
    from infer_cluster.worker import sampling_ops

    if not torch.cuda.is_available():
        print("bench/topk_blocks.py: no CUDA device")
        return 0
    variants = {"topk": sampling_ops.topk_by_blocks, "sorted": sampling_ops.topk_by_sorts}
    rows_out = []
    for n in args.rows:
        x = (3 * torch.randn(n, args.vocab, device="cuda")).to(torch.bfloat16)
        for k in args.widths:
            ref_vals = None
            line = {"rows": n, "width": k}
            for name, fn in variants.items():
                def body():
                    return fn(x, k, block_maxima(x, sampling_ops.TOPK_BLOCK))
                vals, ids = body()
                torch.cuda.synchronize()
                if ref_vals is None:
                    ref_vals = vals
                else:
                    line[f"{name}_same_values"] = bool(torch.equal(vals, ref_vals))
                    line[f"{name}_ids_hold_values"] = bool(torch.equal(x.gather(1, ids), vals))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    body()
                for _ in range(10):
                    graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(args.replays):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                line[f"{name}_us"] = round(start.elapsed_time(end) / args.replays * 1e3, 2)
            rows_out.append(line)
            print(line, flush=True)
    write_json(args.out, {"vocab": args.vocab, "results": rows_out,
                          "device": torch.cuda.get_device_name()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
