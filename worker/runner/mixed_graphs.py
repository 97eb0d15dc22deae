"""CUDA graphs for small steps that are not decode-only: short prompts, a prompt's last chunk
beside decode rows, several short suffixes after prefix-cache hits (steps of up to
`EngineConfig.graph_max_tokens` tokens).

Why: such a step otherwise runs eagerly, and its host side (about 250 kernel launches from
Python for a 28-layer model) took 15-30 ms on the lent H100 host while its GPU work took 1-3 ms
(`bench/mixed_step.py`), so the GPU idled through every such step.

Owns: static input buffers for up to `max_tokens` tokens and `max_seqs` sequences, one graph
per token bucket (16, 32, 64, ... 512, then 768, 1024, ... up to `max_tokens`), and `run()`,
which copies a step's inputs into the buffers, pads them to the bucket and replays. Each bucket
is captured for `min(bucket, max_seqs)` sequences with `max_query_len = bucket`; the prefill
attention kernel's grid is the step's query tiles (kernels/attention_prefill_plan.py
`prefill_tiles`), so padded sequences (empty queries: `query_start_loc` repeats the token count)
launch no prefill programs (the decode kernel, which takes a step's one-row sequences, gives them
programs that exit at once). Every bucket leaves its sampled rows' logits in the first rows of one
buffer, the largest bucket's output (a copy inside each smaller graph). Held per bucket instead,
`min(bucket, max_seqs) x vocab` each for the pool's life, 36 buckets (8,192 tokens, 256
sequences, a 152k vocabulary) held 1.7 GiB more than 12 did (H200, 2026-11-30). Padding tokens
belong to no sequence, write no KV (slot -1) and are never sampled (padding sample rows read row
0 and are cut off). The graphs share the decode graphs' memory pool and are captured, largest
first, after them; like those, they bake in the KV tensors' addresses (a new pool needs new
graphs) and serve a single rank only.

To extend (e.g. other bucket ladders): change `token_buckets`; kernels used in the forward must
take their launch shapes from tensor shapes and the host-side `max_query_len` only.
"""

from __future__ import annotations

import bisect
import logging
from typing import Callable, Optional

import torch

from infer_cluster.worker.device.graphs import release_graphs
from infer_cluster.worker.models.decoder import AttentionMetadata

log = logging.getLogger(__name__)

MIN_BUCKET = 16
# Past this size the ladder grows by this much, not by doubling: a prompt of 1,100 tokens pads to
# 1,280 (16% more work), not 2,048 (86%), which matters where the GPU, not the host, sets the pace.
LINEAR_FROM = 512


def token_buckets(max_tokens: int) -> list[int]:
    """Powers of two from 16 up to 512, then every 256, up to `max_tokens` (which is added
    when it is not on the ladder)."""
    if max_tokens < MIN_BUCKET:
        return []
    sizes, t = [], MIN_BUCKET
    while t < max_tokens:
        sizes.append(t)
        t = t * 2 if t < LINEAR_FROM else t + LINEAR_FROM // 2
    sizes.append(max_tokens)
    return sizes


class MixedGraphs:
    def __init__(self, forward_sampled: Callable, kv_caches, max_tokens: int, max_seqs: int,
                 max_blocks_per_seq: int, device: torch.device, pool=None):
        """`forward_sampled(input_ids, positions, meta, kv_caches, sample_indices) -> logits of
        the sampled rows` is captured per bucket; `pool`: the decode graphs' memory pool."""
        self.buckets = token_buckets(max_tokens)
        self.max_tokens = self.buckets[-1]
        self.max_seqs = max_seqs
        top_seqs = min(self.max_tokens, max_seqs)
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(self.max_tokens, **i64)
        self.positions = torch.zeros(self.max_tokens, **i64)
        self.slot_mapping = torch.full((self.max_tokens,), -1, **i64)
        self.block_tables = torch.zeros(top_seqs, max_blocks_per_seq, **i32)
        self.seq_lens = torch.zeros(top_seqs, **i32)
        self.query_start_loc = torch.zeros(top_seqs + 1, **i32)
        self.sample_indices = torch.zeros(top_seqs, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.replays = 0  # steps served by a graph (tests check that graphs really ran)
        shared: Optional[torch.Tensor] = None  # the largest bucket's logits: every bucket's output
        torch.cuda.synchronize(device)
        for t in reversed(self.buckets):
            s = min(t, max_seqs)
            meta = AttentionMetadata(self.slot_mapping[:t], self.block_tables[:s], self.seq_lens[:s],
                                     self.query_start_loc[:s + 1], t)
            args = (self.input_ids[:t], self.positions[:t], meta, kv_caches, self.sample_indices[:s])
            forward_sampled(*args)  # warm-up: Triton compiles outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward_sampled(*args)
                if shared is not None:  # into the largest bucket's rows; its own are freed
                    logits = shared[:s].copy_(logits)
            shared = logits if shared is None else shared
            self.outputs[t] = logits
            pool = graph.pool()
            self.graphs[t] = graph
        torch.cuda.synchronize(device)
        log.info("captured mixed-step CUDA graphs for up to %s tokens", self.buckets)

    def can_run(self, num_seqs: int, num_tokens: int, num_sampled: int) -> bool:
        """Whether a step fits a bucket: its tokens, its sequences, and its sampled rows (a
        speculative verify step samples every position of a row; a bucket of t tokens has
        min(t, max_seqs) sample rows)."""
        if not 0 < num_tokens <= self.max_tokens or num_seqs > self.max_seqs:
            return False
        t = self.buckets[bisect.bisect_left(self.buckets, num_tokens)]
        return num_sampled <= min(t, self.max_seqs)

    def run(self, input_ids, positions, meta: AttentionMetadata, sample_indices) -> torch.Tensor:
        """Replay the smallest bucket that holds the step; returns the sampled rows' logits."""
        n, s, k = input_ids.shape[0], meta.seq_lens.shape[0], sample_indices.shape[0]
        t = self.buckets[bisect.bisect_left(self.buckets, n)]
        cap = min(t, self.max_seqs)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n:t].fill_(-1)  # padding tokens write no KV
        self.block_tables[:s, :width].copy_(meta.block_tables, non_blocking=True)
        self.seq_lens[:s].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[s:cap].fill_(0)
        self.query_start_loc[:s + 1].copy_(meta.query_start_loc, non_blocking=True)
        self.query_start_loc[s + 1:cap + 1].fill_(n)  # padding sequences: empty queries
        self.sample_indices[:k].copy_(sample_indices, non_blocking=True)
        self.sample_indices[k:cap].fill_(0)
        self.graphs[t].replay()
        self.replays += 1
        return self.outputs[t][:k]

    def release(self) -> None:
        release_graphs(self.graphs, self.outputs)


def build_mixed_graphs(forward_sampled, kv_caches, max_tokens: int, max_seqs: int, max_blocks_per_seq: int,
                       device: torch.device, pool) -> Optional[MixedGraphs]:
    """The mixed-step graphs, or None when `max_tokens` is below the smallest bucket (off)."""
    if not token_buckets(max_tokens):
        return None
    return MixedGraphs(forward_sampled, kv_caches, max_tokens, max_seqs, max_blocks_per_seq, device, pool)
