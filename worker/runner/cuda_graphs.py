"""CUDA graphs for decode steps (one new token per sequence).

Owns: static input buffers sized for `max_num_seqs` decodes with block tables as wide as
`max_model_len` needs (`GraphInputs`, worker/runner/graph_inputs.py), one captured graph per
batch size in a ladder (1, 2, 4, 8, then steps of 16), `run_step()`, which writes a decode
step straight into those buffers (a single rank's path), and `run()`, which copies a prepared
step's tensors in (the tensor-parallel shards' path); both pad the batch up to the next captured
size (padding rows write no KV: slot -1) and replay. All graphs share one memory
pool, captured largest first. Kernels must pick their launch shapes from tensor shapes only
(never from values), which `kernels/` guarantees for decode.

Tensor parallel (docs/parallel.md): every TP rank builds the same ladder (from the shared
config) and captures it in the same order, calling `before_capture(bs)` (a barrier on a CPU
group: never a collective inside a capture) before each size; the NCCL collectives inside the
forward are captured, not run, so ranks meet in the eager warm-up before each capture. A replay
names its batch (`run(..., batch=)`), which rank 0 broadcasts, so ranks never pick on their own.
A greedy variant of each size up to `greedy_max_batch` can be captured too (`greedy_forward`:
the same forward ending in an argmax, so the graph returns ids; `run(..., greedy=True)`): a
T > 1 shard ends it in the argmax pairs' gather (every size), a single rank in the split argmax
(small sizes, where the eager argmax after the replay is a visible part of the step). Sizes past
the ladder may be captured greedy-only (`greedy_only`: a speculating engine's large verify
steps, worker/runner/graph_set.py); steps that need logits never replay them.
`release()` destroys the graphs: NCCL cannot destroy or abort a communicator while a captured
graph still holds it, so graphs go before the process group does.

Pipeline stages (P > 1, `stage_hidden`): a stage after the first also reads the previous stage's
`(hidden, residual)` from a static `[max_batch, 2, hidden]` buffer, which the caller fills by
receiving into `stage_input(rows)` before `run`; the captured body returns what the stage sends
on (`[rows, 2, hidden]`, or the logits on the last stage). The sends and receives stay outside the
graphs.

Must never run a collective, a host sync or an allocation outside the graph pool while capturing.
"""

from __future__ import annotations

import bisect
import logging
from typing import Callable, Optional, Sequence

import torch

