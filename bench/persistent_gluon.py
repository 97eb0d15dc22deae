"""Prototype for batch-1 TPOT, second form: `bench/persistent_chain.py`'s persistent chain of the
four layer GEMVs written in Gluon, with each phase's weights staged in shared memory ahead of
the grid barrier, so no register holds them while the program waits (the Triton form spilled
them, and its L2 prefetches were slower still).

Owns two kernels (GPU only; one program per SM, 128, all resident) and their timing against
the project's per-GEMV launches, with persistent_chain.py's chain, weights and reference:
  * `_staged_kernel` (`persistent_smem`): `cp.async` 16-byte copies, one phase ahead;
  * `_ring_kernel` (`persistent_tma_ring`): TMA boxes [8, 256] into one ring of 52 (208 KB),
    two phases ahead. `ring_without_weights` (NO_W) and `ring_without_barriers` (NO_SYNC) time
    it with either part left out (outputs wrong by design): the chain's latency floor and the
    weight stream's own rate.
Prints one JSON line; without CUDA or without Gluon it prints a note and exits 0. Results:
bench/RESULTS.md (2026-11-28) and docs/kernels.md, "A persistent layer kernel". (A TMA form
with one buffer per phase, one phase ahead, was timed there too and removed: the ring beat it.)

  python bench/persistent_gluon.py [--layers 28] [--replays 20]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from persistent_chain import (ATTN, EPS, HIDDEN, INTER, QKV, SPIN_CAP,  # noqa: E402
                              ChainBuffers, Weights, chain_parser, finish, start, time_form)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon
    gluon = None

G, WARPS = 128, 8
BQ, BO, BG, BD = QKV // G, HIDDEN // G, 2 * INTER // (3 * G), HIDDEN // G  # 32, 8, 16, 8

if gluon is not None:
    _cta_sync = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

    @gluon.jit
    def _stage(smem, w_ptr, row0, K, k0, R: gl.constexpr, C: gl.constexpr, layout: gl.constexpr):
        """cp.async of W[row0:row0+R, k0:k0+C] into smem [R, C] (not committed)."""
        rows = row0 + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = k0 + gl.arange(0, C, layout=gl.SliceLayout(0, layout))
        ptrs = w_ptr + gl.expand_dims(rows.to(gl.int64) * K, 1) + gl.expand_dims(cols, 0)
        cp.async_copy_global_to_shared(smem, ptrs)

    @gluon.jit
    def _vec(ptr, N: gl.constexpr, layout: gl.constexpr):
        return gl.load(ptr + gl.arange(0, N, layout=layout), cache_modifier=".cg").to(gl.float32)

    @gluon.jit
    def _arrive(bar_ptr):
        _cta_sync()
        gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")

    @gluon.jit
    def _wait(bar_ptr, target):
        seen = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        spins = 0
        while (seen < target) & (spins < SPIN_CAP):
            seen = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
            spins += 1
        _cta_sync()

    @gluon.jit
    def _normed(x_ptr, r_in, r_out, nw_ptr, eps, pid, K: gl.constexpr, layout: gl.constexpr):
        offs = gl.arange(0, K, layout=layout)
        h = (_vec(x_ptr, K, layout) + _vec(r_in, K, layout)).to(gl.bfloat16)
        gl.store(r_out + offs, h, mask=(offs < K) & (pid == 0))
        hf = h.to(gl.float32)
        inv = gl.rsqrt(gl.sum(hf * hf, axis=0) / K + eps)
        w = gl.load(nw_ptr + offs).to(gl.float32)
        return (w * (hf * inv).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)

    @gluon.jit
    def _store_rows(out_ptr, row0, acc, R: gl.constexpr, layout: gl.constexpr):
        gl.store(out_ptr + row0 + gl.arange(0, R, layout=gl.SliceLayout(1, layout)),
                 acc.to(gl.bfloat16))

    @gluon.jit
    def _dot_store(smem, x, out_ptr, row0, R: gl.constexpr, layout: gl.constexpr):
        w = smem.load(layout).to(gl.float32)
        _store_rows(out_ptr, row0, gl.sum(w * gl.expand_dims(x, 0), axis=1), R, layout)

    @gluon.jit
    def _down_part(smem, gu_ptr, k0, I: gl.constexpr, row_l: gl.constexpr, layout: gl.constexpr):
        gate = _vec(gu_ptr + k0, 1024, row_l)
        up = _vec(gu_ptr + I + k0, 1024, row_l)
        act = (gate / (1.0 + gl.exp(-gate))).to(gl.bfloat16).to(gl.float32)
        xc = (act * up).to(gl.bfloat16).to(gl.float32)
        w = smem.load(layout).to(gl.float32)
        return gl.sum(w * gl.expand_dims(xc, 0), axis=1)

    @gluon.jit
    def _staged_kernel(y_ptr, qkv_ptr, o_ptr, gu_ptr, ra_ptr, rb_ptr, wq_ptr, wo_ptr, wgu_ptr,
                       wd_ptr, n1_ptr, n2_ptr, bar_ptr, layers, eps, G: gl.constexpr,
                       H: gl.constexpr, NQ: gl.constexpr, A: gl.constexpr, I: gl.constexpr,
                       BQ: gl.constexpr, BO: gl.constexpr, BG: gl.constexpr, BD: gl.constexpr,
                       num_warps: gl.constexpr):
        tile: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(0, tile)
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        # shapes must be powers of two: three gate_up buffers (qkv's tile uses the first two),
        # one o buffer, three down column blocks
        sa0 = gl.allocate_shared_memory(gl.bfloat16, [BG, H], flat)
        sa1 = gl.allocate_shared_memory(gl.bfloat16, [BG, H], flat)
        sa2 = gl.allocate_shared_memory(gl.bfloat16, [BG, H], flat)
        so = gl.allocate_shared_memory(gl.bfloat16, [BO, A], flat)
        sd0 = gl.allocate_shared_memory(gl.bfloat16, [BD, 1024], flat)
        sd1 = gl.allocate_shared_memory(gl.bfloat16, [BD, 1024], flat)
        sd2 = gl.allocate_shared_memory(gl.bfloat16, [BD, 1024], flat)
        pid = gl.program_id(0)
        rq, ro, rd = pid * BQ, pid * BO, pid * BD
        _stage(sa0, wq_ptr, rq, H, 0, BG, H, tile)
        _stage(sa1, wq_ptr, rq + BG, H, 0, BG, H, tile)
        cp.commit_group()
        phase = 0
        for layer in range(layers):
            lwo = wo_ptr + layer * (H * A)
            lwg = wgu_ptr + layer * (2 * I * H)
            lwd = wd_ptr + layer * (H * I)
            # qkv = W_qkv @ norm(y + r_a); the o tile is requested first
            _stage(so, lwo, ro, A, 0, BO, A, tile)
            cp.commit_group()
            _wait(bar_ptr, phase * G)
            x = _normed(y_ptr, ra_ptr, rb_ptr, n1_ptr + layer * H, eps, pid, H, row_l)
            cp.wait_group(1)
            _cta_sync()
            _dot_store(sa0, x, qkv_ptr, rq, BG, tile)
            _dot_store(sa1, x, qkv_ptr, rq + BG, BG, tile)
            _arrive(bar_ptr)
            phase += 1
            # o = W_o @ qkv[:A]; the gate_up tiles go into A (read by every thread above)
            _stage(sa0, lwg, pid * BG, H, 0, BG, H, tile)
            _stage(sa1, lwg, (pid + G) * BG, H, 0, BG, H, tile)
            _stage(sa2, lwg, (pid + 2 * G) * BG, H, 0, BG, H, tile)
            cp.commit_group()
            _wait(bar_ptr, phase * G)
            a = _vec(qkv_ptr, A, gl.SliceLayout(0, tile))
            cp.wait_group(1)
            _cta_sync()
            _dot_store(so, a, o_ptr, ro, BO, tile)
            _arrive(bar_ptr)
            phase += 1
            # gate_up = W_gu @ norm(o + r_b); the down tile is requested first
            _stage(sd0, lwd, rd, I, 0, BD, 1024, tile)
            _stage(sd1, lwd, rd, I, 1024, BD, 1024, tile)
            _stage(sd2, lwd, rd, I, 2048, BD, 1024, tile)
            cp.commit_group()
            _wait(bar_ptr, phase * G)
            x = _normed(o_ptr, rb_ptr, ra_ptr, n2_ptr + layer * H, eps, pid, H, row_l)
            cp.wait_group(1)
            _cta_sync()
            _dot_store(sa0, x, gu_ptr, pid * BG, BG, tile)
            _dot_store(sa1, x, gu_ptr, (pid + G) * BG, BG, tile)
            _dot_store(sa2, x, gu_ptr, (pid + 2 * G) * BG, BG, tile)
            _arrive(bar_ptr)
            phase += 1
            # y = W_down @ silu_mul(gate_up); the next layer's qkv tile goes into A
            nxt = (layer + 1) % layers
            _stage(sa0, wq_ptr + nxt * (NQ * H), rq, H, 0, BG, H, tile)
            _stage(sa1, wq_ptr + nxt * (NQ * H), rq + BG, H, 0, BG, H, tile)
            cp.commit_group()
            _wait(bar_ptr, phase * G)
            cp.wait_group(1)
            _cta_sync()
            acc = _down_part(sd0, gu_ptr, 0, I, row_l, tile)
            acc += _down_part(sd1, gu_ptr, 1024, I, row_l, tile)
            acc += _down_part(sd2, gu_ptr, 2048, I, row_l, tile)
            _store_rows(y_ptr, rd, acc, BD, tile)
            _arrive(bar_ptr)
            phase += 1
        cp.wait_group(0)


    @gluon.jit
    def _mbarrier():
        """One initialised mbarrier (one arrival: the `expect` before its copies)."""
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        return bar

    BOX = 256  # TMA box width (elements); every tile is [rows, 256] boxes

    NU = 52  # ring units of [8, 256] bf16 (4 KB): three phases' tiles in flight at most

    @gluon.jit
    def _ring_issue(desc, row0, RB: gl.constexpr, CB: gl.constexpr, ring, base, bar,
                    NU: gl.constexpr):
        """RB row blocks of 8 rows x CB column boxes from (row0, 0) into ring units base..
        (mod NU)."""
        for rb in gl.static_range(RB):
            for cb in gl.static_range(CB):
                tma.async_copy_global_to_shared(desc, [row0 + rb * 8, cb * 256], bar,
                                                ring.index((base + rb * CB + cb) % NU))

    @gluon.jit
    def _phase_wait(bar_ptr, target, NO_SYNC: gl.constexpr):
        if not NO_SYNC:
            _wait(bar_ptr, target)

    @gluon.jit
    def _phase_arrive(bar_ptr, NO_SYNC: gl.constexpr):
        if not NO_SYNC:
            _arrive(bar_ptr)

    @gluon.jit
    def _landed(bar, par, NO_W: gl.constexpr):
        if not NO_W:
            mbarrier.wait(bar, par)

    @gluon.jit
    def _ring_rows(ring, base, xs, out_ptr, row0, RB: gl.constexpr, CB: gl.constexpr,
                   NU: gl.constexpr, layout: gl.constexpr, NO_W: gl.constexpr = False):
        """out[row0 + 8 * RB rows] = units base.. (row blocks of CB boxes) @ xs."""
        for rb in gl.static_range(RB):
            acc = gl.zeros([8, 256], gl.float32, layout)  # one cross-lane sum per row block
            for cb in gl.static_range(CB):
                x = xs.slice(cb * 256, 256).load(gl.SliceLayout(0, layout)).to(gl.float32)
                if NO_W:
                    acc += gl.expand_dims(x, 0) * 0.001
                else:
                    w = ring.index((base + rb * CB + cb) % NU).load(layout).to(gl.float32)
                    acc += w * gl.expand_dims(x, 0)
            _store_rows(out_ptr, row0 + rb * 8, gl.sum(acc, axis=1), 8, layout)

    @gluon.jit
    def _ring_kernel(dq, do, dg, dd, y_ptr, qkv_ptr, o_ptr, gu_ptr, ra_ptr, rb_ptr, n1_ptr,
                     n2_ptr, bar_ptr, layers, eps, G: gl.constexpr, H: gl.constexpr,
                     NQ: gl.constexpr, A: gl.constexpr, I: gl.constexpr, BO: gl.constexpr,
                     BG: gl.constexpr, BD: gl.constexpr, NU: gl.constexpr,
                     num_warps: gl.constexpr, NO_W: gl.constexpr = False,
                     NO_SYNC: gl.constexpr = False):
        """The chain with every phase's tile requested two phases ahead into one ring. NO_W:
        no weight is requested or read (outputs are wrong): the chain's latency floor. NO_SYNC: no
        grid barrier (outputs are wrong): the weight stream's own rate."""
        tile: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        vec_l: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        ring = gl.allocate_shared_memory(gl.bfloat16, [NU, 8, 256], dq.layout)
        xs = gl.allocate_shared_memory(gl.bfloat16, [4096], flat)
        bq = _mbarrier()
        bo = _mbarrier()
        bg = _mbarrier()
        bd = _mbarrier()
        fence_async_shared()
        pid = gl.program_id(0)
        QB: gl.constexpr = 2 * BG // 8  # qkv row blocks (32 rows)
        GB: gl.constexpr = BG // 8      # row blocks per gate_up tile (16 rows)
        CH: gl.constexpr = H // 256
        CA: gl.constexpr = A // 256
        CI: gl.constexpr = I // 256
        UQ: gl.constexpr = QB * CH           # 16 units
        UO: gl.constexpr = CA                # 8
        UG: gl.constexpr = 3 * GB * CH       # 24
        UD: gl.constexpr = CI                # 12
        PER: gl.constexpr = UQ + UO + UG + UD
        UNIT_BYTES: gl.constexpr = 8 * 256 * 2
        rq, ro, rd = pid * 2 * BG, pid * BO, pid * BD
        if not NO_W:
            mbarrier.expect(bq, UQ * UNIT_BYTES)
            _ring_issue(dq, rq, QB, CH, ring, 0, bq, NU)
            mbarrier.expect(bo, UO * UNIT_BYTES)
            _ring_issue(do, ro, 1, CA, ring, UQ, bo, NU)
        phase = 0
        for layer in range(layers):
            par = layer & 1
            c = layer * PER
            nxt = (layer + 1) % layers
            # qkv; gate_up's tiles requested
            if not NO_W:
                mbarrier.expect(bg, UG * UNIT_BYTES)
                for t in gl.static_range(3):
                    _ring_issue(dg, layer * 2 * I + (pid + t * G) * BG, GB, CH, ring,
                                c + UQ + UO + t * GB * CH, bg, NU)
            _phase_wait(bar_ptr, phase * G, NO_SYNC)
            x = _normed(y_ptr, ra_ptr, rb_ptr, n1_ptr + layer * H, eps, pid, H, vec_l)
            xs.slice(0, H).store(x.to(gl.bfloat16))
            _cta_sync()
            _landed(bq, par, NO_W)
            _ring_rows(ring, c, xs, qkv_ptr, rq, QB, CH, NU, tile, NO_W)
            _phase_arrive(bar_ptr, NO_SYNC)
            phase += 1
            # o; down's tile requested (into units the qkv tile and the last down tile left)
            fence_async_shared()
            if not NO_W:
                mbarrier.expect(bd, UD * UNIT_BYTES)
                _ring_issue(dd, layer * H + rd, 1, CI, ring, c + UQ + UO + UG, bd, NU)
            _phase_wait(bar_ptr, phase * G, NO_SYNC)
            xs.slice(0, A).store(gl.load(qkv_ptr + gl.arange(0, A, layout=vec_l),
                                         cache_modifier=".cg"))
            _cta_sync()
            _landed(bo, par, NO_W)
            _ring_rows(ring, c + UQ, xs, o_ptr, ro, 1, CA, NU, tile, NO_W)
            _phase_arrive(bar_ptr, NO_SYNC)
            phase += 1
            # gate_up; the next layer's qkv tile requested
            fence_async_shared()
            if not NO_W:
                mbarrier.expect(bq, UQ * UNIT_BYTES)
                _ring_issue(dq, nxt * NQ + rq, QB, CH, ring, c + PER, bq, NU)
            _phase_wait(bar_ptr, phase * G, NO_SYNC)
            x = _normed(o_ptr, rb_ptr, ra_ptr, n2_ptr + layer * H, eps, pid, H, vec_l)
            xs.slice(0, H).store(x.to(gl.bfloat16))
            _cta_sync()
            _landed(bg, par, NO_W)
            for t in gl.static_range(3):
                _ring_rows(ring, c + UQ + UO + t * GB * CH, xs, gu_ptr, (pid + t * G) * BG, GB,
                           CH, NU, tile, NO_W)
            _phase_arrive(bar_ptr, NO_SYNC)
            phase += 1
            # down; the next layer's o tile requested
            fence_async_shared()
            if not NO_W:
                mbarrier.expect(bo, UO * UNIT_BYTES)
                _ring_issue(do, nxt * H + ro, 1, CA, ring, c + PER + UQ, bo, NU)
            _phase_wait(bar_ptr, phase * G, NO_SYNC)
            for k in gl.static_range(I // 1024):
                offs = k * 1024 + gl.arange(0, 1024, layout=vec_l)
                gate = gl.load(gu_ptr + offs, cache_modifier=".cg").to(gl.float32)
                up = gl.load(gu_ptr + I + offs, cache_modifier=".cg").to(gl.float32)
                act = (gate / (1.0 + gl.exp(-gate))).to(gl.bfloat16).to(gl.float32)
                xs.slice(k * 1024, 1024).store((act * up).to(gl.bfloat16))
            _cta_sync()
            _landed(bd, par, NO_W)
            _ring_rows(ring, c + UQ + UO + UG, xs, y_ptr, rd, 1, CI, NU, tile, NO_W)
            _phase_arrive(bar_ptr, NO_SYNC)
            phase += 1
        _landed(bq, layers & 1, NO_W)  # the unused requests for layer 0 land before the exit
        _landed(bo, layers & 1, NO_W)


class Staged(ChainBuffers):
    """One form's buffers and launch. `tma`: 0 the `cp.async` form; 1 the ring; 2 the ring
    without weights; 3 the ring without barriers."""

    def __init__(self, w: Weights, y0, r0, tma: int = 0):
        super().__init__(y0, r0)
        self.w, self.tma = w, tma
        if tma:
            def desc(t, rows):
                flat = t.reshape(-1, t.shape[-1])
                lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
                return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, BOX],
                                        lay)
            self.descs = tuple(desc(t, 8) for t in (w.wq, w.wo, w.wgu, w.wd))

    def run(self):
        w, common = self.w, dict(G=G, H=HIDDEN, NQ=QKV, A=ATTN, I=INTER, BO=BO, BG=BG, BD=BD,
                                 num_warps=WARPS)
        self.bar.zero_()
        if self.tma:
            _ring_kernel[(G,)](*self.descs, *self.activations(), w.n1, w.n2, self.bar, w.layers,
                               EPS, NU=NU, NO_W=self.tma == 2, NO_SYNC=self.tma == 3, **common)
        else:
            _staged_kernel[(G,)](*self.activations(), w.wq, w.wo, w.wgu, w.wd, w.n1, w.n2,
                                 self.bar, w.layers, EPS, BQ=BQ, **common)
        return self.y, self.ra


def main(argv=None):
    args = chain_parser(__doc__).parse_args(argv)
    if not torch.cuda.is_available() or gluon is None:
        print("persistent_gluon: no CUDA device or no Gluon; nothing to time")
        return 0
    if torch.cuda.get_device_properties(0).multi_processor_count < G:
        print(f"persistent_gluon: needs {G} SMs for its resident programs")
        return 0
    w, y0, r0, out, err = start(args, G)
    for key, form in (("persistent_smem", 0), ("persistent_tma_ring", 1),
                      ("ring_without_weights", 2), ("ring_without_barriers", 3)):
        time_form(out, key, Staged(w, y0, r0, form).run, err, args)
    print(json.dumps(finish(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
