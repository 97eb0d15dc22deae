"""int8 KV codes to fp16 tl.dot operands: the conversion methods both attention kernels choose from.

Owns: the OP_* methods, `CVT_MODES` (a config's "cvt" name -> (K method, V method)),
`_int8_operand` (codes already loaded -> operands), `_load_words` (a tile read as int32 words and
converted whole), `_kv_operand` (a K/V tile from its row pointers, float or int8, by method),
`_load_scales` and `word_rows` (whether a cache can be read as words). Must never import the
decode, prefill or entry modules (they import this one) and never dequantize a whole tile to
float32: scales are applied to score / probability columns by the kernels.

Why several methods: V is the transposed operand of P@V (tokens are its reduction axis). Codes
converted in the MMA operand layout (add, prmt, cast) are gathered from shared memory byte by
byte, as there is no 8-bit ldmatrix.trans on sm_90; converted in their load layout (prmt_load,
words) they go to the MMA as fp16 through ldmatrix(.trans), like a bf16 tile (docs/kernels.md).
OP_MMA (SageAttention's idea) skips the K conversion altogether: the program quantizes its q
tile to int8 once (`_quant_rows`, per row) and q @ K^T runs on int8 tensor cores (`_mma_scores`),
the q scales joining the K scales on the score columns; P@V stays fp16 (OP_MMA is a K method).
It changes the numerics (q is rounded to 8 bits: score errors of about absmax(q)/254 * |k|_1
per row, before the softmax scale), which the fp16 methods do not.
To extend: a new method is an OP_* constant handled in `_int8_operand` or `_kv_operand`, a
`CVT_MODES` entry, an exactness test (tests/kernels/test_attention_int8.py) and a row in
bench/ptxas_check.py --int8-variants.
"""

from __future__ import annotations

import triton
import triton.language as tl

OP_ADD = 0        # int32 add of 0x6480, truncate, bitcast, fp16 subtract, per element
OP_PRMT = 1       # inline PTX on 4 packed codes (`_codes_prmt`); the compiler moves it into the
#                   dot-operand layout, like OP_ADD
OP_CAST = 2       # plain int8 -> fp16 conversion (I2F)
OP_PRMT_LOAD = 3  # OP_PRMT kept in the tile's load layout (asm marked impure so the compiler
#                   cannot move it): a transposed operand then goes to the MMA as fp16 through
#                   shared memory (ldmatrix.trans) instead of being gathered byte by byte
OP_WORDS = 4      # the tile read as int32 words and converted whole (`_load_words`)
OP_MMA = 5        # K only: codes stay int8; q is quantized to int8 per row (`_quant_rows`) and
#                   q @ K^T runs on int8 tensor cores with int32 accumulation (`_mma_scores`)

# "cvt" -> (K method, V method). Pairs mix methods per operand: K is not transposed for
# q @ K^T (its codes are contiguous along the reduction axis), V is.
CVT_MODES = {"add": (OP_ADD, OP_ADD), "prmt": (OP_PRMT, OP_PRMT), "cast": (OP_CAST, OP_CAST),
             "prmt_load": (OP_PRMT_LOAD, OP_PRMT_LOAD), "prmt_v": (OP_PRMT, OP_PRMT_LOAD),
             "words": (OP_WORDS, OP_WORDS), "words_v": (OP_PRMT, OP_WORDS),
             "words_k": (OP_WORDS, OP_PRMT_LOAD), "load_k_words_v": (OP_PRMT_LOAD, OP_WORDS),
             "add_k_words_v": (OP_ADD, OP_WORDS),
             "mma_k": (OP_MMA, OP_PRMT_LOAD), "mma_k_words_v": (OP_MMA, OP_WORDS)}


# An int8 tl.dot needs a reduction of at least 32: q @ K^T reduces over the (padded) head dim.
MMA_MIN_HEAD_DIM = 32


