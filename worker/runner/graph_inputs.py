"""`GraphInputs`: the decode graphs' static inputs, and a decode step written straight into them.

Why: a decode step used to go through `DynamicContext.prepare` (pack the step's lists, send
them, cut the device buffer into ten views, fix up the pending ids) and then `DecodeGraphs.run`
(five copies into the static buffers and two fills of the padding rows). On the H200 host each
torch call on a CUDA tensor costs 4-16 us of Python and dispatch, and those two took 0.27 and
0.10 ms of a batch-1 step's host time (2026-11-29, Qwen3-0.6B shape, bf16; the whole step is
~0.75 ms). Here the host writes the step into a page-locked twin of the static buffers with
numpy, and one transfer carries it over: a step costs one DMA copy (or one read kernel), one
copy of the previous draw's ids, and the replay. The read kernel (`mapped_read_staged`) serves
where a host KV tier keeps the copy engines busy, or where whole table rows would be many bytes
(a long `max_model_len`): it pulls the head sections and only the first `width` entries of the
step's table rows.

Owns:
- the static inputs as sections of ONE int64 device buffer, in this order: input ids,
  positions, KV slots (int64, `max_batch` each), the pending rows' indices and their rows in the
  previous draw (int64, `max_batch` each), sequence lengths (int32), with `runs` the rows' runs
  (int32 `row_span`: a verify step's positions of one request, worker/runner/step_rows.py
  `row_spans`; 1 for every other row), the block tables (int32 `[max_batch, max_blocks]`) and
  the query starts (int32 `0..max_batch`, never sent again).
  Every section starts 16 bytes aligned. The views (`input_ids`, ...) are what the graphs were
  captured over; `DecodeGraphs.run` still copies a prepared step into them (tensor-parallel
  shards do);
- a ring of host twins (`RING` rows of the whole layout, page-locked and device-mapped where the
  host allows, created by `open_host` or the first `stage`), with the CUDA event of the
  transfer that last read each row (on the CPU, where the tests run it, the same layout and a
  plain copy);
- `stage(out, mirror, bs, prev_ids, prev_rows)`: the decode step `out` (one token a row) padded
  to the captured size `bs` (padding rows: slot -1, length 1). Block-table entries past a row's
  own blocks are stale and never read: the kernels read a row's first
  ceil(seq_len / block_size) entries only.

Must never: write a host twin row that a transfer may still read (each row waits for its
event), or be used for a step with a prompt chunk or proposals laid out as a mixed step (the
caller checks `decode_only`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from infer_cluster.kernels.mapped_read_triton import mapped_read_staged
from infer_cluster.worker.device.host_memory import HostBuffer
from infer_cluster.worker.device.streams import CurrentStream
from infer_cluster.worker.device.upload import MAPPED_UPLOAD, padded_words
from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.sched.output import SchedulerOutput

RING = 4  # host twins: at most two steps are in flight, so a row's last read is long done
SMALL_STEP = 16  # rows up to which a step's positions and slots are computed in Python, not numpy
DMA_MAX_BYTES = 1 << 20  # a longer span goes by the read kernel (see `_sends_by_kernel`)


class GraphInputs:
    def __init__(self, max_batch: int, max_blocks: int, device: torch.device, runs: bool = False):
        """`runs`: keep a `row_span` section (an engine that verifies proposals as decode rows)."""
        self.max_batch, self.max_blocks, self.device = max_batch, max_blocks, device
        m = max_batch
        sizes = [("ids", m, 8), ("pos", m, 8), ("slots", m, 8), ("fill", m, 8), ("prev", m, 8),
                 ("lens", m, 4)] + ([("span", m, 4)] if runs else []) + [
                 ("tables", m * max_blocks, 4), ("qsl", m + 1, 4)]
        self._at, offset = {}, 0
        for name, n, itemsize in sizes:
            self._at[name] = (offset, n, itemsize)
            offset += padded_words(n * itemsize)
        self._words = offset
        self._tables_at = self._at["tables"][0]
        self._buffer = torch.zeros(offset, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slot_mapping = (self._view(self._buffer, k)
                                                             for k in ("ids", "pos", "slots"))
        self.seq_lens = self._view(self._buffer, "lens")
        self.block_tables = self._view(self._buffer, "tables").view(m, max_blocks)
        self.query_start_loc = self._view(self._buffer, "qsl")
        self.row_span = self._view(self._buffer, "span") if runs else None
        if runs:
            self.row_span.fill_(1)
        self._fill_rows, self._prev_rows = self._view(self._buffer, "fill"), self._view(self._buffer, "prev")
        self.slot_mapping.fill_(-1)
        self.seq_lens.fill_(1)
        self.query_start_loc.copy_(torch.arange(m + 1, dtype=torch.int32))
        self._host: Optional[HostBuffer] = None
        self._copy_engine_busy = False
        self._events: list[torch.cuda.Event] = []
        self._stream: Optional[CurrentStream] = None
        self._next = 0
        # views reused by every step (slicing a tensor costs a few us of dispatch on the host)
        self._sends: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._ids_head = [self.input_ids[:n] for n in range(m + 1)]
        self.staged = 0  # steps written through `stage` (tests check that the path ran)

    def _view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        offset, n, itemsize = self._at[name]
        if itemsize == 8:
            return flat[offset:offset + n]
        return flat.view(torch.int32)[2 * offset:2 * offset + n]

    def open_host(self, copy_engine_busy: bool = False) -> None:
        """Create the host ring now (and compile the read kernel), not in the first step. Only
        a runner that calls `stage` needs it (a tensor-parallel shard copies into the views).
        `copy_engine_busy` (a host KV tier's loads keep the copy engines busy): send steps by
        the read kernel, not by DMA (`_sends_by_kernel`)."""
        if self._host is None:
            self._copy_engine_busy = copy_engine_busy
            self._twins()
            if self._mapped:  # a read of the head alone: the kernel compiles here
                mapped_read_staged(self._rows[0], self._buffer, self._tables_at, self._tables_at, 0, 0,
                                   self.max_blocks)
                torch.cuda.synchronize(self.device)

    def _sends_by_kernel(self, span_words: int) -> bool:
        """Whether a step goes over by the read kernel rather than one DMA copy of its span.
        DMA costs the host less (H200 host, 2026-11-29, timers around each part of a batch-1
        step: copy 24 us against the read kernel's launch 52 us; 33 against 82 us at 256 rows),
        so it is the default; the kernel where the copy engines are busy with a host tier's
        loads (worker/device/upload.py says why), or where the span (whole table rows) would
        move more than `DMA_MAX_BYTES`: a long `max_model_len` makes rows wide."""
        if not self._mapped:
            return False
        return not self._dma_async or self._copy_engine_busy or span_words * 8 > DMA_MAX_BYTES

    def _twins(self) -> None:
        """The host ring, page-locked (mapped where the host allows), each row holding the
        device layout's initial values (the query starts are never written again)."""
        cuda = self.device.type == "cuda"
        self._host = HostBuffer([((RING, self._words), torch.int64)], pin=cuda)
        rows = self._host.tensors[0]
        rows.copy_(self._buffer.cpu().expand(RING, -1))
        self._mapped = self._host.is_mapped and MAPPED_UPLOAD
        # torch copies registered memory asynchronously only where it sees it as pinned
        self._dma_async = not cuda or rows.is_pinned()
        self._rows = rows
        self._np = [self._numpy_views(rows[k]) for k in range(RING)]
        self._events = [torch.cuda.Event() if cuda else None for _ in range(RING)]
        self._stream = CurrentStream(self.device) if cuda else None

    def _send_views(self, k: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(device span, host row k's span) of a DMA send, made once per (row, span)."""
        views = self._sends[(k, span)] = (self._buffer[:span], self._rows[k, :span])
        return views

    def _numpy_views(self, row: torch.Tensor) -> dict:
        views = {k: self._view(row, k).numpy() for k in ("ids", "pos", "slots", "fill", "prev", "lens",
                                                          "span") if k in self._at}
        views["tables"] = self._view(row, "tables").numpy().reshape(self.max_batch, self.max_blocks)
        return views

    def stage(self, out: SchedulerOutput, mirror: BlockTableMirror, block_size: int, bs: int,
              prev_ids: Optional[torch.Tensor] = None, prev_rows: Sequence[int] = (),
              row_span: Optional[np.ndarray] = None) -> None:
        """Write the decode step `out` (n <= bs rows of one token) into the static inputs,
        padded to `bs` rows. `prev_ids` / `prev_rows`: the previous step's draw on the device
        and, for each `pending_input` row in order, its row there (`DynamicContext.prepare`).
        `row_span`: the step's runs (`step_rows.row_spans`; None: every row its own), only
        where the inputs keep a span section (`runs`)."""
        reqs = out.requests
        n = len(reqs)
        if not 0 < n <= bs <= self.max_batch:
            raise ValueError(f"a decode step of {n} rows cannot run as {bs} of at most {self.max_batch}")
        if row_span is not None and self.row_span is None:
            raise ValueError("a step with runs (row_span) staged into inputs without a span section")
        fill = [i for i, r in enumerate(reqs) if r.pending_input]
        if len(fill) != len(prev_rows) or (fill and prev_ids is None):
            raise ValueError(f"{len(fill)} rows wait for a pending token but {len(prev_rows)} "
                             f"previous rows were given")
        self.open_host()
        k = self._next
        self._next = (k + 1) % RING
        event = self._events[k]
        if event is not None:
            event.synchronize()  # the transfer that last read this row has run
        h = self._np[k]
        tables = mirror.gather(reqs)
        width = tables.shape[1]
        if width > self.max_blocks:
            raise ValueError(f"a row of {width} blocks exceeds the graphs' {self.max_blocks}")
        h["ids"][:n] = [r.token_ids[0] for r in reqs]
        if n <= SMALL_STEP:  # a few rows: Python ints cost less than numpy's per-call overhead
            starts = [r.start_position for r in reqs]
            h["pos"][:n] = starts
            h["slots"][:n] = [int(tables[i, p // block_size]) * block_size + p % block_size
                              for i, p in enumerate(starts)]
            h["lens"][:n] = [p + 1 for p in starts]
        else:
            starts = np.fromiter((r.start_position for r in reqs), dtype=np.int64, count=n)
            h["pos"][:n] = starts
            h["slots"][:n] = tables[np.arange(n), starts // block_size] * block_size + starts % block_size
            h["lens"][:n] = starts + 1
        h["slots"][n:bs] = -1  # padding rows attend to one (stale) slot and write nothing
        h["lens"][n:bs] = 1
        h["tables"][:n, :width] = tables
        if self.row_span is not None:  # a verify step's runs, 1 for every other row
            h["span"][:bs] = 1
            if row_span is not None:
                h["span"][:n] = row_span
        steady = len(fill) == n and prev_ids.shape[0] >= n and list(prev_rows) == list(range(n))
        if fill and not steady:
            h["fill"][:len(fill)] = fill
            h["prev"][:len(fill)] = prev_rows
        span = self._tables_at + padded_words(n * self.max_blocks * 4)
        if self._sends_by_kernel(span):  # the head and each row's own blocks
            mapped_read_staged(self._rows[k], self._buffer, self._tables_at, self._tables_at, n, width,
                               self.max_blocks)
        else:  # one DMA copy of the span up to the step's last table row
            dst, src = self._sends.get((k, span)) or self._send_views(k, span)
            dst.copy_(src, non_blocking=True)
        if event is not None:
            self._stream.record(event)
        if steady:  # row i continues the previous draw's row i
            self._ids_head[n].copy_(prev_ids if prev_ids.shape[0] == n else prev_ids[:n])
        elif fill:
            f = len(fill)
            self.input_ids[self._fill_rows[:f]] = prev_ids[self._prev_rows[:f]]
        self.staged += 1
