"""Kernels: each public op dispatches to Triton on CUDA and to its plain-torch reference elsewhere.

Owns: fused KV append, paged attention (prefill / chunked prefill / decode), RMSNorm (+ fused
residual), rotary embedding, the fused attention input prep (q/k norm + rotary + KV append,
`qkv_prep`), SiLU-and-mul, small-batch linears (`linear_small`, decode GEMVs), and the host KV
tier's block swap (`kv_swap`). To add a kernel: write `<op>.py` with `<op>_ref` and
the dispatching `<op>`, put the Triton version in `<op>_triton.py`, and test it against the
reference under `TRITON_INTERPRET=1`.
"""

from .activation import silu_and_mul, silu_and_mul_ref
from .attention import paged_attention, paged_attention_ref
from .gemv import linear_small, linear_small_ref, silu_mul_linear_small, silu_mul_linear_small_ref
from .kv_append import kv_append, kv_append_ref
from .kv_swap import SwapLayout, kv_swap, kv_swap_ref
from .norm import rms_norm, rms_norm_ref
from .qkv_prep import qkv_prep, qkv_prep_ref
from .rotary import apply_rotary, apply_rotary_ref, build_rope_cache

__all__ = ["silu_and_mul", "silu_and_mul_ref", "paged_attention", "paged_attention_ref",
           "kv_append", "kv_append_ref", "SwapLayout", "kv_swap", "kv_swap_ref", "rms_norm",
           "rms_norm_ref", "qkv_prep", "qkv_prep_ref", "apply_rotary", "apply_rotary_ref",
           "build_rope_cache", "linear_small", "linear_small_ref", "silu_mul_linear_small",
           "silu_mul_linear_small_ref"]