from infer_cluster.worker.device.graphs import release_graphs
from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.runner.graph_inputs import GraphInputs
from infer_cluster.worker.models.decoder import AttentionMetadata
from infer_cluster.worker.sched.output import SchedulerOutput

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, forward_logits, kv_caches, max_batch: int, max_blocks_per_seq: int,
                 device: torch.device, before_capture: Optional[Callable[[int], None]] = None,
                 capture_error_mode: str = "global", stage_hidden: int = 0,
                 stage_dtype: Optional[torch.dtype] = None, greedy_forward: Optional[Callable] = None,
                 greedy_max_batch: Optional[int] = None, runs: bool = False, pool=None,
                 greedy_only: Sequence[int] = ()):
        """`forward_logits(input_ids, positions, meta, kv_caches) -> logits` is captured (with
        `stage_hidden` > 0: `forward_logits(..., kv_caches, stage_in)`, `stage_in` a
        `[rows, 2, stage_hidden]` view of the static stage input, see the module docstring).
        `before_capture(bs)` runs before each size's warm-up (ranks of one replica: a barrier);
        `capture_error_mode="thread_local"` keeps other threads' CUDA calls (NCCL's watchdog)
        from invalidating the capture. `greedy_forward` (same arguments; returns the argmax ids
        of the rows) is captured too, per size up to `greedy_max_batch` (None: every size),
        into the same pool: `run(..., greedy=True)`. `runs`: attention reads the inputs'
        `row_span` (the verify graphs of a speculating engine, whose verify steps are decode
        rows, one run of rows a request: worker/runner/graph_inputs.py). `pool`: capture into
        this graph memory pool (another ladder's), not a new one. `greedy_only`: sizes past
        `max_batch` captured with the greedy variant alone (no logits output: a size's logits
        are `rows x vocab` of memory held for the pool's life), for steps that want ids only."""
        if greedy_only and greedy_forward is None:
            raise ValueError("greedy-only sizes need greedy_forward")
        self.logits_max_batch = max_batch  # sizes past it have a greedy graph only
        self.sizes = capture_sizes(max_batch) + sorted(s for s in set(greedy_only) if s > max_batch)
        self.max_batch = self.sizes[-1]
        # the static inputs: sections of one device buffer, which `run_step` fills in one transfer
        self.inputs = GraphInputs(self.max_batch, max_blocks_per_seq, device, runs=runs)
        self.input_ids, self.positions = self.inputs.input_ids, self.inputs.positions
        self.slot_mapping, self.block_tables = self.inputs.slot_mapping, self.inputs.block_tables
        self.seq_lens, self.query_start_loc = self.inputs.seq_lens, self.inputs.query_start_loc
        self.stage_in = (torch.zeros(self.max_batch, 2, stage_hidden, dtype=stage_dtype, device=device)
                         if stage_hidden else None)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # steps served by a graph (tests check that graphs really ran)
        self.greedy_replays = 0  # of those, steps served by a greedy variant
        self.outputs: dict[int, torch.Tensor] = {}
        self.greedy_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.greedy_outputs: dict[int, torch.Tensor] = {}
        variants = [(forward_logits, self.graphs, self.outputs)]
        if greedy_forward is not None:
            variants.append((greedy_forward, self.greedy_graphs, self.greedy_outputs))
        torch.cuda.synchronize(device)
        for bs in reversed(self.sizes):
            span = self.inputs.row_span
            meta = AttentionMetadata(self.slot_mapping[:bs], self.block_tables[:bs], self.seq_lens[:bs],
                                     self.query_start_loc[:bs + 1], 1,
                                     span[:bs] if span is not None else None)
            args = (self.input_ids[:bs], self.positions[:bs], meta, kv_caches)
            if self.stage_in is not None:
                args += (self.stage_in[:bs],)
            for forward, graphs, outputs in variants:
                if graphs is self.greedy_graphs and greedy_max_batch is not None and bs > greedy_max_batch:
                    continue
                if graphs is self.graphs and bs > self.logits_max_batch:
                    continue
                if before_capture is not None:
                    before_capture(bs)
                forward(*args)  # warm-up: Triton compiles/autotunes outside the capture
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode=capture_error_mode):
                    outputs[bs] = forward(*args)
                pool = graph.pool()
                graphs[bs] = graph
        self.pool = pool  # later graphs (worker/runner/mixed_graphs.py) share it
        torch.cuda.synchronize(device)
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def has_greedy(self, batch: int) -> bool:
        """Whether the captured size `batch` has a greedy variant."""
        return batch in self.greedy_graphs

    def batch_for(self, num_seqs: int, greedy: bool = False) -> int:
        """The captured size a batch of `num_seqs` decodes replays (padded up): past
        `logits_max_batch` only a step that takes ids (`greedy`) has a size."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        if i == len(self.sizes) or (self.sizes[i] > self.logits_max_batch and not greedy):
            raise ValueError(f"no captured decode graph for {num_seqs} rows (greedy {greedy}; "
                             f"sizes {self.sizes}, logits up to {self.logits_max_batch})")
        return self.sizes[i]

    def stage_input(self, rows: int) -> torch.Tensor:
        """The first `rows` rows of the static stage input (contiguous): receive the previous
        stage's `[rows, 2, hidden]` here before `run`."""
        return self.stage_in[:rows]

    def run(self, input_ids, positions, meta: AttentionMetadata, batch: Optional[int] = None,
            greedy: bool = False) -> torch.Tensor:
        """Replay for `input_ids.shape[0]` rows; `batch` (a captured size) is the graph to use,
        by default the smallest that fits. Inputs may be int32: copies cast. `greedy`: the
        `greedy_forward` graph, which returns ids, not logits."""
        n = input_ids.shape[0]
        bs = self.batch_for(n, greedy) if batch is None else batch
        if bs not in (self.greedy_graphs if greedy else self.graphs) or bs < n:
            raise ValueError(f"no captured decode graph of {bs} rows for {n} rows (have {self.sizes})")
        if self.inputs.row_span is not None:  # verify graphs: their runs come through `run_step`
            raise ValueError("graphs captured with runs replay through run_step, not run")
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        if bs > n:  # padding rows: attend to one (stale) slot, write nothing
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].fill_(1)
        if greedy and not self.has_greedy(bs):
            raise ValueError(f"no greedy decode graph of {bs} rows (have {sorted(self.greedy_graphs)})")
        graphs, outputs = (self.greedy_graphs, self.greedy_outputs) if greedy else (self.graphs, self.outputs)
        graphs[bs].replay()
        self.replays += 1
        self.greedy_replays += greedy
        return outputs[bs][:n]

    def decode_only(self, out: SchedulerOutput, greedy: bool = False) -> bool:
        """Whether `out` is a step `run_step` serves: one token a row, every row sampled, at
        most `max_batch` rows (`logits_max_batch` unless it takes ids: `greedy`, with a greedy
        variant at its size)."""
        reqs = out.requests
        n = len(reqs)
        if not 0 < n <= self.max_batch:
            return False
        if n > self.logits_max_batch and not (greedy and self.has_greedy(self.batch_for(n, True))):
            return False
        return all(len(r.token_ids) == 1 and r.needs_sample for r in reqs)

    def run_step(self, out: SchedulerOutput, mirror: BlockTableMirror, block_size: int,
                 prev_ids: Optional[torch.Tensor] = None, prev_rows: Sequence[int] = (),
                 greedy: bool = False, row_span=None,
                 before_replay: Optional[Callable] = None) -> tuple[torch.Tensor, bool]:
        """Replay for the decode step `out` (`decode_only`), its inputs written straight into
        the static buffers (worker/runner/graph_inputs.py) rather than prepared and copied.
        Returns (the logits of its rows, False), or with `greedy` where its size has a greedy
        graph (their argmax ids, True). `row_span`: the step's runs (graphs captured with runs).
        `before_replay(input_ids, positions, slot_mapping, seq_lens, block_tables)`: runs on
        the static inputs once the step is staged (`ModelRunner.execute`'s `fill_inputs`)."""
        n = len(out.requests)
        bs = self.batch_for(n, greedy)
        greedy = greedy and self.has_greedy(bs)
        self.inputs.stage(out, mirror, block_size, bs, prev_ids, prev_rows, row_span)
        if before_replay is not None:
            before_replay(self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.block_tables)
        graphs, outputs = (self.greedy_graphs, self.greedy_outputs) if greedy else (self.graphs, self.outputs)
        graphs[bs].replay()
        self.replays += 1
        self.greedy_replays += greedy
        return outputs[bs][:n], greedy

    def release(self) -> None:
        """Destroy the graphs and their outputs (before the process group goes)."""
        release_graphs(self.greedy_graphs, self.greedy_outputs)
        release_graphs(self.graphs, self.outputs)
