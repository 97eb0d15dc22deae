"""`DynamicContext`: the paged KV tensors of one replica (this rank's layers) and the
conversion of a `SchedulerOutput` into the per-step tensors the model reads.

Owns: KV tensors per layer, `[num_blocks, block_size, num_kv_heads, head_dim]` for K and V, and
`prepare()`, which builds input ids, positions and `AttentionMetadata` (slot mapping, block
tables, sequence lengths, query start offsets) plus the rows whose logits are sampled. Host
lists are turned into tensors once and copied to the device in one non-blocking transfer each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models.decoder import AttentionMetadata
from .scheduler import SchedulerOutput


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor    # rows of the flat batch whose logits are sampled
    sample_request_ids: list[str]   # request of each sampled row, same order


class DynamicContext:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        bs = self.block_size
        input_ids, positions, slots, seq_lens, qsl, sample_rows, sample_ids = [], [], [], [], [0], [], []
        max_blocks = max(len(r.block_ids) for r in out.requests)
        tables = []
        max_q = 0
        for r in out.requests:
            n = len(r.token_ids)
            start = r.start_position
            input_ids.extend(r.token_ids)
            positions.extend(range(start, start + n))
            blocks = r.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, start + n))
            seq_lens.append(start + n)
            qsl.append(qsl[-1] + n)
            tables.append(blocks + [0] * (max_blocks - len(blocks)))
            max_q = max(max_q, n)
            if r.needs_sample:
                sample_rows.append(qsl[-1] - 1)
                sample_ids.append(r.request_id)
        dev = self.device
        pin = dev.type == "cuda"

        def to_dev(values, dtype):
            t = torch.tensor(values, dtype=dtype, pin_memory=pin)
            return t.to(dev, non_blocking=True) if pin else t

        meta = AttentionMetadata(slot_mapping=to_dev(slots, torch.int64),
                                 block_tables=to_dev(tables, torch.int32),
                                 seq_lens=to_dev(seq_lens, torch.int32),
                                 query_start_loc=to_dev(qsl, torch.int32),
                                 max_query_len=max_q, max_seq_len=max(seq_lens))
        return StepInputs(input_ids=to_dev(input_ids, torch.int64), positions=to_dev(positions, torch.int64),
                          meta=meta, sample_indices=to_dev(sample_rows, torch.int64),
                          sample_request_ids=sample_ids)
