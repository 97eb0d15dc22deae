"""Fused KV append: scatter new K and V rows into the paged cache by slot mapping.

Shapes: key/value `[num_tokens, num_kv_heads, head_dim]`; caches
`[num_blocks, block_size, num_kv_heads, head_dim]`; `slot_mapping[i]` = block_id * block_size +
offset, or -1 for a padded token (skipped). Reference here; the Triton kernel lives beside it.
"""

from __future__ import annotations


from .dispatch import use_triton


def kv_append_ref(key, value, k_cache, v_cache, slot_mapping) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = key[valid].to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = value[valid].to(v_cache.dtype)


def kv_append(key, value, k_cache, v_cache, slot_mapping) -> None:
    if use_triton(key):
        from .kv_append_triton import kv_append_triton
        return kv_append_triton(key, value, k_cache, v_cache, slot_mapping)
    return kv_append_ref(key, value, k_cache, v_cache, slot_mapping)