def cvt_ops(cvt, k_cache, v_cache):
    """(OP_K, OP_V) for a config's "cvt"; OP_WORDS falls back to OP_ADD for a cache whose rows
    cannot be read as int32 words, OP_MMA to OP_PRMT_LOAD for heads narrower than
    `MMA_MIN_HEAD_DIM` (after padding to a power of two). Raises ValueError for an unknown name."""
    if cvt not in CVT_MODES:
        raise ValueError(f"int8 cvt={cvt!r}: expected one of {sorted(CVT_MODES)}")
    op_k, op_v = CVT_MODES[cvt]
    if op_k == OP_MMA and triton.next_power_of_2(k_cache.shape[-1]) < MMA_MIN_HEAD_DIM:
        op_k = OP_PRMT_LOAD
    op_k = OP_ADD if op_k == OP_WORDS and not word_rows(k_cache) else op_k
    op_v = OP_ADD if op_v == OP_WORDS and not word_rows(v_cache) else op_v
    return op_k, op_v


def word_rows(cache) -> bool:
    """Whether a cache's (token, head) rows can be read as int32 words (OP_WORDS)."""
    st = cache.stride()
    return st[3] == 1 and all(x % 4 == 0 for x in st[:3]) and cache.data_ptr() % 4 == 0


def codes_f16_asm(sel_lo: int, sel_hi: int) -> str:
    """PTX for 4 int8 codes (one 32-bit register in, two out) to fp16 values: code ^ 0x80 is the
    byte code + 128; two PRMTs put the bytes the selectors pick under a 0x64 high byte (the fp16
    1024 + code + 128, exact: spacing 1 in [1024, 2048)) and one packed subtract per pair
    removes 1152. The selectors pick which codes pair up in each output register."""
    return f"""{{
        .reg .b32 u, c;
        xor.b32 u, $2, 0x80808080;
        mov.b32 c, 0x64806480;
        prmt.b32 $0, u, 0x64646464, {sel_lo:#x};
        prmt.b32 $1, u, 0x64646464, {sel_hi:#x};
        sub.f16x2 $0, $0, c;
        sub.f16x2 $1, $1, c;
        }}"""


# Codes in order: bytes 0, 1 into the first register and 2, 3 into the second. Shared with the
# Gluon kernels (kernels/attention_decode_gluon.py).
CODES_F16_ASM = tl.constexpr(codes_f16_asm(0x5140, 0x7362))


