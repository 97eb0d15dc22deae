"""Prototype for batch-1 TPOT: the four GEMVs of every decoder layer as one persistent kernel
whose programs load the next phase's weights before they wait at a grid barrier, against the
project's per-GEMV launches (PDL, tuned table) in a CUDA graph. Qwen3-0.6B shape, M = 1.

Owns: `_chain_kernel` (GPU only: its programs spin on each other, so the sequential Triton
interpreter would deadlock), the chain as the model runs it without attention (qkv = W_qkv @
norm(y + r); o = W_o @ qkv[:2048] standing in for the attention output; gate_up = W_gu @
norm(o + r); y = W_down @ silu_mul(gate_up)), both timings (per layer, best of several graph
replays, weights of all layers distinct so nothing stays in L2), and the error of each against
the plain-torch chain. Prints one JSON line. Without CUDA it prints a note and exits 0.

The question it answers: docs/kernels.md puts the in-step GEMVs at ~17.5 us a layer against
10.5 us of bytes, lost to each launch's ramp and tail. Here every phase's weights are requested
one phase early (registers; `PREFETCH=0` loads them after the barrier instead), and a phase
boundary is an atomic counter instead of a kernel boundary. If the persistent chain is not
clearly faster per layer, a persistent decode kernel is not worth building. It was not (H100,
2026-11-28: bench/RESULTS.md, docs/kernels.md "A persistent layer kernel").

  python bench/persistent_chain.py [--layers 28] [--programs 256] [--replays 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.graph_timing import best_replay_s  # noqa: E402

HIDDEN, QKV, ATTN, INTER = 1024, 4096, 2048, 3072
EPS = 1e-6
BYTES_PER_LAYER = (QKV * HIDDEN + HIDDEN * ATTN + 2 * INTER * HIDDEN + HIDDEN * INTER) * 2
# Reads of the barrier counter before a program gives up (programs that are not all resident
# then end with wrong numbers, which the error check shows, instead of hanging the device).
SPIN_CAP = tl.constexpr(131072)


@triton.jit
def _arrive(bar_ptr):
    tl.debug_barrier()  # every thread's stores of the phase come before the release
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(bar_ptr, target):
    """Spins until the counter reaches `target`, or SPIN_CAP reads."""
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < SPIN_CAP):
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    tl.debug_barrier()


@triton.jit
def _normed(x_ptr, r_in, r_out, nw_ptr, eps, pid, K: tl.constexpr):
    """round(w * round(h * rsqrt(mean(h^2) + eps))) of h = round(x + r); program 0 stores h."""
    offs = tl.arange(0, K)
    x = tl.load(x_ptr + offs, cache_modifier=".cg").to(tl.float32)
    r = tl.load(r_in + offs, cache_modifier=".cg").to(tl.float32)
    h = (x + r).to(tl.bfloat16)
    tl.store(r_out + offs, h, mask=(offs < K) & (pid == 0))
    hf = h.to(tl.float32)
    inv = tl.rsqrt(tl.sum(hf * hf, axis=0) / K + eps)
    w = tl.load(nw_ptr + offs).to(tl.float32)
    return (w * (hf * inv).to(tl.bfloat16).to(tl.float32)).to(tl.bfloat16).to(tl.float32)


@triton.jit
def _tile(w_ptr, row0, K, BN: tl.constexpr, BK: tl.constexpr, k0=0):
    rows = row0 + tl.arange(0, BN)
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k0 + tl.arange(0, BK)[None, :])


@triton.jit
def _l2_prefetch(w_ptr, row0, K, BN: tl.constexpr, PIECES: tl.constexpr = 32):
    """Asks L2 for BN whole rows of W from row0 (contiguous) with sm_90 bulk prefetches, one
    piece per lane; nothing comes back to registers."""
    piece = BN * K // PIECES
    ptrs = w_ptr + row0.to(tl.int64) * K + tl.arange(0, PIECES).to(tl.int64) * piece
    nbytes = tl.full([PIECES], 0, tl.int32) + piece * 2
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                              "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _dot_store(w, x, out_ptr, row0, BN: tl.constexpr):
    y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    tl.store(out_ptr + row0 + tl.arange(0, BN), y.to(tl.bfloat16))


@triton.jit
def _chain_kernel(y_ptr, qkv_ptr, o_ptr, gu_ptr, ra_ptr, rb_ptr, wq_ptr, wo_ptr, wgu_ptr, wd_ptr,
                  n1_ptr, n2_ptr, bar_ptr, layers, eps, G: tl.constexpr,
                  H: tl.constexpr, NQ: tl.constexpr, A: tl.constexpr, I: tl.constexpr,
                  BQ: tl.constexpr, BO: tl.constexpr, BG: tl.constexpr,
                  BD: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    rq, ro, rd = pid * BQ, pid * BO, pid * BD
    wq = _tile(wq_ptr, rq, H, BQ, H)
    phase = 0
    for layer in range(layers):
        lwo = wo_ptr + layer * (H * A)
        lwg = wgu_ptr + layer * (2 * I * H)
        lwd = wd_ptr + layer * (H * I)
        # qkv = W_qkv @ norm(y + r_a); r_b = y + r_a
        if PREFETCH == 1:
            wo = _tile(lwo, ro, A, BO, A)
        if PREFETCH == 2:
            _l2_prefetch(lwo, ro, A, BO)
        _wait(bar_ptr, phase * G)
        x = _normed(y_ptr, ra_ptr, rb_ptr, n1_ptr + layer * H, eps, pid, H)
        _dot_store(wq, x, qkv_ptr, rq, BQ)
        _arrive(bar_ptr)
        phase += 1
        # o = W_o @ qkv[:A]
        if PREFETCH == 1:
            g0 = _tile(lwg, pid * BG, H, BG, H)
            g1 = _tile(lwg, (pid + G) * BG, H, BG, H)
            g2 = _tile(lwg, (pid + 2 * G) * BG, H, BG, H)
        if PREFETCH == 2:
            _l2_prefetch(lwg, pid * BG, H, BG)
            _l2_prefetch(lwg, (pid + G) * BG, H, BG)
            _l2_prefetch(lwg, (pid + 2 * G) * BG, H, BG)
        _wait(bar_ptr, phase * G)
        if PREFETCH != 1:
            wo = _tile(lwo, ro, A, BO, A)
        a = tl.load(qkv_ptr + tl.arange(0, A), cache_modifier=".cg").to(tl.float32)
        _dot_store(wo, a, o_ptr, ro, BO)
        _arrive(bar_ptr)
        phase += 1
        # gate_up = W_gu @ norm(o + r_b); r_a = o + r_b
        if PREFETCH == 1:
            d0 = _tile(lwd, rd, I, BD, 1024, 0)
            d1 = _tile(lwd, rd, I, BD, 1024, 1024)
            d2 = _tile(lwd, rd, I, BD, 1024, 2048)
        if PREFETCH == 2:
            _l2_prefetch(lwd, rd, I, BD)
        _wait(bar_ptr, phase * G)
        if PREFETCH != 1:
            g0 = _tile(lwg, pid * BG, H, BG, H)
            g1 = _tile(lwg, (pid + G) * BG, H, BG, H)
            g2 = _tile(lwg, (pid + 2 * G) * BG, H, BG, H)
        x = _normed(o_ptr, rb_ptr, ra_ptr, n2_ptr + layer * H, eps, pid, H)
        _dot_store(g0, x, gu_ptr, pid * BG, BG)
        _dot_store(g1, x, gu_ptr, (pid + G) * BG, BG)
        _dot_store(g2, x, gu_ptr, (pid + 2 * G) * BG, BG)
        _arrive(bar_ptr)
        phase += 1
        # y = W_down @ silu_mul(gate_up); the next layer's qkv tile is requested first
        nxt = (layer + 1) % layers
        if PREFETCH == 1:
            wq = _tile(wq_ptr + nxt * (NQ * H), rq, H, BQ, H)
        if PREFETCH == 2:
            _l2_prefetch(wq_ptr + nxt * (NQ * H), rq, H, BQ)
        _wait(bar_ptr, phase * G)
        if PREFETCH != 1:
            d0 = _tile(lwd, rd, I, BD, 1024, 0)
            d1 = _tile(lwd, rd, I, BD, 1024, 1024)
            d2 = _tile(lwd, rd, I, BD, 1024, 2048)
        acc = tl.zeros([BD], tl.float32)
        for c in tl.static_range(3):
            offs = c * 1024 + tl.arange(0, 1024)
            gate = tl.load(gu_ptr + offs, cache_modifier=".cg").to(tl.float32)
            up = tl.load(gu_ptr + I + offs, cache_modifier=".cg").to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32)
            xc = (act * up).to(tl.bfloat16).to(tl.float32)
            d = d0 if c == 0 else (d1 if c == 1 else d2)
            acc += tl.sum(d.to(tl.float32) * xc[None, :], axis=1)
        tl.store(y_ptr + rd + tl.arange(0, BD), acc.to(tl.bfloat16))
        _arrive(bar_ptr)
        phase += 1
        if PREFETCH != 1:
            wq = _tile(wq_ptr + nxt * (NQ * H), rq, H, BQ, H)


@triton.jit
def _barriers_kernel(bar_ptr, phases, G: tl.constexpr):
    """Only the grid barriers of the chain: `phases` rounds of arrive + wait."""
    for phase in range(phases):
        _wait(bar_ptr, phase * G)
        _arrive(bar_ptr)
    _wait(bar_ptr, phases * G)


def barrier_us(programs: int, warps: int, phases: int, args) -> float:
    """Microseconds per grid barrier (arrive + wait) among `programs` resident programs."""
    bar = torch.zeros(1, dtype=torch.int32, device="cuda")

    def run():
        bar.zero_()
        _barriers_kernel[(programs,)](bar, phases, G=programs, num_warps=warps)
    return best_replay_s(lambda _: run(), args.inner, args.replays) * 1e6 / phases


class Weights:
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


class ChainBuffers:
    """A persistent chain's activations (bf16 vectors; the residual alternates between `ra` and
    `rb`) and its barrier counter, starting from the input `y0`, `r0`."""

    def __init__(self, y0: torch.Tensor, r0: torch.Tensor):
        bf = dict(dtype=torch.bfloat16, device=y0.device)
        self.y, self.ra = y0.reshape(-1).clone(), r0.reshape(-1).clone()
        self.qkv, self.gu = torch.zeros(QKV, **bf), torch.zeros(2 * INTER, **bf)
        self.o, self.rb = torch.zeros(HIDDEN, **bf), torch.zeros(HIDDEN, **bf)
        self.bar = torch.zeros(1, dtype=torch.int32, device=y0.device)

    def activations(self) -> tuple:
        return self.y, self.qkv, self.o, self.gu, self.ra, self.rb


class Persistent(ChainBuffers):
    def __init__(self, w: Weights, programs: int, prefetch: int, y0, r0, warps: int = 16):
        if QKV % programs or HIDDEN % programs or (2 * INTER) % (3 * programs):
            raise SystemExit(f"--programs {programs} does not tile the Qwen3-0.6B shapes")
        super().__init__(y0, r0)
        self.w, self.g, self.prefetch, self.warps = w, programs, prefetch, warps

    def _args(self):
        w, g = self.w, self.g
        return ((*self.activations(), w.wq, w.wo, w.wgu, w.wd, w.n1, w.n2, self.bar, w.layers,
                 EPS),
                dict(G=g, H=HIDDEN, NQ=QKV, A=ATTN, I=INTER, BQ=QKV // g, BO=HIDDEN // g,
                     BG=2 * INTER // (3 * g), BD=HIDDEN // g, PREFETCH=self.prefetch,
                     num_warps=self.warps))

    def resident(self) -> dict:
        """Registers, spills and whether all G programs fit on the device at once (they must:
        each waits for all the others)."""
        args, kw = self._args()
        k = _chain_kernel.warmup(*args, grid=(self.g,), **kw)
        k._init_handles()  # loads the module: fills n_regs / n_spills
        props = torch.cuda.get_device_properties(self.y.device)
        threads = 32 * self.warps
        per_sm = min(65536 // (-(-k.n_regs // 8) * 8 * threads),
                     props.max_threads_per_multi_processor // threads)
        smem = k.metadata.shared
        if smem:
            per_sm = min(per_sm, (228 * 1024) // smem)
        return {"regs": k.n_regs, "spills": k.n_spills, "per_sm": per_sm,
                "fits": per_sm * props.multi_processor_count >= self.g}

    def run(self):
        self.bar.zero_()
        args, kw = self._args()
        _chain_kernel[(self.g,)](*args, **kw)
        return self.y, self.ra


def us_per_layer(run, args) -> float:
    """Microseconds per layer of `run()` (one whole chain), `args.inner` chains per graph."""
    return best_replay_s(lambda _: run(), args.inner, args.replays) * 1e6 / args.layers


def start(args, programs: int):
    """Weights, the chain's input, the reference output, the result dict with the baseline's
    error and µs per layer, and the error function against the reference (shared with
    bench/persistent_gluon.py)."""
    w = Weights(args.layers, "cuda")
    y0 = (torch.randn(1, HIDDEN) * 0.5).to(torch.bfloat16).to("cuda")
    r0 = (torch.randn(1, HIDDEN) * 0.5).to(torch.bfloat16).to("cuda")
    ref_y, _ = reference(w, y0, r0)
    out = {"layers": args.layers, "programs": programs,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
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
    """One persistent form: the error of its first chain's output, then its µs per layer."""
    y, _ = run()
    torch.cuda.synchronize()
    out[key + "_rel_err"] = err(y)
    out[key + "_us_per_layer"] = us_per_layer(run, args)


