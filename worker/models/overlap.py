"""Tensor-parallel decode with each all-reduce overlapped by the other half-batch's compute.

Owns: `overlap_min_rows()` (the `INFER_CLUSTER_TP_OVERLAP` switch), `split_point` (whether a
step splits, and where), `split_meta` (a decode step's attention metadata cut into two row
ranges) and `forward_overlapped` (`DecoderModel.forward` over two half-batches). At T > 1 every layer ends two row-parallel linears with an all-reduce
that the next op needs; on a decode step of many rows they cost up to ~1.9 ms of an 8.5 ms step
(Llama-3-8B shape, 2× H200, bench/RESULTS.md). Cut the rows in two halves A and B, and each
half's all-reduce can run (on a side stream, `ParallelState.all_reduce_async`) while the other
half computes:

    A attention | B attention | A mlp | B mlp | A attention (next layer) ...
          A's o-sum ---^    B's o-sum ---^   A's down-sum ---^ ...

Each half reads the layer's weights once more, so it pays only where the step is compute-bound
or the all-reduces are long: many rows. Rows are independent in every op, so each row's result
is the one-batch forward's up to the GEMM's summation order. Decode steps only (one query row
per sequence, rows in sequence order), one pipeline stage (the model has the embedding and the
LM head), T > 1. Off unless `INFER_CLUSTER_TP_OVERLAP` gives the fewest rows to split (for
example 128); read when a runner is built. To extend (a split of prefill rows): `split_meta`
must then cut `query_start_loc` by tokens and keep each sequence in one half.
"""

from __future__ import annotations

import os

import torch

from .decoder import AttentionMetadata

ENV = "INFER_CLUSTER_TP_OVERLAP"


def overlap_min_rows() -> int:
    """The fewest decode rows that take the overlapped forward (`INFER_CLUSTER_TP_OVERLAP`, a row
    count >= 2); 0 when unset, 0 or off."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return 0
    try:
        rows = int(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a row count (e.g. 128) or 0/off, got {raw!r}") from None
    if rows < 2:
        raise ValueError(f"{ENV} must be at least 2 rows (two halves), got {rows}")
    return rows


def split_point(n: int, meta: AttentionMetadata, min_rows: int) -> int:
    """Where a step of `n` token rows splits: n // 2 for a decode step (one row per sequence) of
    at least `min_rows` rows, 0 (no split) otherwise or when `min_rows` is 0."""
    decode = meta.max_query_len == 1 and meta.seq_lens.shape[0] == n
    return n // 2 if min_rows and decode and n >= max(min_rows, 2) else 0


def split_meta(meta: AttentionMetadata, split: int) -> tuple[AttentionMetadata, AttentionMetadata]:
    """A decode step's metadata (sequence i owns row i) as rows [0, split) and [split, n)."""
    qsl = meta.query_start_loc
    second = qsl[split:] - qsl[split]  # a device op: graph-safe, no host read
    return (AttentionMetadata(meta.slot_mapping[:split], meta.block_tables[:split],
                              meta.seq_lens[:split], qsl[:split + 1], meta.max_query_len),
            AttentionMetadata(meta.slot_mapping[split:], meta.block_tables[split:],
                              meta.seq_lens[split:], second, meta.max_query_len))


def forward_overlapped(model, input_ids, positions, meta: AttentionMetadata, kv_caches, split: int):
    """`model.forward(..., final_norm=False)` of a decode step as two half-batches whose
    all-reduces overlap the other half's work. Returns (hidden, residual) of all rows."""
    if not (model.is_first and model.is_last):
        raise ValueError("the overlapped forward needs the whole model on one stage (P=1)")
    n = input_ids.shape[0]
    if split_point(n, meta, 2) == 0 or not 0 < split < n:
        raise ValueError(f"the overlapped forward splits decode steps only (one row per sequence); "
                         f"got {n} rows, {meta.seq_lens.shape[0]} sequences, split {split}")
    ps, rope = model.ps, model.rope_cache
    hidden = model.embed_tokens(input_ids)
    rows = (slice(0, split), slice(split, n))
    metas = split_meta(meta, split)
    pos = [positions[r] for r in rows]
    h = [hidden[r] for r in rows]
    res: list = [None, None]
    pending: list = [None, None]
    for layer, kv_cache in zip(model.layers, kv_caches):
        o_proj, down = layer.self_attn.o_proj, layer.mlp.down_proj
        for i in (0, 1):
            if pending[i] is not None:
                h[i] = pending[i].wait()
            part, res[i] = layer.attention_partial(h[i], res[i], pos[i], metas[i], kv_cache, rope)
            pending[i] = ps.all_reduce_async(part, o_proj.finish)
        for i in (0, 1):
            part, res[i] = layer.mlp_partial(pending[i].wait(), res[i])
            pending[i] = ps.all_reduce_async(part, down.finish)
    h = [p.wait() for p in pending]
    return torch.cat(h), torch.cat(res)
