"""Batch-1 decoder layers with the MLP as one launch (`kernels/mlp_triton.py`) against the
project's two MLP GEMVs, in a CUDA graph. Qwen3-0.6B shape, M = 1, no attention.

Owns: the layer chain without attention (qkv = W_qkv @ norm(y + r); o = W_o @ qkv[:2048]
standing in for the attention output; gate_up = W_gu @ norm(o + r); y = W_down @
silu_mul(gate_up)), its plain-torch reference, the baseline (`baseline_step`: the engine's four
GEMV launches per layer, PDL and the tuned table), the fused form (qkv with its add + RMSNorm
reading the previous layer's float32 sums, o, then the fused MLP adding into one of two float32
accumulators while it zeroes the other, as `DecoderModel.forward` runs it), a sweep of its launch
(channels per program x warps, with the registers and spills of each build), and the timing of
each (µs per layer, best of several graph replays, weights of all layers distinct so nothing stays
in L2). Every output is checked against the plain-torch chain. Prints one JSON line and writes
it to `--out`; without CUDA it prints a note and exits 0.

  python bench/fused_mlp.py [--layers 28] [--replays 20] [--configs 16x8,8x4,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.graph_timing import best_replay_s  # noqa: E402
from bench.report import run_info, write_json  # noqa: E402

HIDDEN, QKV, ATTN, INTER = 1024, 4096, 2048, 3072
EPS = 1e-6
BYTES_PER_LAYER = (QKV * HIDDEN + HIDDEN * ATTN + 2 * INTER * HIDDEN + HIDDEN * INTER) * 2


class Weights:
    """Every layer's weights, distinct per layer (bf16, seeded)."""

    def __init__(self, layers: int, device: str, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)

        def rand(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

        self.layers = layers
        self.wq = rand(layers, QKV, HIDDEN, scale=HIDDEN ** -0.5)
        self.wo = rand(layers, HIDDEN, ATTN, scale=ATTN ** -0.5)
        self.wgu = rand(layers, 2 * INTER, HIDDEN, scale=HIDDEN ** -0.5)
        self.wd = rand(layers, HIDDEN, INTER, scale=INTER ** -0.5)
        self.n1 = (1 + 0.1 * torch.randn(layers, HIDDEN, generator=g)).to(torch.bfloat16).to(device)
        self.n2 = (1 + 0.1 * torch.randn(layers, HIDDEN, generator=g)).to(torch.bfloat16).to(device)


def reference(w: Weights, y, r):
    """The chain in plain torch (float32 math, bf16 at every stored value)."""
    def norm(x, r, nw):
        h = (x.float() + r.float()).bfloat16()
        hf = h.float()
        inv = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
        return (nw.float() * (hf * inv).bfloat16().float()).bfloat16(), h

    for i in range(w.layers):
        x, r = norm(y, r, w.n1[i])
        qkv = (x.float() @ w.wq[i].float().T).bfloat16()
        o = (qkv[..., :ATTN].float() @ w.wo[i].float().T).bfloat16()
        x, r = norm(o, r, w.n2[i])
        gu = (x.float() @ w.wgu[i].float().T).bfloat16()
        gate, up = gu[..., :INTER].float(), gu[..., INTER:].float()
        act = (gate * torch.sigmoid(gate)).bfloat16().float()
        y = (act * up).bfloat16().float() @ w.wd[i].float().T
        y = y.bfloat16()
    return y, r


def baseline_step(w: Weights, y, r):
    """The project's launches, as the decoder layer makes them (PDL and the tuned table)."""
    from infer_cluster.kernels.gemv import (linear_small, rms_norm_linear_small,
                                            silu_mul_linear_small)
    for i in range(w.layers):
        qkv, r = rms_norm_linear_small(y, r, w.n1[i], EPS, w.wq[i])
        o = linear_small(qkv[:, :ATTN], w.wo[i])
        gu, r = rms_norm_linear_small(o, r, w.n2[i], EPS, w.wgu[i])
        y = silu_mul_linear_small(gu, w.wd[i])
    return y, r


def us_per_layer(run, args) -> float:
    """Microseconds per layer of `run()` (one whole chain), `args.inner` chains per graph."""
    return best_replay_s(lambda _: run(), args.inner, args.replays) * 1e6 / args.layers


def start(args):
    """Weights, the chain's input, the result dict with the baseline's error and µs per layer,
    and the error function against the plain-torch reference."""
    import triton
    w = Weights(args.layers, "cuda")
    y0 = (torch.randn(1, HIDDEN) * 0.5).to(torch.bfloat16).to("cuda")
    r0 = (torch.randn(1, HIDDEN) * 0.5).to(torch.bfloat16).to("cuda")
    ref_y, _ = reference(w, y0, r0)
    out = {"layers": args.layers, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}

    def err(y):
        return float((y.float().reshape(-1) - ref_y.float().reshape(-1)).abs().max()
                     / ref_y.float().abs().max())

    base_y, _ = baseline_step(w, y0.clone(), r0.clone())
    out["baseline_rel_err"] = err(base_y)
    ys, rs = y0.clone(), r0.clone()
    out["baseline_us_per_layer"] = us_per_layer(lambda: baseline_step(w, ys, rs), args)
    return w, y0, r0, out, err


def time_form(out: dict, key: str, run, err, args) -> None:
    """One form of the chain: the error of its first output, then its µs per layer."""
    y, _ = run()
    torch.cuda.synchronize()
    out[key + "_rel_err"] = err(y)
    out[key + "_us_per_layer"] = us_per_layer(run, args)


def finish(out: dict) -> dict:
    """`out` with the layer's weight bytes and their time at 3 TB/s."""
    out["bytes_mb_per_layer"] = round(BYTES_PER_LAYER / 1e6, 2)
    out["bound_us_per_layer_at_3tbs"] = round(BYTES_PER_LAYER / 3e6, 2)
    return out


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10, help="chains per graph replay")
    ap.add_argument("--configs", default="16x8,8x4,8x8,16x4,16x16,32x8",
                    help="channels-per-program x warps, comma-separated")
    ap.add_argument("--out", default="bench/results/fused_mlp.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_mlp: no CUDA device; nothing to time")
        return 0
    w, y0, r0, out, err = start(args)
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
    out["run"] = run_info()
    print(json.dumps(finish(out)))
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
