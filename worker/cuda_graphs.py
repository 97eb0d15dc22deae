"""CUDA graphs for decode steps (one new token per sequence).

Owns: static input buffers sized for `max_num_seqs` decodes with block tables as wide as
`max_model_len` needs, one captured graph per batch size in a ladder (1, 2, 4, 8, then steps of
16), and `run()`, which copies a step's inputs into the buffers, pads the batch up to the next
captured size (padding rows write no KV: slot -1) and replays. All graphs share one memory
pool, captured largest first. Kernels must pick their launch shapes from tensor shapes only
(never from values), which `kernels/` guarantees for decode.
"""

from __future__ import annotations

import bisect
import logging

import torch

from .models.decoder import AttentionMetadata

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, forward_logits, kv_caches, max_batch: int, max_blocks_per_seq: int,
                 device: torch.device):
        """`forward_logits(input_ids, positions, meta, kv_caches) -> logits` is captured."""
        self.max_batch = max_batch
        self.sizes = capture_sizes(max_batch)
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(max_batch, **i64)
        self.positions = torch.zeros(max_batch, **i64)
        self.slot_mapping = torch.full((max_batch,), -1, **i64)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, **i32)
        self.seq_lens = torch.ones(max_batch, **i32)
        self.query_start_loc = torch.arange(max_batch + 1, **i32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        torch.cuda.synchronize(device)
        for bs in reversed(self.sizes):
            meta = AttentionMetadata(self.slot_mapping[:bs], self.block_tables[:bs], self.seq_lens[:bs],
                                     self.query_start_loc[:bs + 1], 1)
            args = (self.input_ids[:bs], self.positions[:bs], meta, kv_caches)
            forward_logits(*args)  # warm-up: Triton compiles/autotunes outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = forward_logits(*args)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def can_run(self, num_seqs: int, max_query_len: int, num_tokens: int, num_sampled: int) -> bool:
        return (max_query_len == 1 and num_tokens == num_seqs == num_sampled
                and num_seqs <= self.max_batch)

    def run(self, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        n = input_ids.shape[0]
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        if bs > n:  # padding rows: attend to one (stale) slot, write nothing
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].fill_(1)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
