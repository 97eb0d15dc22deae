"""Pieces both paged attention kernels share: the tl.dot wrapper and the dtype policy.

Owns: `_dot` (a tile product: operands in fp16/bf16 on CUDA, float32 with input_precision="ieee"
elsewhere), `_dot_mode` (picks its LOWP/DOT_DTYPE constexprs from q and the cache dtype),
`_int8_operand` (int8 KV codes to dot operands), `_load_scales` (a tile's per-token int8 scales),
`_TL_DTYPES` (the supported dtypes, which `_check` enforces) and `_LOG2E` (exponentials are base 2, the scale folded into
log2(e)). Must never import the decode, prefill or entry modules: they all import this one, and
keeping it a leaf keeps the package free of import cycles.

Numerics: scores, softmax statistics and accumulators are float32. On CUDA with fp16/bf16 inputs
the tl.dot operands stay in that dtype (probabilities are cast to it for P@V, as usual); in
float32 or on the CPU interpreter the dots run in float32 with input_precision="ieee" (the
interpreter's bf16 math is wrong). int8 KV caches: codes become fp16 dot operands on CUDA
(whatever the model dtype: exact for |code| <= 127, and made by integer arithmetic rather than
the slow int->float conversion, which would cost more than the bytes it saves) and float32
elsewhere; the per-token scales multiply score columns (K) and probability columns (V) in
float32, so an int8 tile is never dequantized in full. To extend: put here only what both kernels use (a new dtype
goes into `_TL_DTYPES` and `_dot_mode`); a helper for one kernel lives in that kernel's module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _dot(a, b, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    if LOWP:
        res = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))
    else:
        res = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return res


# How `_int8_operand` turns int8 codes into fp16 operands on CUDA (the decode kernel takes one
# per operand, K and V, from `decode_config`'s "cvt"; prefill uses OP_ADD):
OP_ADD = 0        # int32 add of 0x6480, truncate, bitcast, fp16 subtract, per element
OP_PRMT = 1       # inline PTX on 4 packed codes (`_codes_prmt`); the compiler moves it into the
#                   dot-operand layout, like OP_ADD
OP_CAST = 2       # plain int8 -> fp16 conversion (I2F)
OP_PRMT_LOAD = 3  # OP_PRMT kept in the tile's load layout (asm marked impure so the compiler
#                   cannot move it): a transposed operand then goes to the MMA as fp16 through
#                   shared memory (ldmatrix.trans) instead of being gathered byte by byte
OP_WORDS = 4      # decode only: the tile read as int32 words (attention_decode_triton._load_words)


@triton.jit
def _codes_prmt(codes, PURE: tl.constexpr):
    """fp16 values of int8 codes, 4 per asm instance: code ^ 0x80 is the byte code + 128; two
    PRMTs put each byte under a 0x64 high byte (the fp16 1024 + code + 128, exact: spacing 1 in
    [1024, 2048)) and one packed subtract per pair removes 1152. PURE False pins the conversion
    to the layout the codes arrive in (see OP_PRMT_LOAD). CUDA only (no interpreter)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 u, c;
        xor.b32 u, $2, 0x80808080;
        mov.b32 c, 0x64806480;
        prmt.b32 $0, u, 0x64646464, 0x5140;
        prmt.b32 $1, u, 0x64646464, 0x7362;
        sub.f16x2 $0, $0, c;
        sub.f16x2 $1, $1, c;
        }""",
        constraints="=r,=r,r", args=[codes], dtype=tl.float16, is_pure=PURE, pack=4)


@triton.jit
def _int8_operand(codes, LOWP: tl.constexpr, OP: tl.constexpr = 0, ASM: tl.constexpr = False):
    """int8 codes as exact dot operands. LOWP: fp16, made as OP says (OP_*); the asm methods
    need ASM (real CUDA, not the interpreter) and are OP_ADD otherwise. OP_ADD: code + 1152 as
    an fp16 bit pattern is 0x6480 + code (fp16 spacing is 1 in [1024, 2048)), so one integer
    add and one fp16 subtract per element. Not LOWP: float32."""
    if LOWP:
        if (OP == 1 or OP == 3) and ASM:
            res = _codes_prmt(codes, OP == 1)
        elif OP == 2:
            res = codes.to(tl.float16)
        else:
            bits = (codes.to(tl.int32) + 0x6480).to(tl.int16)
            res = bits.to(tl.float16, bitcast=True) - 1152.0
    else:
        res = codes.to(tl.float32)
    return res


@triton.jit
def _load_scales(ptrs, mask, HAS_MASK: tl.constexpr):
    """float32 per-token scales of a K or V tile; masked lanes read 0 (their scores are -inf
    and their probabilities 0 already)."""
    if HAS_MASK:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


def _dot_mode(q, kv_dtype=None):
    """(LOWP, DOT_DTYPE): native half-precision dots on CUDA, float32 everywhere else. With an
    int8 cache the CUDA dots run in fp16 (see `_int8_operand`)."""
    lowp = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if not lowp:
        return False, tl.float32
    return True, (tl.float16 if kv_dtype == torch.int8 else _TL_DTYPES[q.dtype])
