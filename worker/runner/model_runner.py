"""`ModelRunner`: builds this rank's model on its device, loads weights, sizes and owns the KV
pool, and runs one forward pass per `SchedulerOutput`.

Owns: weight loading (checkpoint or `dummy`; the device and dtypes from
worker/runner/device_setup.py), the warm-up pass that
measures activation memory before the KV pool is sized from `gpu_memory_utilization`, and
`execute()`. It sees nothing of the scheduler but the `SchedulerOutput`, and returns logits of
the rows to sample (or, for a step the engine found all plain greedy, their argmax ids, from the
greedy decode graphs where they apply); sampling happens in the engine.
To extend (CUDA graphs, other attention backends): wrap `_forward`, keep `execute`'s contract.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from infer_cluster.kernels.argmax import row_argmax
from infer_cluster.protocol import OutOfMemoryError

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.runner.device_setup import resolve_device, resolve_dtype, resolve_kv_dtype
from infer_cluster.worker.runner.context import DynamicContext, StepInputs
from infer_cluster.worker.runner.cuda_graphs import DecodeGraphs
from infer_cluster.worker.runner.graph_set import capture_graph_set, verify_runs_enabled
from infer_cluster.worker.runner.mixed_graphs import MixedGraphs
from infer_cluster.worker.runner.step_rows import row_spans
from infer_cluster.worker.kv.copy import HostKVPool, build_host_pool, staging_device_bytes
from infer_cluster.worker.device.upload import MAPPED_UPLOAD, MappedUpload, step_capacity
from infer_cluster.worker.loading.loader import iter_checkpoint
from infer_cluster.worker.models.decoder import AttentionMetadata, DecoderModel, ModelSpec
from infer_cluster.worker.models.parallel import ParallelState
from infer_cluster.worker.sched.output import SchedulerOutput

log = logging.getLogger(__name__)

@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class ModelRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, model_path: Path, hf_config,
                 max_model_len: int, ps: Optional[ParallelState] = None,
                 layer_range: Optional[tuple[int, int]] = None, local_rank: int = 0,
                 agree_num_kv_blocks: Optional[Callable[[int], int]] = None,
                 kv_companion: Optional["ModelRunner"] = None, defer_graphs: bool = False):
        """`agree_num_kv_blocks` (ranks of one replica) gets this shard's pool size and returns
        the size every rank uses (the minimum), before the pool is allocated.
        `kv_companion`: another runner whose pool has this pool's block count under the same
        block ids (a draft model's, worker/engine/draft.py); its per-block bytes count when the
        pool is sized from memory and when a resize checks that the new pools fit.
        `defer_graphs`: capture no CUDA graphs until the first `resize_kv_pool` (a draft model's
        runner starts on a one-block pool)."""
        self.config = config
        self.kv_companion = kv_companion
        self.spec = spec
        self.ps = ps or ParallelState()
        self.device = resolve_device(config, local_rank)
        self.dtype = resolve_dtype(config, hf_config, self.device)
        self.kv_dtype = resolve_kv_dtype(config, self.dtype)
        self.max_model_len = max_model_len
        start, end = layer_range or (0, spec.num_layers)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        with _default_dtype(self.dtype), torch.device(self.device):
            self.model = DecoderModel(spec, self.ps, start, end)
        self._load_weights(model_path)
        self.model.eval()
        if config.enforce_eager:  # the Gluon GEMM pays off only where graphs replay it
            self.model.keep_cublas()
        self.model.init_rope(max_model_len, self.device)
        self.num_layers = end - start
        self.num_kv_heads = self.model.layers[0].self_attn.num_kv_heads if self.num_layers else 1
        self.num_kv_blocks = self._size_kv_pool()
        if agree_num_kv_blocks is not None:
            self.num_kv_blocks = agree_num_kv_blocks(self.num_kv_blocks)
        self.context = DynamicContext(self.num_layers, self.num_kv_blocks, config.block_size,
                                      self.num_kv_heads, spec.head_dim, self.kv_dtype, self.device)
        # The host tier (kv_offload_gib): its pinned pool and copies live in kv_copy.py.
        self.host_pool: Optional[HostKVPool] = None
        if config.kv_offload_gib:
            self.host_pool = build_host_pool(self.context.kv_caches, config.kv_offload_gib,
                                             self._bytes_per_block())
        self.num_host_blocks = self.host_pool.num_blocks if self.host_pool is not None else 0
        # Step inputs through a mapped pinned ring: no per-step pinning, and with a host tier they
        # skip the copy engines its loads keep busy (step_upload.py).
        self._upload: Optional[MappedUpload] = None
        if self.device.type == "cuda" and (self.host_pool is not None or MAPPED_UPLOAD):
            self._upload = MappedUpload(self.device, step_capacity(
                config.max_num_batched_tokens, config.max_num_seqs, -(-max_model_len // config.block_size)))
        self.graphs: Optional[DecodeGraphs] = None
        # a speculating engine's verify steps (decode rows, runs of one request's positions)
        self.verify_graphs: Optional[DecodeGraphs] = None
        self.mixed_graphs: Optional[MixedGraphs] = None  # small steps that are not decode-only
        # Graphs here only for a single rank; a tensor-parallel shard's graphs are captured by
        # RankShard, in lock step with the other ranks (docs/parallel.md, "CUDA graphs").
        self._uses_graphs = (self.device.type == "cuda" and not config.enforce_eager
                             and self.ps.tp_size == 1 and self.model.is_last and self.model.is_first)
        # A speculating engine's verify steps (decode rows, one a position) read a request's KV
        # once per chunk of its rows (`row_span`), through verify graphs of their own (graph_set.py)
        self._verifies_runs = config.speculative_config is not None and verify_runs_enabled()
        if not defer_graphs:  # a draft's placeholder pool: its graphs come with its real pool
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        """(Re-)capture the decode graphs over the current KV tensors: a graph bakes in their
        addresses, so a new pool needs new graphs."""
        if self._uses_graphs:  # worker/runner/graph_set.py
            self.graphs, self.verify_graphs, self.mixed_graphs = capture_graph_set(
                self._forward_logits, self._greedy_forward, self._forward_sampled,
                self.context.kv_caches, self.config, self.max_model_len, self.device,
                copy_engine_busy=self.host_pool is not None, verify_runs=self._verifies_runs)
            self.takes_greedy_ids = bool(self.graphs.greedy_graphs)

    @property
    def verify_greedy_rows(self) -> int:
        """The most positions a verify step of plain greedy rows runs as decode rows from the
        verify graphs (their greedy-only sizes past `verify_max_rows`); 0 without them."""
        graphs = self.verify_graphs
        return graphs.max_batch if graphs is not None and graphs.greedy_graphs else 0

    def release_graphs(self) -> None:
        """Destroy the CUDA graphs (before their KV pool is replaced without `prepare_kv_resize`)."""
        for graphs in (self.mixed_graphs, self.verify_graphs, self.graphs):
            if graphs is not None:
                graphs.release()
        self.graphs = self.mixed_graphs = self.verify_graphs = None
        self.takes_greedy_ids = False

    # -- resize (worker/kv/resize.py plans it; DynamicEngine.reset_cache drives it) -------------

    def _kv_layout(self, kv_cache_dtype: str) -> tuple[torch.dtype, int]:
        """Storage dtype and bytes per block for a `kv_cache_dtype` choice."""
        kv_dtype = resolve_kv_dtype(self.config.replace(kv_cache_dtype=kv_cache_dtype), self.dtype)
        return kv_dtype, DynamicContext.bytes_per_block(self.num_layers, self.config.block_size,
                                                        self.num_kv_heads, self.spec.head_dim, kv_dtype)

    def same_bytes_blocks(self, kv_cache_dtype: str) -> int:
        """How many blocks of `kv_cache_dtype` storage the current pool's bytes hold."""
        return max(1, self.num_kv_blocks * self._bytes_per_block() // self._kv_layout(kv_cache_dtype)[1])

    def prepare_kv_resize(self, num_blocks: int, kv_cache_dtype: str) -> bool:
        """Check that a pool of `num_blocks` blocks of `kv_cache_dtype` storage fits; returns
        whether it fits beside the current one (so kept blocks can be copied across). Raises
        `OutOfMemoryError`, changing nothing, when it cannot fit at all: on a GPU it must fit in
        free memory plus the current pool, less the share `gpu_memory_utilization` keeps back.
        With a `kv_companion`, its new pool (the same count, reallocated after this one) must
        fit too, in what its old pool frees. On a GPU the decode graphs are released here (their
        memory counts as free); the following `resize_kv_pool` captures new ones."""
        new_bytes = num_blocks * self._kv_layout(kv_cache_dtype)[1]
        old_bytes = self.num_kv_blocks * self._bytes_per_block()
        companion = self.kv_companion
        if companion is not None:  # both pools change; only this one may be copied beside
            companion_new = num_blocks * companion.kv_block_bytes(kv_cache_dtype)
            companion_old = companion.num_kv_blocks * companion.bytes_per_block
        else:
            companion_new = companion_old = 0
        if self.device.type == "cuda":
            self.release_graphs()  # their pool and their hold on the old KV go first
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            # Idle activation memory is free now; keep the share gpu_memory_utilization leaves.
            free = max(0, free - int(total * (1 - self.config.gpu_memory_utilization)))
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if new_bytes + companion_new > free + old_bytes + companion_old:
            self._capture_graphs()
            draft = " (with the draft model's pool)" if companion is not None else ""
            raise OutOfMemoryError(
                f"a KV pool of {num_blocks} blocks{draft} needs "
                f"{(new_bytes + companion_new) / 2**30:.2f} GiB; "
                f"{(free + old_bytes + companion_old) / 2**30:.2f} GiB are free on {self.device} "
                f"counting the current pool{'s' if companion is not None else ''}")
        return new_bytes <= free

    @torch.inference_mode()
    def resize_kv_pool(self, num_blocks: int, kv_cache_dtype: str, block_map: dict[int, int]) -> None:
        """Replace the KV pool with `num_blocks` blocks of `kv_cache_dtype` storage (checked by
        `prepare_kv_resize` first), copying each old block `b` to `block_map[b]` (same dtype
        only; an empty map frees the old pool first). The host tier's pool follows: pointed at
        the new tensors, or rebuilt empty in the new layout for a new dtype. Raises
        `OutOfMemoryError` if the allocation fails anyway; the old pool (same count and dtype)
        is then back in place, empty if it had to go."""
        kv_dtype, per_block = self._kv_layout(kv_cache_dtype)
        if self.host_pool is not None:
            self.host_pool.wait_loads()  # swap-ins in flight land before blocks are copied
        old = self.context
        self.context = None
        if not block_map:
            del old
            old = None
        try:
            self.context = DynamicContext(self.num_layers, num_blocks, self.config.block_size,
                                          self.num_kv_heads, self.spec.head_dim, kv_dtype, self.device)
        except torch.OutOfMemoryError:
            self.context = old or DynamicContext(self.num_layers, self.num_kv_blocks,
                                                 self.config.block_size, self.num_kv_heads,
                                                 self.spec.head_dim, self.kv_dtype, self.device)
            if self.host_pool is not None:
                self.host_pool.kv_caches = self.context.kv_caches
            self._capture_graphs()
            raise OutOfMemoryError(f"could not allocate a KV pool of {num_blocks} blocks "
                                   f"({num_blocks * per_block / 2**30:.2f} GiB) on {self.device}") from None
        if block_map:
            src = torch.tensor(list(block_map), dtype=torch.int64, device=self.device)
            dst = torch.tensor(list(block_map.values()), dtype=torch.int64, device=self.device)
            for old_layer, new_layer in zip(old.kv_caches, self.context.kv_caches):
                for a, b in zip(old_layer, new_layer):
                    if a is not None:
                        b.index_copy_(0, dst, a.index_select(0, src))
        del old
        if self.host_pool is not None:
            if kv_dtype == self.kv_dtype:
                self.host_pool.kv_caches = self.context.kv_caches
            else:
                self.host_pool = None  # the old pinned pool goes before the new one is made
                self.host_pool = build_host_pool(self.context.kv_caches, self.config.kv_offload_gib,
                                                 per_block)
                self.num_host_blocks = self.host_pool.num_blocks
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # a smaller pool gives its memory back to the device
        self.num_kv_blocks = num_blocks
        self.kv_dtype = kv_dtype
        self.config = self.config.replace(num_kv_blocks=num_blocks, kv_cache_dtype=kv_cache_dtype)
        self._capture_graphs()
        log.info("KV pool resized: %d blocks of %d tokens (%.2f GiB, %s), %d block(s) kept",
                 num_blocks, self.config.block_size, num_blocks * per_block / 2**30,
                 str(kv_dtype).replace("torch.", ""), len(block_map))

    # -- setup ----------------------------------------------------------------------------------

    def _load_weights(self, model_path: Path) -> None:
        if self.config.load_format == "dummy":
            gen = torch.Generator(device=self.device).manual_seed(self.config.seed)
            for name, p in self.model.named_parameters():
                if name.endswith("norm.weight"):
                    p.data.fill_(1.0)
                else:
                    p.data.normal_(0.0, 0.02, generator=gen)
            return
        loaded = self.model.load_weights(iter_checkpoint(model_path))
        missing = sorted(set(dict(self.model.named_parameters())) - loaded)
        if missing:
            raise ValueError(f"checkpoint {str(model_path)!r} lacks weights for: {', '.join(missing[:8])}"
                             + (" ..." if len(missing) > 8 else ""))

    @property
    def bytes_per_block(self) -> int:
        """K + V bytes of one block of this runner's pool (all its layers)."""
        return self._bytes_per_block()

    def kv_block_bytes(self, kv_cache_dtype: str) -> int:
        """K + V bytes of one block of `kv_cache_dtype` storage (all this runner's layers)."""
        return self._kv_layout(kv_cache_dtype)[1]

    def _bytes_per_block(self) -> int:
        return DynamicContext.bytes_per_block(self.num_layers, self.config.block_size,
                                              self.num_kv_heads, self.spec.head_dim, self.kv_dtype)

    def _size_kv_pool(self) -> int:
        """Blocks to allocate: the configured count, else what fits the memory budget after a
        warm-up pass of `max_num_batched_tokens` tokens, never more than the most that
        `max_num_seqs` sequences of `max_model_len` tokens could use."""
        bs = self.config.block_size
        most_useful = self.config.max_num_seqs * (-(-self.max_model_len // bs)) + 1
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        per_block = self._bytes_per_block() + (self.kv_companion.bytes_per_block
                                               if self.kv_companion is not None else 0)
        if self.device.type != "cuda":
            return max(1, min(most_useful, int(self.config.cpu_kv_cache_gib * 2**30) // per_block))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._warm_up()
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        used_by_others = total - free - torch.cuda.memory_reserved(self.device)
        budget = total * self.config.gpu_memory_utilization - peak - used_by_others
        budget -= staging_device_bytes(self.config.kv_offload_gib, self._bytes_per_block())  # host tier staging
        num_blocks = int(budget // per_block)
        if num_blocks <= 0:
            raise OutOfMemoryError(
                f"no GPU memory left for the KV cache on {self.device} (weights + activations peak at "
                f"{peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB); raise gpu_memory_utilization "
                f"or lower max_num_batched_tokens")
        log.info("KV pool: %d blocks of %d tokens (%.2f GiB, %s), activation peak %.2f GiB",
                 min(num_blocks, most_useful), bs, min(num_blocks, most_useful) * per_block / 2**30,
                 str(self.kv_dtype).replace("torch.", ""), peak / 2**30)
        return min(num_blocks, most_useful)

    @torch.inference_mode()
    def _warm_up(self) -> None:
        bs = self.config.block_size
        n = min(self.config.max_num_batched_tokens, self.max_model_len)
        num_blocks = -(-n // bs)
        ctx = DynamicContext(self.num_layers, num_blocks, bs, self.num_kv_heads, self.spec.head_dim,
                             self.kv_dtype, self.device)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, device=dev),
            block_tables=torch.arange(num_blocks, dtype=torch.int32, device=dev)[None],
            seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
            max_query_len=n)
        ids = torch.zeros(n, dtype=torch.int64, device=dev)
        hidden = residual = None
        if not self.model.is_first:  # a later pipeline stage: stand-in activations
            hidden = torch.zeros(n, self.spec.hidden_size, dtype=self.dtype, device=dev)
            residual = torch.zeros_like(hidden)
        hidden = self._forward(ids, torch.arange(n, device=dev), meta, ctx.kv_caches, hidden, residual)
        if self.model.is_last:
            self.model.compute_logits(hidden[-min(n, self.config.max_num_seqs):])
        torch.cuda.synchronize(dev)
        del ctx

    # -- per step -------------------------------------------------------------------------------

    def _forward(self, input_ids, positions, meta, kv_caches, hidden=None, residual=None):
        out, _ = self.model(input_ids, positions, meta, kv_caches, hidden, residual)
        return out

    def _forward_logits(self, input_ids, positions, meta, kv_caches, gather: bool = True):
        """Decode-only forward: every row is sampled (the body of the CUDA graphs). The final
        add + norm run inside the LM head (one GEMV launch at small batch, kernels/gemv.py).
        `gather=False`: this rank's vocab shard of the logits (T > 1)."""
        hidden, residual = self.model(input_ids, positions, meta, kv_caches, final_norm=False)
        return self.model.compute_logits(hidden, residual, gather)

    def _greedy_forward(self, input_ids, positions, meta, kv_caches) -> torch.Tensor:
        """The decode forward of an all-greedy step (the body of the greedy graphs): the
        argmax ids (int64 `[rows]`) of `_forward_logits`."""
        return row_argmax(self._forward_logits(input_ids, positions, meta, kv_caches))

    def _forward_stage_decode(self, input_ids, positions, meta, kv_caches, stage_in=None):
        """Decode-only forward of a pipeline stage (the body of its CUDA graphs at P > 1):
        `stage_in` `[rows, 2, hidden]` from the previous stage (None on the first). Returns
        `[rows, 2, hidden]` for the next stage, or the logits on the last stage."""
        hidden = residual = None
        if stage_in is not None:
            hidden, residual = stage_in[:, 0].contiguous(), stage_in[:, 1].contiguous()
        hidden, residual = self.model(input_ids, positions, meta, kv_caches, hidden, residual, final_norm=False)
        if self.model.is_last:
            return self.model.compute_logits(hidden, residual)
        return torch.stack([hidden, residual], dim=1)

    def _forward_sampled(self, input_ids, positions, meta, kv_caches, sample_indices):
        """Any step: the logits of the rows at `sample_indices` (the body of the mixed graphs and
        of eager steps); the final norm runs on the sampled rows only."""
        hidden, residual = self.model(input_ids, positions, meta, kv_caches, final_norm=False)
        return self.model.compute_logits(hidden[sample_indices], residual[sample_indices])

    @torch.inference_mode()
    def swap_blocks(self, out: SchedulerOutput) -> None:
        """Run the step's host-tier copies (all swap-outs, then the swap-ins, one load per
        request); the loads stay in flight until the scheduler sees them landed (worker/kv/copy.py)."""
        self.host_pool.swap(out.swap_out, out.swap_in, out.loads)

    def loads_landed(self, load_ids: list[int]) -> list[int]:
        """The host-tier loads among `load_ids` that finished (never blocks)."""
        return self.host_pool.landed(load_ids) if self.host_pool is not None else load_ids

    def wait_load(self, load_id: int) -> None:
        if self.host_pool is not None:
            self.host_pool.wait_load(load_id)

    def verify_step(self) -> None:
        """Called once a step's ids reached the host: a tensor/pipeline-parallel runner raises
        there if its rank group failed during the step; one rank has nothing to check."""

    # One GPU's device always drains: waits on its steps block (worker/device/wait.py).
    wait_gave_up = None

    # With greedy decode graphs (`INFER_CLUSTER_GREEDY_GRAPH_MAX`), an all-greedy step may ask
    # `execute` for the argmax ids instead of the logits (as a T > 1 runner does, runner.py).
    takes_greedy_ids = False

    # `execute` takes `fill_inputs`, so a speculating engine may chain verify steps
    # (worker/spec_decode/chain.py); a tensor-parallel runner's step codec carries no such hook.
    chains_verify = True

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, prev_ids: Optional[torch.Tensor] = None,
                prev_rows: tuple = (), greedy_ids: bool = False,
                fill_inputs: Optional[Callable] = None) -> tuple[torch.Tensor, list[str]]:
        """Run one step. Returns logits `[num_sampled, vocab]` (model dtype; the sampler works
        in float32) and the request id of each row. `prev_ids` / `prev_rows`: see
        `DynamicContext.prepare`. `greedy_ids` (only where `takes_greedy_ids`; the caller found
        every sampled row plain greedy): the rows' argmax ids (int64) instead of the logits, from
        the greedy graph where the step replays one. `fill_inputs(input_ids, positions,
        slot_mapping, seq_lens, block_tables)`: called on the device tensors the forward reads,
        after the step was written into them and before the forward (a chained verify step
        rewrites its rows there, worker/spec_decode/chain.py)."""
        graphs, spans = self.graphs, None
        if self._verifies_runs:  # a verify step as decode rows: runs of one request's rows
            spans = row_spans([r.request_id for r in out.requests])
            if spans is not None and self.verify_graphs is not None:
                graphs = self.verify_graphs
        if graphs is not None and graphs.decode_only(out, greedy_ids):  # straight into the graph's inputs
            result, are_ids = graphs.run_step(out, self.context.block_mirror, self.config.block_size,
                                              prev_ids, prev_rows, greedy=greedy_ids, row_span=spans,
                                              before_replay=fill_inputs)
            if greedy_ids and not are_ids:
                result = row_argmax(result)
            return result, [r.request_id for r in out.requests]
        inputs = self.context.prepare(out, prev_ids, prev_rows, self._upload, row_span=spans)
        meta = inputs.meta
        if fill_inputs is not None:
            fill_inputs(inputs.input_ids, inputs.positions, meta.slot_mapping, meta.seq_lens, meta.block_tables)
        n = inputs.input_ids.shape[0]
        ids = inputs.sample_request_ids
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(len(out.requests), n, len(ids)):
            logits = self.mixed_graphs.run(inputs.input_ids, inputs.positions, meta, inputs.sample_indices)
        else:
            logits = self._forward_sampled(inputs.input_ids, inputs.positions, meta, self.context.kv_caches,
                                           inputs.sample_indices)
        return (row_argmax(logits) if greedy_ids and len(ids) else logits), ids

    @torch.inference_mode()
    def execute_stage(self, inputs: StepInputs, hidden: Optional[torch.Tensor] = None,
                      residual: Optional[torch.Tensor] = None, gather: bool = True):
        """Run this shard's layers on prepared inputs (pipeline parallel); a later stage takes
        the previous stage's `(hidden, residual)`. Returns `(hidden, residual)` on a stage that
        is not the last, and `(logits [num_sampled, vocab], None)` on the last (`gather=False`:
        this rank's vocab shard of them)."""
        hidden, residual = self.model(inputs.input_ids, inputs.positions, inputs.meta,
                                      self.context.kv_caches, hidden, residual)
        if not self.model.is_last:
            return hidden, residual
        if inputs.sample_indices.numel() == 0:  # a prefill chunk: no collective on empty rows
            return torch.empty(0, self.spec.vocab_size, dtype=hidden.dtype, device=hidden.device), None
        return self.model.compute_logits(hidden[inputs.sample_indices], gather=gather), None
