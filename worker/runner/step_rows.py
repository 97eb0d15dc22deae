"""`step_rows`: a `SchedulerOutput` flattened into the token-level rows a forward reads.

Owns the host-side arithmetic every model runner repeats per step: the input id, position and
KV slot of every scheduled token, each sequence's length and query start, the padded block
table, the rows whose logits are sampled (with their request ids) and the rows whose input id is
the previous step's pending draw. A row with speculative proposals (`num_spec_tokens` = k, never
decode-only: it has k + 1 tokens) has its last k + 1 rows sampled. `DynamicContext.prepare`
(worker/runner/context.py) packs them for one device; the tensor-parallel step codec
(worker/distributed/step_codec.py) packs them for the ranks. Plain Python and numpy, no torch.

Cost matters: it runs on the step's critical path for up to `max_num_seqs` rows. Decode-only
steps take a path with no per-token loops. The block table comes from the runner's
`BlockTableMirror` (only blocks added since the last step are converted); without one it is
filled in one scatter (a per-row assignment cost ~4 us a row, 1 ms per step at 256 rows on the
CPU this was written on), which still converts every block id of every row.
To extend: a new per-token or per-sequence field goes into `StepRows` and both loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Optional, Sequence

import numpy as np

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.sched.output import SchedulerOutput


@dataclass
class StepRows:
    input_ids: list[int]      # per token
    positions: list[int]      # per token
    slots: list[int]          # per token: block id * block_size + offset
    seq_lens: np.ndarray      # int64 [num_seqs]: context length after this step
    query_start: np.ndarray   # int64 [num_seqs + 1]: first token row of each sequence
    block_tables: np.ndarray  # int64 [num_seqs, max blocks], padded with 0
    max_query_len: int
    sample_rows: list[int]    # token rows whose logits are sampled, in request order
    sample_ids: list[str]     # the request of each sampled row (a row with k speculative
                              # proposals has k + 1 sampled rows, in position order)
    pending_rows: list[int]   # token rows whose input id is the previous step's pending draw


def row_spans(request_ids: Sequence[str]) -> Optional[np.ndarray]:
    """The runs of consecutive rows of one request (a verify step laid out as decode rows,
    worker/spec_decode/verify.py `decode_shaped`), encoded as decode attention reads them
    (kernels/attention_decode_triton.py `decode_attention`): n > 0 starts a run of n rows, -j is
    the j-th row after its run's start. None where no request has two rows. A speculating
    runner computes it once a decode step (worker/runner/model_runner.py `execute`) and hands it
    to the graphs' inputs or to `DynamicContext.prepare`."""
    n = len(request_ids)
    if len(set(request_ids)) == n:  # the usual decode step: ~5 us at 256 rows, no loop
        return None
    spans: list[int] = []  # Python lists, one array at the end: numpy per run cost ~3 us a run
    start = 0
    for i in range(1, n + 1):
        if i == n or request_ids[i] != request_ids[start]:
            spans.append(i - start)
            spans.extend(range(-1, start - i, -1))
            start = i
    return np.array(spans, dtype=np.int32)


def step_rows(out: SchedulerOutput, block_size: int, mirror: Optional[BlockTableMirror] = None) -> StepRows:
    """`mirror`: build the block table from what changed since the last step (a runner keeps
    one across steps; worker/kv/block_table.py). Without it the table is built from scratch."""
    bs = block_size
    reqs = out.requests
    num_seqs = len(reqs)
    block_lists = [r.block_ids for r in reqs]
    if mirror is not None:
        tables = mirror.gather(reqs)
    else:
        widths = np.fromiter(map(len, block_lists), dtype=np.int64, count=num_seqs)
        tables = np.zeros((num_seqs, int(widths.max())), dtype=np.int64)
        tables[np.arange(tables.shape[1]) < widths[:, None]] = np.fromiter(
            chain.from_iterable(block_lists), dtype=np.int64, count=int(widths.sum()))
    starts = [r.start_position for r in reqs]
    lens = [len(r.token_ids) for r in reqs]
    max_q = max(lens)
    if max_q == 1:  # decode-only: one token per row
        input_ids = [r.token_ids[0] for r in reqs]
        positions = starts
        slots = [b[p // bs] * bs + p % bs for b, p in zip(block_lists, starts)]
        qsl = np.arange(num_seqs + 1, dtype=np.int64)
        seq_lens = np.asarray(starts, dtype=np.int64) + 1
        fill = [i for i, r in enumerate(reqs) if r.pending_input]
        sample = [(i, r.request_id) for i, r in enumerate(reqs) if r.needs_sample]
    else:
        input_ids, positions, slots, fill, sample = [], [], [], [], []
        end = 0
        for i, r in enumerate(reqs):
            n, start, blocks = lens[i], starts[i], block_lists[i]
            input_ids.extend(r.token_ids)
            if n == 1:
                positions.append(start)
                slots.append(blocks[start // bs] * bs + start % bs)
            else:
                positions.extend(range(start, start + n))
                slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, start + n))
            end += n
            if r.pending_input:
                fill.append(end - 1)
            if r.needs_sample:
                spec = r.num_spec_tokens  # proposals: logits at each of the last spec + 1 rows
                if spec:
                    sample.extend((row, r.request_id) for row in range(end - 1 - spec, end))
                else:
                    sample.append((end - 1, r.request_id))
        qsl = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        seq_lens = np.asarray(starts, dtype=np.int64) + np.asarray(lens, dtype=np.int64)
    return StepRows(input_ids, positions, slots, seq_lens, qsl, tables, max_q,
                    [row for row, _ in sample], [rid for _, rid in sample], fill)
