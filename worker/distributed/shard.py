"""One rank's share of a replica: its process groups, its `ModelRunner` shard, and one step of
its pipeline stage. The same code runs on rank 0 (inside the replica) and on ranks 1..N-1.

Owns: joining the `torch.distributed` world (gloo on CPU; NCCL on CUDA plus a gloo group for
control traffic), creating one TP group per pipeline stage (every rank creates every group, in
the same order, as torch requires), building the `ModelRunner` for this rank's TP rank and
layer range, agreeing on the KV pool size (MIN over all ranks), the per-step control broadcast
(rank 0's msgpack step bytes as a uint8 tensor), and `run_step`: stage inputs from the
previous stage by `recv`, outputs to the next by `send`, and the sampled rows' logits from the
last stage's TP leader to rank 0.

Must never sample, schedule, or decide anything on its own: every rank derives its tensors
from the same broadcast `SchedulerOutput`, so all ranks issue the same collectives in the same
order. To add a per-step message (e.g. sampled ids instead of logits), send it in `run_step`
on both sides in the same position.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ..config import EngineConfig
from ..model_runner import ModelRunner, resolve_device
from ..models.decoder import ModelSpec
from ..models.parallel import ParallelState
from ..scheduler import SchedulerOutput
from .topology import DistributedOptions, RankLayout

log = logging.getLogger(__name__)


class RankGroups:
    """The process groups of one rank; `control` is always gloo (CPU tensors)."""

    def __init__(self, layout: RankLayout, device: torch.device, options: DistributedOptions,
                 store: dist.Store):
        timeout = datetime.timedelta(seconds=options.collective_timeout_s)
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group; "
                               "one tensor/pipeline-parallel replica per process")
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = dict(device_id=device) if device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=layout.rank, world_size=layout.world_size,
                                timeout=timeout, **kwargs)
        self.backend = backend
        # Control traffic (step bytes, KV agreement) stays on the CPU even when data uses NCCL.
        self.control = (dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo"
                        else dist.group.WORLD)
        self.tp_group = None
        for stage in range(layout.pipeline_parallel_size):
            ranks = layout.tp_group_ranks(stage)
            group = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
            if stage == layout.stage:
                self.tp_group = group

    @staticmethod
    def abort() -> None:
        """Unblock this process's pending collectives after a peer failed (NCCL would spin
        forever on a dead peer; gloo already raises when a peer's socket closes). Safe from any
        thread, also while another thread is still joining the group."""
        try:
            if not dist.is_initialized() or dist.get_backend() != "nccl":
                return
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:
                abort()
        except Exception:  # best effort: the replica is failing anyway
            log.exception("aborting the NCCL process group failed")

    @staticmethod
    def destroy() -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                log.exception("destroy_process_group failed")


class RankShard:
    """This rank's model shard and step execution."""

    def __init__(self, layout: RankLayout, config: EngineConfig, spec: ModelSpec, model_path: Path,
                 hf_config, max_model_len: int, options: DistributedOptions, store: dist.Store):
        self.layout = layout
        self.spec = spec
        device = resolve_device(config, layout.rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.groups = RankGroups(layout, device, options, store)
        ps = ParallelState(tp_rank=layout.tp_rank, tp_size=layout.tensor_parallel_size,
                           tp_group=self.groups.tp_group)
        self.runner = ModelRunner(config, spec, model_path, hf_config, max_model_len, ps=ps,
                                  layer_range=layout.layer_range, local_rank=layout.rank,
                                  agree_num_kv_blocks=self._agree_num_kv_blocks)
        self.device = self.runner.device
        self.dtype = self.runner.dtype

    def _agree_num_kv_blocks(self, num_blocks: int) -> int:
        """Every rank's pool must hold the same block ids: take the smallest."""
        t = torch.tensor([num_blocks], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.groups.control)
        return int(t.item())

    # -- control ----------------------------------------------------------------------------

    def broadcast_step(self, payload: Optional[bytes], length: int) -> bytes:
        """Rank 0 passes its step bytes; the others pass None and get them back."""
        if payload is not None:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            buf = torch.empty(length, dtype=torch.uint8)
        dist.broadcast(buf, src=0, group=self.groups.control)
        return payload if payload is not None else buf.numpy().tobytes()

    # -- one step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def run_step(self, out: SchedulerOutput) -> tuple[Optional[torch.Tensor], list[str]]:
        """Run this rank's stage. Rank 0 gets `(logits [num_sampled, vocab], request ids)`;
        other ranks get whatever their stage produced (ignored)."""
        runner, lay = self.runner, self.layout
        if lay.pipeline_parallel_size == 1 and runner.graphs is not None and _is_decode_only(out):
            return runner.execute(out)  # CUDA-graph path: identical decisions on every TP rank
        inputs = runner.context.prepare(out)
        num_tokens = inputs.input_ids.shape[0]
        num_sampled = len(inputs.sample_request_ids)
        hidden = residual = None
        if not lay.is_first_stage:
            buf = torch.empty(2, num_tokens, self.spec.hidden_size, dtype=self.dtype, device=self.device)
            dist.recv(buf, src=lay.prev_rank)
            hidden, residual = buf[0], buf[1]
        first, second = runner.execute_stage(inputs, hidden, residual)
        if not lay.is_last_stage:
            dist.send(torch.stack([first, second]), dst=lay.next_rank)
        logits = first if lay.is_last_stage else None
        if lay.pipeline_parallel_size > 1 and num_sampled:
            if lay.rank == lay.last_stage_leader:
                dist.send(logits.contiguous(), dst=0)
            elif lay.rank == 0:
                logits = torch.empty(num_sampled, self.spec.vocab_size, dtype=self.dtype, device=self.device)
                dist.recv(logits, src=lay.last_stage_leader)
        if lay.rank == 0 and not num_sampled:
            logits = torch.empty(0, self.spec.vocab_size, dtype=self.dtype, device=self.device)
        return logits, inputs.sample_request_ids


def _is_decode_only(out: SchedulerOutput) -> bool:
    return all(len(r.token_ids) == 1 and r.needs_sample for r in out.requests)
