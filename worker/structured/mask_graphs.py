"""`MaskArgmaxGraphs`: a greedy constrained draw replayed from one CUDA graph.

Why: at batch 1 the host sets the pace, and a constrained greedy draw launched eagerly is five
device calls on top of the step (the mask's and the row indices' uploads, an event, the mask's
Triton launch, argmax), each a few tens of microseconds of Python on the H200 host. Replayed
from a graph they are one call.

Owns: per key one pair of graphs, each [mask rows and row indices from their pinned host buffers
-> the device buffers; `apply_token_bitmask`; argmax] over the same inputs, the pair replayed in
turn so that the ids a draw hands out stay valid until the draw after next (the engine reads a
step's ids before it queues the draw after it). The key is what the captured work reads: the
logits' address, shape, strides and dtype, the tokenizer's vocabulary, the buffers' addresses
and the number of masked rows. A decode graph's logits live at one address per batch size, so
at steady state every draw replays. A key is captured the second time it is seen (the first
draw runs eagerly and compiles the Triton kernel outside any capture); logits at a new address
each step (eager forwards) never get one. Only steps of at most `MAX_ROWS` rows take a graph:
there the five launches are the draw's cost, while a large batch amortizes them, and its row
count changes with nearly every request that ends, so its keys would fill the table (on the
H200 a batch-1 request served after a 256-row workload found the table full and drew eagerly:
1.35x the unconstrained TPOT against 1.06x). At most `MAX_GRAPHS` keys; past that, eager draws.

Correct whatever the address held before: a graph touches memory only when it replays, and it
replays only for logits at its key's address, shape and strides, which are then the step's own.
Must never: replay for a key that differs in anything the captured work reads.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from infer_cluster.kernels.bitmask import apply_token_bitmask
from infer_cluster.worker.device.graphs import capture_mid_serving, release_graphs

log = logging.getLogger(__name__)

MAX_ROWS = 8
MAX_GRAPHS = 32
_MAX_SEEN = 1024  # keys remembered once; forgotten all at once past this


class MaskArgmaxGraphs:
    def __init__(self, device: torch.device):
        self.device = device
        self._pairs: dict[tuple, list] = {}  # key -> [next to replay (0/1), (graph, ids), (graph, ids)]
        self._seen: set = set()
        self._pool = None
        self.replays = 0  # draws served by a graph (tests check that graphs really ran)
        self.captures = 0
        self.disabled = False  # a capture failed: eager draws from then on

    def argmax(self, logits: torch.Tensor, host: torch.Tensor, dev: torch.Tensor,
               idx_host: torch.Tensor, idx_dev: torch.Tensor, vocab: int) -> Optional[torch.Tensor]:
        """The ids `[rows]` of `logits` after masking rows `idx_host` with `host` (both pinned,
        written by the caller), from a graph; None where no graph serves (the caller draws
        eagerly). `dev` and `idx_dev`: the device buffers the graph uploads into."""
        if logits.shape[0] > MAX_ROWS:
            return None
        k = idx_host.shape[0]
        key = (logits.data_ptr(), tuple(logits.shape), logits.stride(), logits.dtype, vocab,
               host.data_ptr(), tuple(host.shape), dev.data_ptr(), idx_host.data_ptr(),
               idx_dev.data_ptr(), k)
        pair = self._pairs.get(key)
        if pair is None:
            if self.disabled:
                return None
            if key not in self._seen or len(self._pairs) >= MAX_GRAPHS:
                if len(self._seen) >= _MAX_SEEN:
                    self._seen.clear()
                self._seen.add(key)
                return None
            try:
                pair = [0] + [self._capture(logits, host, dev, idx_host, idx_dev[:k], vocab) for _ in range(2)]
            except RuntimeError as exc:  # the eager draw is as right, only slower
                log.warning("masked argmax graphs off: capture failed (%s)", exc)
                self.disabled = True
                return None
            self._pairs[key] = pair
        turn = pair[0]
        pair[0] = 1 - turn
        graph, ids = pair[1 + turn]
        graph.replay()
        self.replays += 1
        return ids

    def _capture(self, logits, host, dev, idx_host, idx_dev, vocab) -> tuple:
        def body():
            dev.copy_(host, non_blocking=True)
            idx_dev.copy_(idx_host, non_blocking=True)
            apply_token_bitmask(logits, dev, idx_dev, vocab)
            return logits.argmax(dim=-1)

        graph, ids = capture_mid_serving(body, self.device, self._pool)
        self._pool = graph.pool()
        self.captures += 1
        log.debug("captured a masked argmax graph: %d rows, %d masked", logits.shape[0], idx_dev.shape[0])
        return graph, ids

    def release(self) -> None:
        """Drop every graph once the device finished its queued work (even if that wait fails)."""
        self._pool = None
        release_graphs(self._pairs, self._seen, device=self.device)
