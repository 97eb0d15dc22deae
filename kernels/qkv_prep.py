"""Attention input prep in one op: q/k RMSNorm (optional), rotary, and the KV cache append.

`qkv_prep(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, ...)` takes the
fused projection output `qkv [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]` (q, then k,
then v, head-major), and
- returns q `[num_tokens, num_heads, head_dim]`: RMS-normed over head_dim with `q_norm_weight`
  (Qwen3) when given, then rotated (rotate-half layout, `kernels/rotary.py`);
- writes k (normed with `k_norm_weight` when given, rotated) and v into the paged caches at
  `slot_mapping` (-1 = padding: nothing written), quantized to int8 with per-row float32 scales
  when the cache is int8 (rule and shapes in `kernels/kv_append.py`).

The reference below IS the composition the decoder used before the fusion (`rms_norm_ref`,
`apply_rotary_ref`, `kv_append_ref`), so CPU runs keep their exact numerics; the Triton kernel
beside it rounds at the same points (see `qkv_prep_triton.py`). The returned q may be a view of
`qkv` (the Triton path rotates q in place there) or a new tensor (the reference, with norms): the
attention kernels take any strides. `qkv` itself may be modified; callers must not reuse it.
Must never allocate data-dependent memory or sync with the host on the Triton path (it runs
inside CUDA graphs). To extend (e.g. partial rotary or an fp8 cache), change the reference first,
then the kernel, and add a case to tests/kernels/test_qkv_prep.py.
"""

from __future__ import annotations

from .dispatch import use_triton
from .kv_append import kv_append_ref
from .norm import rms_norm_ref
from .rotary import apply_rotary_ref


def split_qkv(qkv, num_heads: int, num_kv_heads: int, head_dim: int):
    """Views q `[n, num_heads, D]`, k and v `[n, num_kv_heads, D]` of a fused projection output."""
    n = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != q_size + 2 * kv_size:
        raise ValueError(f"qkv must be [num_tokens, {q_size + 2 * kv_size}] for {num_heads} query "
                         f"heads, {num_kv_heads} KV heads of dim {head_dim}; "
                         f"got {tuple(qkv.shape)}")
    q = qkv[:, :q_size].view(n, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(n, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size:].view(n, num_kv_heads, head_dim)
    return q, k, v


def _check_norms(q_norm_weight, k_norm_weight, head_dim: int) -> None:
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight go together: give both or neither")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None and tuple(w.shape) != (head_dim,):
            raise ValueError(f"{name} must be [{head_dim}], got {tuple(w.shape)}")


def qkv_prep_ref(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                 q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None, v_scale=None, *,
                 num_heads: int, num_kv_heads: int, head_dim: int):
    _check_norms(q_norm_weight, k_norm_weight, head_dim)
    q, k, v = split_qkv(qkv, num_heads, num_kv_heads, head_dim)
    if q_norm_weight is not None:
        q, k = rms_norm_ref(q, q_norm_weight, eps), rms_norm_ref(k, k_norm_weight, eps)
    apply_rotary_ref(q, k, positions, cos_cache, sin_cache)
    kv_append_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def qkv_prep(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
             q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None, v_scale=None, *,
             num_heads: int, num_kv_heads: int, head_dim: int):
    """Dispatch: one Triton launch on CUDA, the old three-to-four-op composition elsewhere."""
    args = (qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
            q_norm_weight, k_norm_weight, eps, k_scale, v_scale)
    shape = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
    if use_triton(qkv):
        from .qkv_prep_triton import qkv_prep_triton
        return qkv_prep_triton(*args, **shape)
    return qkv_prep_ref(*args, **shape)
