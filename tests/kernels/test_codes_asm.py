"""The PTX that turns int8 KV codes into fp16 MMA operands (`codes_f16_asm`), run on the CPU by a
small emulator of its four instructions (xor, prmt, mov, sub.f16x2): every code comes out as its
exact fp16 value, in the pairing each selector promises. The GPU tests check the kernels that
use it; this pins the byte logic itself, code by code."""

import numpy as np
import pytest

from infer_cluster.kernels.attention_decode_gluon import PAIRS_F16_ASM
from infer_cluster.kernels.attention_int8_triton import CODES_F16_ASM


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX `prmt.b32` in its default mode: byte i of the result is byte (sel's nibble i & 7) of
    the 8 bytes {b, a} (a the low four); bit 3 of a nibble replicates that byte's sign."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _sub_f16x2(x: int, y: int) -> tuple:
    """PTX `sub.f16x2`: the two fp16 halves of x minus those of y, as float values (lo, hi)."""
    halves = np.array([x & 0xFFFF, x >> 16, y & 0xFFFF, y >> 16], dtype=np.uint16).view(np.float16)
    return float(halves[0] - halves[2]), float(halves[1] - halves[3])


def _run(asm: str, word: int) -> tuple:
    """The asm's two output registers for input register `word`, as four fp16 values."""
    lines = [ln.strip().rstrip(";") for ln in asm.strip().strip("{}").splitlines() if ln.strip()]
    regs = {"$2": word}
    outs = {}
    for ln in lines:
        op, args = ln.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        val = (lambda t: regs[t] if t in regs else int(t, 16))
        if op == ".reg":
            continue
        if op == "xor.b32":
            regs[a[0]] = val(a[1]) ^ val(a[2])
        elif op == "mov.b32":
            regs[a[0]] = val(a[1])
        elif op == "prmt.b32":
            regs[a[0]] = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "sub.f16x2":
            outs[a[0]] = _sub_f16x2(val(a[1]), val(a[2]))
        else:
            raise AssertionError(f"instruction the emulator does not know: {ln}")
    return outs["$0"] + outs["$1"]


def _words(n: int = 4000, seed: int = 0):
    """Registers of four int8 codes: random ones plus every code in every byte (with the
    extremes -128, -127, 0, 127 beside it)."""
    rng = np.random.default_rng(seed)
    codes = [rng.integers(-128, 128, size=4) for _ in range(n)]
    for c in range(-128, 128):
        for pos in range(4):
            w = np.array([-128, 127, 0, -127])
            w[pos] = c
            codes.append(w)
    for c in codes:
        yield int.from_bytes(np.asarray(c, dtype=np.int8).tobytes(), "little"), [int(x) for x in c]


@pytest.mark.parametrize("asm, order", [
    (CODES_F16_ASM.value, (0, 1, 2, 3)),   # codes in order: (c0, c1), (c2, c3)
    (PAIRS_F16_ASM.value, (0, 2, 1, 3)),   # 16-bit pairs [a0 a1][b0 b1]: (a0, b0), (a1, b1)
], ids=["in-order", "pairs"])
def test_codes_become_their_exact_fp16_values(asm, order):
    for word, codes in _words():
        assert _run(asm, word) == tuple(float(codes[i]) for i in order), (hex(word), codes)
