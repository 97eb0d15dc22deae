"""What rank 0 tells the other ranks each step: one packed int32 step tensor.

Owns: the step's layout. A fixed header of `HEADER_LEN` int32 (format, `Op`, token / sequence
/ sampled-row counts, block-table width, longest query, the CUDA-graph batch to replay, whether
rank 0 wants only the greedy ids of the sampled rows) and a
payload of int32 sections, each padded to 4 values (16 bytes): input ids, positions, slot
mapping, sampled rows, sequence lengths, query start offsets, block tables (row-major). With
async scheduling some input ids are not on the host when the step is packed (the previous
step's draw is still on the device): `pack_step_pending` names their rows, and rank 0 writes
them into its device copy of the payload before broadcasting it (worker/distributed/channel.py).
`pack_step` builds both on the host from a `SchedulerOutput` (rank 0 only); `unpack_step` turns
header + payload (on any device) into the same `StepInputs` that `DynamicContext.prepare`
builds, with tensor views and dtype casts only: no per-request Python, no msgpack, no pickle.
Every rank, rank 0 included, runs its step from the unpacked tensors, so all ranks derive
identical inputs and issue the same collectives in the same order.

Must never carry request ids (they stay on rank 0, which alone samples) or anything a rank
would decide on by itself. To add a field: append a header slot or a payload section (sized
from the header alone), read it in `unpack_step`, and bump `STEP_FORMAT` (all ranks of a
replica run the same code; a mismatch is a clear `StepFormatError`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.runner.context import StepInputs
from infer_cluster.worker.models.decoder import AttentionMetadata
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.runner.step_rows import step_rows

STEP_FORMAT = 3
HEADER_LEN = 9
INT32_MAX = 2**31 - 1


class Op(enum.IntEnum):
    RUN = 1    # run the step eagerly
    GRAPH = 2  # replay the decode graph of `graph_batch` rows (every rank has the same ladder)
    STOP = 3   # leave the step loop, release graphs and groups, exit 0


class StepFormatError(ValueError):
    """The header is not a step this code understands (a bug, or mixed code versions)."""


@dataclass(frozen=True)
class StepHeader:
    op: Op
    num_tokens: int = 0
    num_seqs: int = 0
    num_sampled: int = 0
    table_width: int = 0
    max_query_len: int = 0
    graph_batch: int = 0
    # 1: every sampled row is plain greedy, so the ranks gather argmax pairs instead of logits
    # (worker/models/parallel.py, `ParallelLMHead.greedy_ids`)
    greedy_ids: int = 0

    def to_array(self) -> np.ndarray:
        return np.array([STEP_FORMAT, int(self.op), self.num_tokens, self.num_seqs, self.num_sampled,
                         self.table_width, self.max_query_len, self.graph_batch, self.greedy_ids],
                        dtype=np.int32)

    @classmethod
    def from_values(cls, values) -> "StepHeader":
        values = [int(v) for v in values[:HEADER_LEN]]
        if len(values) != HEADER_LEN:
            raise StepFormatError(f"step header has {len(values)} values, expected {HEADER_LEN}")
        if values[0] != STEP_FORMAT:
            raise StepFormatError(f"step format {values[0]} from rank 0, this rank speaks {STEP_FORMAT}")
        try:
            op = Op(values[1])
        except ValueError:
            raise StepFormatError(f"unknown step op {values[1]}") from None
        return cls(op, *values[2:])

    def section_sizes(self) -> list[int]:
        """Unpadded lengths of the payload sections, in payload order."""
        t, n = self.num_tokens, self.num_seqs
        return [t, t, t, self.num_sampled, n, n + 1 if n else 0, n * self.table_width]

    @property
    def payload_len(self) -> int:
        return sum(_pad4(s) for s in self.section_sizes())


def _pad4(n: int) -> int:
    return (n + 3) & ~3


STOP_HEADER = StepHeader(Op.STOP)


def pack_step(out: SchedulerOutput, block_size: int) -> tuple[StepHeader, np.ndarray]:
    """Header (op RUN) and int32 payload of `out` (rank 0). Values are those
    `DynamicContext.prepare` computes; the caller guarantees that slots fit int32 (the shard
    checks the pool size). A `pending_input` row's input id is a placeholder here: see
    `pack_step_pending`."""
    header, payload, _ = pack_step_pending(out, block_size)
    return header, payload


def pack_step_pending(out: SchedulerOutput, block_size: int, mirror: Optional[BlockTableMirror] = None
                      ) -> tuple[StepHeader, np.ndarray, list[int]]:
    """`pack_step` plus the token rows whose input id is still on the device (async
    scheduling: the previous step's draw). The input-id section starts the payload, so these
    rows are also the payload offsets that rank 0 fills on the device before the payload's
    broadcast (`StepChannel.send`'s `pending`). `mirror`: rank 0's block-table mirror
    (worker/kv/block_table.py)."""
    rows = step_rows(out, block_size, mirror)
    tables = rows.block_tables
    n, width = tables.shape
    end, max_q, sample_rows = len(rows.input_ids), rows.max_query_len, rows.sample_rows
    header = StepHeader(Op.RUN, end, n, len(sample_rows), width, max_q)
    payload = np.zeros(header.payload_len, dtype=np.int32)
    offset = 0
    for part in (rows.input_ids, rows.positions, rows.slots, sample_rows, rows.seq_lens,
                 rows.query_start, tables.reshape(-1)):
        payload[offset:offset + len(part)] = part
        offset += _pad4(len(part))
    return header, payload, rows.pending_rows


def unpack_step(header: StepHeader, payload: torch.Tensor, widen: bool = True) -> StepInputs:
    """`StepInputs` as views of `payload` (1-D int32, any device), with the dtypes `prepare`
    gives (int64 ids / positions / slots / sampled rows, int32 lengths and tables). With
    `widen=False` those four stay int32 views (a CUDA-graph replay copies them into its own
    int64 buffers, casting on the way). `sample_request_ids` is left empty: only rank 0
    knows them and fills them in."""
    views, offset = [], 0
    for size in header.section_sizes():
        views.append(payload[offset:offset + size])
        offset += _pad4(size)
    ids, positions, slots, sample_rows, seq_lens, qsl, tables = views
    if widen:
        ids, positions, slots, sample_rows = (v.long() for v in (ids, positions, slots, sample_rows))
    meta = AttentionMetadata(slot_mapping=slots,
                             block_tables=tables.view(header.num_seqs, header.table_width),
                             seq_lens=seq_lens, query_start_loc=qsl,
                             max_query_len=header.max_query_len)
    return StepInputs(input_ids=ids, positions=positions, meta=meta, sample_indices=sample_rows,
                      sample_request_ids=[])


def is_decode_only(header: StepHeader) -> bool:
    """Every sequence adds one token and is sampled: a step a decode graph can run."""
    return (header.max_query_len == 1 and header.num_tokens == header.num_seqs == header.num_sampled)