def finish(out: dict) -> dict:
    """`out` with the layer's weight bytes and their time at 3 TB/s."""
    out["bytes_mb_per_layer"] = round(BYTES_PER_LAYER / 1e6, 2)
    out["bound_us_per_layer_at_3tbs"] = round(BYTES_PER_LAYER / 3e6, 2)
    return out


def chain_parser(doc: str) -> argparse.ArgumentParser:
    """The options every chain bench takes (layers, replays, chains per replay), described by
    the first paragraph of `doc` (shared with bench/persistent_gluon.py and bench/fused_mlp.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--inner", type=int, default=10, help="chains per graph replay")
    return ap


def main(argv=None):
    ap = chain_parser(__doc__)
    ap.add_argument("--programs", type=int, default=128, help="persistent programs (all resident)")
    ap.add_argument("--warps", type=int, default=16)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("persistent_chain: no CUDA device; nothing to time")
        return 0
    w, y0, r0, out, err = start(args, args.programs)
    for prefetch in (1, 0, 2):
        p = Persistent(w, args.programs, prefetch, y0, r0, args.warps)
        key = ("persistent_no_prefetch", "persistent", "persistent_l2")[prefetch]
        out[key + "_build"] = info = p.resident()
        if not info["fits"]:
            continue
        time_form(out, key, p.run, err, args)
    out["barrier_us"] = barrier_us(args.programs, args.warps, 4 * args.layers, args)
    print(json.dumps(finish(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
