"""`WeightPrefetcher`: pulls each decoder layer's next weights into L2 while its attention runs.

Owns: the side stream, the per-layer plan of which weights to ask for, and the fork / join
around it. Why: at small batches a decode step reads every weight once and little else; each
GEMV on its own reaches only part of HBM bandwidth (short kernels spend much of their time
ramping up and draining), and between the qkv projection and the o projection the GPU runs
latency-bound kernels (q/k norm + rotary + KV append, attention, its reduce) that leave HBM
nearly idle. So right after layer i's qkv GEMV is queued, a one-warp-per-program kernel on a
side stream asks for layer i's o_proj, gate_up and down weights and layer i+1's qkv weights
(30 MB for the Qwen3-0.6B shape; H100's L2 is 50 MB); the GEMVs that follow read them from L2.
Values are never touched, so outputs are bit-identical with it on or off.

Used by `DecoderModel.forward` for steps of at most `max_tokens` tokens, in eager steps and in
CUDA-graph capture alike: the fork is an event the side stream waits on, and `join()` makes the
compute stream wait for the side stream before the forward returns (a capture must end joined).
The side-stream kernels only issue requests, so the join waits for almost nothing.
To extend (another family's weight names): the plan in `__init__`.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from infer_cluster.kernels.l2_prefetch import l2_prefetch, l2_prefetch_mode

_MAX_TOKENS_ENV = "INFER_CLUSTER_L2_PREFETCH_MAX_TOKENS"
DEFAULT_MAX_TOKENS = 16  # the small-batch GEMV path's rows (kernels/gemv_config.MAX_M)


class WeightPrefetcher:
    def __init__(self, layers, device: torch.device, mode: str, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.mode = mode
        self.max_tokens = max_tokens
        self.stream = torch.cuda.Stream(device)
        self._fork = torch.cuda.Event()
        self._done = torch.cuda.Event()
        self._dummy = torch.zeros(32, dtype=torch.int32, device=device)  # never written
        self._pending = False
        self.plan: list[list[torch.Tensor]] = []
        for i, layer in enumerate(layers):
            ask = [layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight]
            if i + 1 < len(layers):
                ask.append(layers[i + 1].self_attn.qkv_proj.weight)
            self.plan.append(ask)

    @classmethod
    def for_model(cls, model, device: torch.device) -> Optional["WeightPrefetcher"]:
        """A prefetcher for `model`'s layers, or None where the mode is off (not CUDA, pre-sm_90,
        `INFER_CLUSTER_L2_PREFETCH=off`). Bad environment values raise ValueError."""
        mode = l2_prefetch_mode(device)
        if mode == "off" or not len(model.layers):
            return None
        raw = os.environ.get(_MAX_TOKENS_ENV, str(DEFAULT_MAX_TOKENS)).strip()
        if not raw.isdigit():
            raise ValueError(f"{_MAX_TOKENS_ENV} must be a non-negative integer, got {raw!r}")
        return cls(model.layers, device, mode, int(raw))

    def wants(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.max_tokens

    def after_qkv(self, layer_index: int) -> None:
        """Queue layer `layer_index`'s prefetch on the side stream, after what the compute stream
        has queued so far (its qkv GEMV)."""
        self._fork.record(torch.cuda.current_stream())
        self.stream.wait_event(self._fork)
        with torch.cuda.stream(self.stream):
            l2_prefetch(self.plan[layer_index], self._dummy, self.mode)
        self._pending = True

    def join(self) -> None:
        """Make the compute stream wait for the side stream (a no-op when nothing was queued)."""
        if self._pending:
            self._done.record(self.stream)
            torch.cuda.current_stream().wait_event(self._done)
            self._pending = False
