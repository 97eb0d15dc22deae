"""`DynamicContext`: the paged KV tensors of one replica (this rank's layers) and the
conversion of a `SchedulerOutput` into the per-step tensors the model reads.

Owns: KV tensors per layer (`LayerKV`): `[num_blocks, block_size, num_kv_heads, head_dim]` for
K and V in the model dtype, or int8 plus float32 scales `[num_blocks, num_kv_heads, block_size]`
for K and V (`kv_cache_dtype="int8"`; the scales sit beside the blocks under the same block ids,
so prefix caching and preemption need nothing extra), their size per block, and
`prepare()`, which builds input ids, positions and `AttentionMetadata` (slot mapping, block
tables, sequence lengths, query start offsets) plus the rows whose logits are sampled, from the
token-level rows of worker/runner/step_rows.py. Host
lists are packed into one buffer and sent to the device at once: a non-blocking pinned copy, or
the caller's `upload` (with a host KV tier: a zero-copy read, worker/device/upload.py).
Rows marked `pending_input` (async scheduling) take their input id on the device from the
previous step's sampled ids (`prev_ids[prev_rows[j]]`), with no host round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.models.decoder import AttentionMetadata, LayerKV
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.runner.step_rows import step_rows
from infer_cluster.worker.device.upload import dma_upload, padded_words


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
        """`dtype` is the storage dtype: the model's, or torch.int8 (then with scales)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        scale_shape = (num_blocks, num_kv_heads, block_size)

        def layer() -> LayerKV:
            kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)]
            if dtype == torch.int8:
                kv += [torch.zeros(scale_shape, dtype=torch.float32, device=device) for _ in range(2)]
            return LayerKV(*kv)

        self.kv_caches = [layer() for _ in range(num_layers)]
        self.block_mirror = BlockTableMirror()  # step block tables from what changed since the last

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype: torch.dtype) -> int:
        """K + V bytes of one block over all layers, scales included (int8: 4 bytes per row)."""
        row = head_dim * torch.tensor([], dtype=dtype).element_size()
        if dtype == torch.int8:
            row += torch.tensor([], dtype=torch.float32).element_size()
        return 2 * num_layers * block_size * num_kv_heads * row

    def prepare(self, out: SchedulerOutput, prev_ids: Optional[torch.Tensor] = None,
                prev_rows: Sequence[int] = (), upload: Optional[Callable[[np.ndarray], torch.Tensor]] = None,
                row_span: Optional[np.ndarray] = None) -> StepInputs:
        """`prev_ids` / `prev_rows`: the previous step's sampled ids (device) and, for each
        `pending_input` row in order, its row there. `upload(values)`: how the packed int64
        inputs reach the device (default: a pinned non-blocking copy; worker/device/upload.py).
        `row_span`: a verify step's runs (`step_rows.row_spans`), carried to attention."""
        rows = step_rows(out, self.block_size, self.block_mirror)
        fill, tables = rows.pending_rows, rows.block_tables
        # One host buffer, one (pinned, non-blocking) transfer; device-side views split it. The
        # attention metadata the kernels read as int32 is packed as int32 already, so the
        # device needs no cast kernels (3 launches fewer per step).
        i64, i32 = np.int64, np.int32
        parts = [np.asarray(rows.input_ids, dtype=i64), np.asarray(rows.positions, dtype=i64),
                 np.asarray(rows.slots, dtype=i64), np.asarray(rows.sample_rows, dtype=i64),
                 rows.seq_lens.astype(i32), rows.query_start.astype(i32), tables.reshape(-1).astype(i32),
                 np.asarray(fill, dtype=i64), np.asarray(prev_rows, dtype=i64)]
        if row_span is not None:  # a verify step as decode rows: its runs (views[9])
            parts.append(np.asarray(row_span, dtype=np.int32))
        if len(fill) != len(prev_rows) or (fill and prev_ids is None):
            raise ValueError(f"{len(fill)} rows wait for a pending token but {len(prev_rows)} "
                             f"previous rows were given")
        # Every part starts 16 bytes aligned (padded to a multiple of 16 bytes): Triton
        # specializes kernels on pointer alignment, and a view at an odd offset would compile a
        # second variant in the middle of serving (bench/cold_start.py --log-compiles found one).
        sizes = [len(p) for p in parts]
        words = [padded_words(p.nbytes) for p in parts]  # int32 parts are viewed back as int32
        packed = np.zeros(sum(words), dtype=i64)  # one allocation; each part copied in once
        as_bytes, offset = packed.view(np.uint8), 0
        for p, w in zip(parts, words):
            as_bytes[offset:offset + p.nbytes] = np.ascontiguousarray(p).view(np.uint8)
            offset += 8 * w
        if self.device.type != "cuda":
            flat = torch.from_numpy(packed)
        elif upload is not None:
            flat = upload(packed)
        else:
            flat = dma_upload(packed, self.device)
        # One int32 view of the whole buffer, then one slice a part: fewer tensor ops on the
        # host than split + slice + view each (~22 against ~10 us a step on the 2-core CPU).
        flat32, views, offset = flat.view(torch.int32), [], 0
        for p, n, w in zip(parts, sizes, words):
            views.append(flat[offset:offset + n] if p.dtype == i64 else flat32[2 * offset:2 * offset + n])
            offset += w
        if fill:  # pending tokens: from the previous step's draw, on the device
            if (len(fill) == sizes[0] and prev_ids.dtype == torch.int64 and prev_ids.shape[0] >= sizes[0]
                    and _is_identity(parts[7]) and _is_identity(parts[8])):
                # A steady decode batch: row i continues the previous draw's row i, so the draw
                # is the input as it is (no gather / scatter launches).
                views[0] = prev_ids[:sizes[0]]
            else:
                views[0][views[7]] = prev_ids[views[8]]
        meta = AttentionMetadata(slot_mapping=views[2], block_tables=views[6].view(tables.shape),
                                 seq_lens=views[4], query_start_loc=views[5],
                                 max_query_len=rows.max_query_len,
                                 row_span=views[9] if row_span is not None else None)
        return StepInputs(input_ids=views[0], positions=views[1], meta=meta, sample_indices=views[3],
                          sample_request_ids=rows.sample_ids)


def _is_identity(rows: np.ndarray) -> bool:
    """Whether `rows` is 0, 1, ..., len - 1."""
    return bool(np.array_equal(rows, np.arange(len(rows))))

