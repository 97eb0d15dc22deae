"""Batch-1 decoder layers with the MLP as one launch (`kernels/mlp_triton.py`) against the
project's two MLP GEMVs, in a CUDA graph. Qwen3-0.6B shape, M = 1, no attention.

Owns: the fused chain (qkv with its add + RMSNorm reading the previous layer's float32 sums, o,
then the fused MLP adding into one of two float32 accumulators while it zeroes the other, as
`DecoderModel.forward` runs it), a sweep of its launch (channels per program x warps, with the
registers and spills of each build), and the baseline (`bench/persistent_chain.py`'s
`baseline_step`: the engine's four GEMV launches per layer) timed in the same process. Every
output is checked against the plain-torch chain. Prints one JSON line; without CUDA it prints
a note and exits 0.

  python bench/fused_mlp.py [--layers 28] [--replays 20] [--configs 16x8,8x4,...]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.persistent_chain import (ATTN, EPS, HIDDEN, baseline_step, chain_parser, finish,  # noqa: E402
                                    start, time_form, us_per_layer)


def fused_step(w, y, r, sums, block_c: int, warps: int):
    """The chain with each layer's MLP as one launch; `sums` is `[2, 1, HIDDEN]` float32."""
    from infer_cluster.kernels.gemv import linear_small, rms_norm_linear_small
    from infer_cluster.kernels.mlp_triton import fused_mlp_small_triton
    sums.zero_()
    last = w.layers - 1
    for i in range(w.layers):
        qkv, r = rms_norm_linear_small(y, r, w.n1[i], EPS, w.wq[i])
        o = linear_small(qkv[:, :ATTN], w.wo[i])
        zero = sums[(i + 1) % 2] if 0 < i < last else None
        y, r = fused_mlp_small_triton(o, r, w.n2[i], EPS, w.wgu[i], w.wd[i], sums[i % 2], zero,
                                      block_c=block_c, num_warps=warps)
    return y, r


def build_info() -> list:
    """Registers, spills and shared memory of every fused build compiled so far."""
    from infer_cluster.kernels.mlp_triton import _mlp_kernel
    builds = []
    try:
        for k in _mlp_kernel.device_caches[torch.cuda.current_device()][0].values():
            k._init_handles()  # loads the module: fills n_regs / n_spills
            builds.append({"warps": k.metadata.num_warps, "regs": k.n_regs, "spills": k.n_spills,
                           "shared": k.metadata.shared})
    except Exception as e:  # the cache's layout moves between Triton versions
        builds.append({"error": repr(e)})
    return builds


def main(argv=None):
    ap = chain_parser(__doc__)
    ap.add_argument("--configs", default="16x8,8x4,8x8,16x4,16x16,32x8",
                    help="channels-per-program x warps, comma-separated")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_mlp: no CUDA device; nothing to time")
        return 0
    w, y0, r0, out, err = start(args, programs=0)
    sums = torch.zeros(2, 1, HIDDEN, dtype=torch.float32, device="cuda")
    for spec in args.configs.split(","):
        block_c, warps = (int(v) for v in spec.split("x"))
        ys, rs = y0.clone(), r0.clone()
        # (the error is of the last layer's float32 sums, as the LM head's norm reads them)
        time_form(out, f"fused_{block_c}x{warps}",
                  lambda: fused_step(w, ys, rs, sums, block_c, warps), err, args)
    out["fused_builds"] = build_info()
    ys, rs = y0.clone(), r0.clone()
    out["baseline_again_us_per_layer"] = us_per_layer(lambda: baseline_step(w, ys, rs), args)
    print(json.dumps(finish(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
