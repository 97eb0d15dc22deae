"""CUDA graphs of the sampler's random draw for small steps: `DrawGraphs`.

Why: at batch 1 a sampled or top-p step ran the draw eagerly: about 25 torch operations and
three Triton launches, ~0.75 ms of host time per step on an H200 host against a 0.69 ms decode
graph (2026-11-28, `gpu_suite.sh tpot_where`). The host, not the GPU, set the pace: batch-1 TPOT
was 1.1-1.2 ms for sampled requests against 0.72 ms for greedy ones. Replayed from a graph the
draw costs a few host operations.

Owns: per key (logits dtype, batch bucket, candidate width, whether a row is top-p alone) one
graph of `sampling_ops.draw_random_rows` over static inputs: the logits `[bucket, vocab]`, and
the rows' packed parameters `[bucket, 6]` float64 (temperature, top_k, top_p, min_p, the seed's
and the step's 64 bits: `Sampler`'s upload, transposed so a step's rows are one contiguous
copy). Graphs are captured on first use (a key is a handful of Triton launches; at most
`MAX_GRAPHS`), into one private memory pool. A capture that fails (out of GPU memory
mid-serving: the largest key's static logits alone hold 256 rows of the vocabulary) refuses its
key, logs one warning, and that key's steps draw eagerly, with the same tokens; no step fails.
`draw` copies a step's logits and parameters in, replays, and returns fresh tensors only: the ids
and flags in one `[2n]` int64 tensor (the `DeviceDraw.transfer` layout), a copy of the flagged
rows' logits (`copy_flagged_rows`) and of the draw's small per-row tensors for the rare host redo
(`DeferredUnresolved`). Nothing a
caller keeps points into a static buffer, so any number of steps may be in flight.

What takes the graph (`Sampler.draw` decides): every row random, none with penalties, n-gram
bans, min_tokens (outside a grammar), logit_bias or logprobs; rows under a grammar too, their
mask applied eagerly to the static logits first (`draw`'s `edit`: the mask's uploads and one
launch, against the eager draw's ~25 operations after a float32 copy); every row on the candidate path (`num_candidates` > 0, at most
`MAX_CANDIDATES`, so top_k or top_p < 1); at most `max_batch` rows; CUDA logits with the
sampler's kernels on. Rows are padded up to the bucket; padding rows draw from stale inputs and
are dropped. The result is the eager draw's: the same kernels on the same values, in the same
order, with the candidate width of the step (the key).

`mask_argmax`: the graphs of greedy constrained draws (worker/structured/mask_graphs.py), held
here so that they are on and off, and released, with these.

How many rows: a step under a grammar takes a graph up to `max_batch` rows
(`INFER_CLUSTER_DRAW_GRAPH_MAX`, default 256; 0 turns the graphs off, the A/B), any other step up
to `PLAIN_MAX` (32) of them (`row_limit`; `INFER_CLUSTER_DRAW_GRAPH_PLAIN_MAX` sets it,
0-512). Measured on the H200 (2026-11-30, workload A's shape, T 0.8 top-p 0.95, bench/structured.py, alternating with the limit at 32 on one machine at
a98730a): every request under a schema 0.910 / 0.898 of unconstrained sampled against 0.827 /
0.836, half of them 0.942 / 0.944 against 0.903 / 0.893 (the eager draw's launches and the
mask's ~25 operations set the host's pace there). Graphs up to 256 rows for every step (beeb84b,
a slower host) took the unconstrained run from 21,072 to 20,505 tok/s: its host was not the
limit, and a graph copies the logits in and keeps a copy. At 4eee221 (H200,
2026-11-30, the redo keeping only its flagged rows) plain graphs up to 256 rows still gave
workload A's sampled run no gain: 26,279 and 26,597 tok/s against 26,766 at 32 rows. The static
logits of the steps above the plain limit are a second buffer, made only when such a step comes.
Must never: capture while another capture runs, or hand out a static buffer.
To extend (another draw feature): make it part of the key if it changes which kernels launch, and
of the packed parameters if it is a per-row value.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from infer_cluster.kernels.sample import copy_flagged_rows, random_columns
from infer_cluster.worker.config import env_count
from infer_cluster.worker.device.graphs import capture_mid_serving, release_graphs
from infer_cluster.worker.structured.mask_graphs import MaskArgmaxGraphs
from infer_cluster.worker.sampling.ops import RandomRows, Unresolved, draw_random_rows

log = logging.getLogger(__name__)

DRAW_GRAPH_ENV = "INFER_CLUSTER_DRAW_GRAPH_MAX"
DRAW_GRAPH_MAX_DEFAULT = 256
PLAIN_ENV = "INFER_CLUSTER_DRAW_GRAPH_PLAIN_MAX"
PLAIN_MAX = 32  # the most rows of a graph draw without a grammar by default (module docstring)
MAX_GRAPHS = 64  # captured keys at most; a step past that draws eagerly
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PACKED_ROWS = 6  # temperature, top_k, top_p, min_p, seed bits, step bits (float64 each)
_SLOTS = 4  # pinned staging rows for the parameters


def draw_graph_max() -> int:
    """`INFER_CLUSTER_DRAW_GRAPH_MAX` (the default when unset); a `ConfigError` names a bad value."""
    return env_count(DRAW_GRAPH_ENV, DRAW_GRAPH_MAX_DEFAULT, "rows", most=BUCKETS[-1])


def plain_max() -> int:
    """`INFER_CLUSTER_DRAW_GRAPH_PLAIN_MAX` (`PLAIN_MAX` when unset; 0: only constrained steps
    take graphs); a `ConfigError` names a bad value."""
    return env_count(PLAIN_ENV, PLAIN_MAX, "rows", most=BUCKETS[-1])


def row_limit(max_batch: int, constrained: bool, plain: int = PLAIN_MAX) -> int:
    """The most rows of a step that may take a graph: `max_batch` under a grammar, else at
    most `plain` (`plain_max()`)."""
    return max_batch if constrained else min(max_batch, plain)


def bucket_for(n: int) -> int:
    """The captured batch a step of `n` rows replays (padded up)."""
    for b in BUCKETS:
        if b >= n:
            return b
    raise ValueError(f"no draw-graph bucket holds {n} rows (largest {BUCKETS[-1]})")


@dataclass
class DrawPlan:
    """One step's random rows as `Sampler` plans them on the host: the packed parameters
    `[6, n]` float64 and the host lists a redo needs."""

    packed: np.ndarray
    host_top_k: list
    host_top_p: list
    host_min_p: list
    need: list
    top_p_alone: bool


class DeferredUnresolved:
    """The `Unresolved` of a graph draw: the logits and one saved `[8, n]` float64 buffer of the
    per-row values; the tensors a redo needs are unpacked from it only when a redo runs."""

    def __init__(self, x: torch.Tensor, aux: torch.Tensor, plan: DrawPlan):
        self.x = x
        self.rows = list(range(x.shape[0]))
        self._aux = aux
        self._plan = plan

    def unpack(self) -> Unresolved:
        a, p = self._aux, self._plan
        column = a.float().unsqueeze(2)  # [8, n, 1]; every value is exact in float32
        params = RandomRows(temperature=column[3, :, 0], top_k=a[4].long(), top_p=column[5, :, 0],
                            min_p=column[6, :, 0], uniform=a[7].clone(), host_top_k=p.host_top_k,
                            host_top_p=p.host_top_p, host_min_p=p.host_min_p, need=p.need,
                            top_p_alone=p.top_p_alone)
        return Unresolved(None, self.rows, self.x, column[0], column[1], column[2], params)

    def redo(self, which: list[int], want_mask: bool = False) -> torch.Tensor:
        return self.unpack().redo(which, want_mask)


class _Graph:
    """One captured draw: its static parameter input and outputs."""

    def __init__(self, graph, packed_in, transfer, aux):
        self.graph, self.packed_in, self.transfer, self.aux = graph, packed_in, transfer, aux


class DrawGraphs:
    def __init__(self, device: torch.device, max_batch: int):
        if max_batch < 1:
            raise ValueError("DrawGraphs needs max_batch >= 1 (0 means no graphs: pass None instead)")
        self.device = device
        self.max_batch = max_batch
        self._graphs: dict[tuple, _Graph] = {}
        # (dtype, vocab, rows) -> [rows, vocab] static input: rows the bucket of PLAIN_MAX, or of
        # max_batch for the larger buckets (only constrained steps reach those)
        self._logits: dict[tuple, torch.Tensor] = {}
        self.plain_max = plain_max()
        # rows of the smaller buffer (none: every step shares the one buffer)
        self._plain_rows = bucket_for(row_limit(max_batch, False, self.plain_max) or 1)
        self._pool = None
        # The parameters' pinned staging rows, one per step in flight at most (a row is written
        # again once the copy that read it last ran: its event, normally long done).
        self._staging = torch.zeros(_SLOTS, bucket_for(max_batch), PACKED_ROWS, dtype=torch.float64,
                                    pin_memory=True)
        self._staged = [torch.cuda.Event() for _ in range(_SLOTS)]
        self._slot = 0
        self.replays = 0  # draws served by a graph (tests check that graphs really ran)
        self.captures = 0
        self.refused: set = set()  # keys whose capture failed: their steps draw eagerly
        # greedy constrained draws (worker/structured/mask_graphs.py): released with these
        self.mask_argmax = MaskArgmaxGraphs(device)

    @classmethod
    def for_device(cls, device: torch.device) -> Optional["DrawGraphs"]:
        """Graphs for a CUDA device unless `INFER_CLUSTER_DRAW_GRAPH_MAX` is 0; None elsewhere."""
        limit = draw_graph_max()
        return cls(device, limit) if device.type == "cuda" and limit else None

    def fits(self, n: int, constrained: bool = False) -> bool:
        """Whether a step of `n` rows (under a grammar or not) may take a graph."""
        return 0 < n <= row_limit(self.max_batch, constrained, self.plain_max)

    def accepts(self, logits: torch.Tensor, width: int, top_p_alone: bool,
                constrained: bool = False) -> bool:
        """Whether a graph serves these logits (`fits` their rows) at this width and variant:
        captured already, or room for one more (`MAX_GRAPHS`)."""
        if not self.fits(logits.shape[0], constrained):
            return False
        key = self._key(logits, width, top_p_alone)
        return key in self._graphs or (len(self._graphs) < MAX_GRAPHS and key not in self.refused)

    @staticmethod
    def _key(logits: torch.Tensor, width: int, top_p_alone: bool) -> tuple:
        rows, vocab = logits.shape
        return (logits.dtype, bucket_for(rows), vocab, width, top_p_alone)

    def draw(self, logits: torch.Tensor, plan: DrawPlan,
             edit: Optional[Callable[[torch.Tensor], object]] = None):
        """(transfer [2n] int64: ids then redo flags, `DeferredUnresolved`) of a step whose rows
        all take the candidate path (`accepts` said yes). Captures the key's graph first if new;
        None where that capture fails (out of GPU memory mid-serving, above all): the key is
        refused from then on and the caller draws eagerly, which gives the same tokens.
        `edit`: applied eagerly, in place, to the step's rows of the static logits before the
        replay (a grammar's mask: worker/structured/bitmask.py); the draw and a redo see the
        edited values."""
        n, vocab = logits.shape
        key = self._key(logits, max(plan.need), plan.top_p_alone)
        bs = key[1]
        g = self._graphs.get(key)
        if g is None:
            try:
                g = self._capture(key)
            except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
                self.refused.add(key)
                log.warning("draw graph of %s rows, %s candidates not captured (%s); those steps "
                            "draw eagerly", bs, key[3], str(exc).splitlines()[0][:160])
                return None
        x = self._static_logits(logits.dtype, vocab, bs)
        x[:n].copy_(logits, non_blocking=True)
        if edit is not None:
            edit(x[:n])
        slot, self._slot = self._slot, (self._slot + 1) % _SLOTS
        self._staged[slot].synchronize()
        staged = self._staging[slot, :n]  # [n, 6]: contiguous on both sides of the copy
        staged.numpy()[:] = plan.packed.T
        g.packed_in[:n].copy_(staged, non_blocking=True)
        self._staged[slot].record()
        g.graph.replay()
        self.replays += 1
        if n == bs:
            transfer = g.transfer.clone()
        else:
            transfer = torch.cat((g.transfer[:n], g.transfer[bs:bs + n]))
        # What a redo reads, queued before the next step can write x: the flagged rows only.
        kept = copy_flagged_rows(x[:n], transfer[n:])
        return transfer, DeferredUnresolved(kept, g.aux[:, :n].clone(), plan)

    def _static_logits(self, dtype: torch.dtype, vocab: int, bs: int) -> torch.Tensor:
        """The static logits input of graphs of (dtype, vocab) and bucket `bs`: kept while any
        graph may read it."""
        rows = self._plain_rows if bs <= self._plain_rows else bucket_for(self.max_batch)
        x = self._logits.get((dtype, vocab, rows))
        if x is None:
            x = torch.zeros(rows, vocab, dtype=dtype, device=self.device)
            self._logits[(dtype, vocab, rows)] = x
        return x

    def _capture(self, key: tuple) -> _Graph:
        dtype, bs, vocab, width, top_p_alone = key
        x = self._static_logits(dtype, vocab, bs)[:bs]
        packed = torch.zeros(bs, PACKED_ROWS, dtype=torch.float64, device=self.device)
        packed[:, :3] = 1.0  # temperature 1, top_k 1, top_p 1: benign rows for the warm-up and padding
        def body():
            ids, unresolved, aux = _draw_body(x, packed, width, top_p_alone)
            return torch.cat((ids, unresolved)), aux

        body()  # warm-up: Triton compiles outside the capture
        graph, (transfer, aux) = capture_mid_serving(body, self.device, self._pool)
        self._pool = graph.pool()
        g = _Graph(graph, packed, transfer, aux)
        self._graphs[key] = g
        self.captures += 1
        log.debug("captured a draw graph: %s rows, %s candidates, top-p alone %s", bs, width, top_p_alone)
        return g

    def release(self) -> None:
        """Drop every graph and buffer after the device finished pending work; they go even if
        that wait fails (a device error)."""
        self._pool = None
        try:
            release_graphs(self._graphs, self._logits, device=self.device)
        finally:
            self.mask_argmax.release()  # its wait, if any, finds the device drained already


def _draw_body(x: torch.Tensor, packed_rows: torch.Tensor, width: int, top_p_alone: bool):
    """The captured draw: ids [bs], redo flags [bs] int64, and the `[8, bs]` float64 values a
    redo needs, from logits `x` and the packed parameters `[bs, 6]`. Only the candidate width and
    the top-p-alone variant (the key) are planned on the host; the host lists a redo reads are
    the step's own (`DeferredUnresolved`), so placeholders stand in for them here."""
    rows = x.shape[0]
    f32, top_k, uniform = random_columns(packed_rows.T)  # the columns as `Sampler` packs them
    params = RandomRows(temperature=f32[0], top_k=top_k, top_p=f32[1], min_p=f32[2], uniform=uniform,
                        inv_t=f32[3].unsqueeze(1), host_top_k=[0] * rows, host_top_p=[1.0] * rows,
                        host_min_p=[0.0] * rows, need=[width] * rows, top_p_alone=top_p_alone)
    ids, unresolved = draw_random_rows(x, params, private=True)
    aux = torch.stack((unresolved.m[:, 0].double(), unresolved.inv_t[:, 0].double(),
                       unresolved.kth[:, 0].double(), params.temperature.double(), params.top_k.double(),
                       params.top_p.double(), params.min_p.double(), params.uniform))
    return ids, unresolved.flags.long(), aux