@triton.jit
def _codes_prmt(codes, PURE: tl.constexpr):
    """fp16 values of int8 codes, 4 per asm instance (`CODES_F16_ASM`). PURE False pins the
    conversion to the layout the codes arrive in (see OP_PRMT_LOAD). CUDA only (no
    interpreter)."""
    return tl.inline_asm_elementwise(asm=CODES_F16_ASM, constraints="=r,=r,r", args=[codes],
                                     dtype=tl.float16, is_pure=PURE, pack=4)


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
def _byte_fp16(words, SHIFT: tl.constexpr):
    """fp16 value of the signed byte at bit SHIFT of each int32 word (0x6400 | (byte ^ 0x80) is
    the fp16 bit pattern of 1024 + code + 128)."""
    byte = ((words >> SHIFT) & 0xFF) ^ 0x80
    return (byte | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0


@triton.jit
def _load_words(rows, n_mask, MASKED: tl.constexpr, BLOCK_D: tl.constexpr, ASM: tl.constexpr):
    """OP_WORDS: an int8 [BLOCK_N, BLOCK_D] tile (row pointers `rows`, unit d stride) read as
    [BLOCK_N, BLOCK_D // 4] int32 words and returned as fp16 codes (masked rows: code 0). ASM
    (CUDA): the `_codes_prmt` arithmetic on whole words; otherwise the same bits by shifts and
    masks (interpreter). The join/reshape puts the codes back in order; that shape change also
    keeps the conversion in the load layout (see OP_PRMT_LOAD)."""
    offs_w = tl.arange(0, BLOCK_D // 4)
    ptrs = rows.to(tl.pointer_type(tl.int32))[:, None] + offs_w[None, :]
    if MASKED:
        words = tl.load(ptrs, mask=n_mask[:, None], other=0)
    else:
        words = tl.load(ptrs)
    if ASM:
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 u, c, a, b;
            xor.b32 u, $4, 0x80808080;
            mov.b32 c, 0x64806480;
            prmt.b32 a, u, 0x64646464, 0x5140;
            prmt.b32 b, u, 0x64646464, 0x7362;
            sub.f16x2 a, a, c;
            sub.f16x2 b, b, c;
            mov.b32 {$0, $1}, a;
            mov.b32 {$2, $3}, b;
            }""",
            constraints="=h,=h,=h,=h,r", args=[words],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        c0 = _byte_fp16(words, 0)
        c1 = _byte_fp16(words, 8)
        c2 = _byte_fp16(words, 16)
        c3 = _byte_fp16(words, 24)
    # join(a, b) adds a minor axis: [.., i, j] is (a, b)[j][.., i], so this is c0 c1 c2 c3.
    return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (words.shape[0], BLOCK_D))


@triton.jit
def _load_masked(ptrs, mask, HAS_MASK: tl.constexpr):
    if HAS_MASK:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _kv_operand(rows, offs_d, n_mask, kv_mask, s_d, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
                LOWP: tl.constexpr, KV_INT8: tl.constexpr, OP: tl.constexpr, ASM: tl.constexpr):
    """A K or V tile [BLOCK_N, BLOCK_D] from its row pointers, ready for tl.dot: float caches as
    loaded, int8 codes converted by OP. OP_WORDS applies with LOWP and EVEN_D and assumes a
    unit d stride and word-aligned rows (launchers pass it only then, `cvt_ops`)."""
    HAS_MASK: tl.constexpr = MASKED or not EVEN_D
    if KV_INT8 and LOWP and EVEN_D and OP == 4:
        x = _load_words(rows, n_mask, MASKED, offs_d.shape[0], ASM)
    else:
        x = _load_masked(rows[:, None] + offs_d[None, :] * s_d, kv_mask, HAS_MASK)
        if KV_INT8 and OP != 5:  # OP_MMA: the codes go to the int8 MMA as they are
            x = _int8_operand(x, LOWP, OP, ASM)
    return x


@triton.jit
def _quant_rows(x):
    """OP_MMA's q: (codes int8 [M, D], scale float32 [M]) with x ~= codes * scale[:, None]:
    symmetric per row, scale = absmax / 127, codes = floor(x * 127 / absmax + 0.5) clamped to
    [-127, 127] (an all-zero row: codes 0, scale 0), the KV append rule, so
    `kv_append.quantize_int8_ref` is its reference."""
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    # IEEE division (CUDA's `/` on float32 is approximate), as the KV append kernel does
    inv = tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.where(amax > 0.0, amax, 1.0))
    inv = tl.where(amax > 0.0, inv, 0.0)
    r = tl.floor(x * inv[:, None] + 0.5)
    codes = tl.minimum(tl.maximum(r, -127.0), 127.0).to(tl.int8)
    return codes, tl.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))


@triton.jit
def _mma_scores(q_codes, k_codes, row_scale, k_scale):
    """OP_MMA scores: int8 q codes [M, D] @ int8 K codes [N, D]^T on int8 tensor cores (int32
    accumulation, exact), then row_scale[:, None] (q scale, times the softmax scale) and
    k_scale[None, :] (per-token K scales) in float32."""
    s = tl.dot(q_codes, tl.trans(k_codes), out_dtype=tl.int32)
    return s.to(tl.float32) * row_scale[:, None] * k_scale[None, :]


@triton.jit
def _load_scales(ptrs, mask, HAS_MASK: tl.constexpr):
    """float32 per-token scales of a K or V tile; masked lanes read 0 (their scores are -inf
    and their probabilities 0 already)."""
    if HAS_MASK:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x
