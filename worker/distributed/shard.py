"""One rank's share of a replica: its process groups, its `ModelRunner` shard, its decode
graphs, and one step of its pipeline stage. The same code runs on rank 0 (inside the replica)
and on ranks 1..N-1.

Owns: joining the `torch.distributed` world (gloo on CPU; NCCL on CUDA plus a gloo group for
control traffic), the step channel's wait group (gloo, no practical timeout: idle ranks wait
there), one TP group per pipeline stage (every rank creates every group, in the same order, as
torch requires), the `ModelRunner` for this rank's TP rank and layer range, the KV pool size
(MIN over all ranks), the symmetric-memory buffer of small TP all-reduces
(`symm_allreduce.py`), the decode CUDA graphs (captured at start-up on every TP rank in lock
step, with barriers on the CPU group before every size and after the ladder; at P > 1 one ladder
per stage, with the stage transfers outside; `INFER_CLUSTER_STAGE_GRAPHS=0` keeps stages eager), and
`run_step`: unpack the broadcast step tensor, replay the graph it names or run eagerly, take
stage inputs from the previous stage by `recv`, send outputs to the next by `send`, and the
sampled rows' logits from the last stage's TP leader to rank 0. At T > 1, P = 1 a step the
header marks `greedy_ids` ends at this rank's vocab shard of the logits and gathers only argmax
pairs (`ParallelLMHead.greedy_ids`; the decode graphs have a greedy variant of each size).
With pipeline micro-batches (`EngineConfig.microbatch_depth` > 1) the step goes stage to
stage instead (`relay.py`): rank 0 broadcasts it only to its own stage's TP ranks (a gloo group
of their own), every stage passes it on to the next with the activations, and rank 0
`submit_step`s without waiting for the logits, which it receives later
(`StageRelay.post_logits`).

Must never sample, schedule, or decide anything on its own: every rank derives its tensors
and its graph-or-eager choice from the same broadcast header and payload, so all ranks issue
the same collectives in the same order. To add a per-step message (e.g. sampled ids instead of
logits), send it in `run_step` on both sides in the same position.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from infer_cluster.protocol.errors import ConfigError

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.runner.cuda_graphs import DecodeGraphs, capture_sizes
from infer_cluster.worker.runner.device_setup import resolve_device
from infer_cluster.worker.runner.model_runner import ModelRunner
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.models.parallel import MAX_PAIR_VOCAB, ParallelState
from infer_cluster.worker.distributed.channel import PendingIds, StepChannel, payload_on_device
from infer_cluster.worker.distributed.relay import StageRelay
from infer_cluster.worker.distributed.symm_allreduce import SymmAllReduce
from infer_cluster.worker.distributed.step_codec import INT32_MAX, STOP_HEADER, Op, StepHeader, unpack_step
from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout

log = logging.getLogger(__name__)

STAGE_GRAPHS_ENV = "INFER_CLUSTER_STAGE_GRAPHS"
GREEDY_IDS_ENV = "INFER_CLUSTER_TP_GREEDY_IDS"


def greedy_ids_enabled() -> bool:
    """At T > 1, greedy steps gather argmax pairs, not logits: on unless
    `INFER_CLUSTER_TP_GREEDY_IDS=0` (every step gathers the logits, for A/B runs)."""
    return os.environ.get(GREEDY_IDS_ENV, "1").strip() != "0"


def stage_graphs_enabled() -> bool:
    """Decode graphs per pipeline stage at P > 1: on unless `INFER_CLUSTER_STAGE_GRAPHS=0`
    (the eager stages, kept for A/B runs)."""
    return os.environ.get(STAGE_GRAPHS_ENV, "1").strip() != "0"


WAIT_TIMEOUT = datetime.timedelta(days=365)
CPU_INLINE_CAPACITY = 16384  # int32 values of payload carried in the header broadcast (gloo)


class RankGroups:
    """The process groups of one rank; `control` is always gloo (CPU tensors)."""

    def __init__(self, layout: RankLayout, device: torch.device, options: DistributedOptions,
                 store: dist.Store, pipelined: bool = False):
        timeout = datetime.timedelta(seconds=options.collective_timeout_s)
        # Groups are made with the longer join timeout (a rank may still be importing torch or
        # loading its shard) and get the collective timeout once start-up is over
        # (`settle_timeouts`, at the end of `RankShard.__init__`).
        join = datetime.timedelta(seconds=options.join_timeout_s)
        self._timeout = timeout
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group; "
                               "one tensor/pipeline-parallel replica per process")
        backend = "nccl" if device.type == "cuda" else "gloo"
        # No `device_id`: a default group bound to a device makes torch create every NCCL subgroup
        # by ncclCommSplit, a collective of the whole world in which the ranks outside the new
        # group take part at `new_group` time while its members split only at their first
        # collective. At T x P (two TP groups) the ranks of stage 1 then wait in stage 0's split
        # for ranks 0 and 1, which wait for them in the next gloo collective: start-up hung on four
        # H200s (2026-11-28; the stacks came from `launcher.dump_stacks`). Unbound, each NCCL group
        # makes its own communicator among its members, at its first collective (`_warm_up`).
        dist.init_process_group(backend, store=store, rank=layout.rank, world_size=layout.world_size,
                                timeout=join)
        self.backend = backend
        # Control traffic (KV agreement, capture barriers) stays on the CPU even when data uses NCCL.
        self.control = (dist.new_group(backend="gloo", timeout=join) if backend != "gloo"
                        else dist.group.WORLD)
        # Where ranks 1..N-1 wait for the next step's header: an idle replica may wait for hours.
        self.wait = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)
        self.tp_group = None
        for stage in range(layout.pipeline_parallel_size):
            ranks = layout.tp_group_ranks(stage)
            group = dist.new_group(ranks, timeout=join) if len(ranks) > 1 else None
            if stage == layout.stage:
                self.tp_group = group
        # Micro-batches: stage 0's TP ranks wait for steps here (later stages get them by relay).
        self.stage_wait = None
        if pipelined and layout.tensor_parallel_size > 1:
            group = dist.new_group(layout.tp_group_ranks(0), backend="gloo", timeout=WAIT_TIMEOUT)
            self.stage_wait = group if layout.is_first_stage else None
        if backend == "nccl":
            self._warm_up(device)

    def settle_timeouts(self) -> None:
        """Start-up is over on every rank: the groups made with the join timeout bound their
        collectives by the collective timeout from now on."""
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        if set_timeout is None:  # an older torch: collectives keep the join timeout
            return
        for group in {dist.group.WORLD, self.control, self.tp_group} - {None}:
            set_timeout(self._timeout, group)

    def _warm_up(self, device: torch.device) -> None:
        """Make this rank's NCCL communicators now, outside any CUDA-graph capture: one all-reduce
        on its TP group (its members only) and one on the whole world, in the same order on every
        rank."""
        probe = torch.ones(1, device=device)
        if self.tp_group is not None:
            dist.all_reduce(probe, group=self.tp_group)
        dist.all_reduce(probe)
        torch.cuda.synchronize(device)

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
    """This rank's model shard, decode graphs and step execution."""

    def __init__(self, layout: RankLayout, config: EngineConfig, spec: ModelSpec, model_path: Path,
                 hf_config, max_model_len: int, options: DistributedOptions, store: dist.Store,
                 kv_companion=None):
        self.layout = layout
        self.spec = spec
        device = resolve_device(config, layout.rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.depth = config.microbatch_depth  # > 1: pipeline micro-batches (relay.py)
        self.groups = RankGroups(layout, device, options, store, pipelined=self.depth > 1)
        ps = ParallelState(tp_rank=layout.tp_rank, tp_size=layout.tensor_parallel_size,
                           tp_group=self.groups.tp_group)
        # Before the model: the buffer is a collective over every rank, and the KV pool is sized
        # from what memory is left.
        ps.fast_all_reduce = SymmAllReduce.create(self.groups.tp_group, device, self.groups.control)
        self.runner = ModelRunner(config, spec, model_path, hf_config, max_model_len, ps=ps,
                                  layer_range=layout.layer_range, local_rank=layout.rank,
                                  agree_num_kv_blocks=self._agree_num_kv_blocks, kv_companion=kv_companion)
        self.device = self.runner.device
        self.dtype = self.runner.dtype
        self.block_size = config.block_size
        # At T > 1, P = 1 a step that rank 0 marks `greedy_ids` gathers argmax pairs, not the
        # logits (eagerly, or by the greedy variant of its decode graph).
        self.greedy_ids_ok = bool(self._min_over_ranks(int(
            layout.pipeline_parallel_size == 1 and layout.tensor_parallel_size > 1
            and spec.vocab_size <= MAX_PAIR_VOCAB and greedy_ids_enabled())))
        if self.runner.num_kv_blocks * config.block_size > INT32_MAX:
            raise ConfigError(f"{self.runner.num_kv_blocks} KV blocks of {config.block_size} tokens "
                              f"exceed the int32 slot ids of the step tensor; lower num_kv_blocks")
        inline = 0 if self.device.type == "cuda" else CPU_INLINE_CAPACITY
        self.relay: Optional[StageRelay] = None
        if self.depth == 1:
            self.channel = StepChannel(self.groups.wait, dist.group.WORLD, self.device, inline)
        else:
            stage_wait = self.groups.stage_wait
            self.channel = (StepChannel(stage_wait, self.groups.tp_group, self.device, inline)
                            if stage_wait is not None else None)
            self.relay = StageRelay(layout, self.groups.wait, dist.group.WORLD, self.device,
                                    options.collective_timeout_s, keep=self.depth)
        self.graphs: Optional[DecodeGraphs] = None
        if self.device.type == "cuda" and not config.enforce_eager and self._agree_graphs():
            self.graphs = self._capture_graphs(config, max_model_len)
        self._min_over_ranks(1)  # every rank is past its start-up ...
        self.groups.settle_timeouts()  # ... so collectives get their own timeout

    def _min_over_ranks(self, value: int) -> int:
        """The smallest `value` of all ranks (one MIN on the control group): what every rank
        can do, so that all issue the same collectives."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.groups.control)
        return int(t.item())

    def _agree_graphs(self) -> bool:
        """Decode graphs at P = 1 always; at P > 1 per stage unless `INFER_CLUSTER_STAGE_GRAPHS=0`
        (1.31x the eager stages at P = 2 on 2x H100, 2026-11-26). Every rank must agree, so a
        rank that would not capture turns capture off everywhere."""
        want = self.layout.pipeline_parallel_size == 1 or stage_graphs_enabled()
        return bool(self._min_over_ranks(int(want)))

    def _agree_num_kv_blocks(self, num_blocks: int) -> int:
        """Every rank's pool must hold the same block ids: take the smallest."""
        return self._min_over_ranks(num_blocks)

    def _capture_graphs(self, config: EngineConfig, max_model_len: int) -> DecodeGraphs:
        """Capture the same ladder in the same order on every TP rank (see docs/parallel.md,
        "CUDA graphs"). The ladder comes from the shared config; checking it costs one small
        all-reduce and turns a mismatch (a bug) into an error instead of a hang."""
        max_batch = min(config.max_num_seqs, 512)
        width = -(-max_model_len // config.block_size)
        sizes = capture_sizes(max_batch)
        mine = torch.tensor([len(sizes), max_batch, width, sum(sizes)], dtype=torch.int64)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.groups.control)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.groups.control)
        if not torch.equal(lo, hi):
            raise RuntimeError(f"rank {self.layout.rank}: decode-graph ladders differ between ranks "
                               f"(min {lo.tolist()}, max {hi.tolist()}); all ranks must capture alike")
        staged = self.layout.pipeline_parallel_size > 1
        forward = self.runner._forward_stage_decode if staged else self.runner._forward_logits
        stage_hidden = self.spec.hidden_size if staged and not self.layout.is_first_stage else 0
        graphs = DecodeGraphs(forward, self.runner.context.kv_caches, max_batch, width, self.device,
                              before_capture=self._barrier, capture_error_mode="thread_local",
                              stage_hidden=stage_hidden, stage_dtype=self.dtype,
                              greedy_forward=self._greedy_forward if self.greedy_ids_ok else None)
        self._barrier()
        return graphs

    def _greedy_forward(self, input_ids, positions, meta, kv_caches) -> torch.Tensor:
        """The decode forward of a greedy step: this rank's logit shard, then the argmax ids."""
        local = self.runner._forward_logits(input_ids, positions, meta, kv_caches, gather=False)
        return self.runner.model.lm_head.greedy_ids(local)

    def _barrier(self, _batch: int = 0) -> None:
        dist.barrier(group=self.groups.control)

    def release_graphs(self) -> None:
        """Destroy the decode graphs; NCCL cannot destroy or abort its communicators while a
        captured graph holds them. Call from the thread that replays, before leaving the group."""
        graphs, self.graphs = self.graphs, None
        if graphs is not None:
            graphs.release()

    # -- how steps arrive ---------------------------------------------------------------------

    def send_step(self, header: StepHeader, payload: Optional[np.ndarray],
                  pending: Optional[PendingIds] = None) -> Optional[torch.Tensor]:
        """Rank 0: hand the step to the ranks that need it from rank 0; returns the payload on
        this rank's device, its `pending` input ids written in (on the device)."""
        if self.relay is None:
            return self.channel.send(header, payload, pending)
        if self.channel is not None:
            data = self.channel.send(header, payload, pending)
        else:
            data = None if payload is None else payload_on_device(payload, pending, self.device)
        self.relay.forward_step(header, data)  # rank 0 is never the last of P > 1 stages
        return data

    def next_step(self) -> tuple[StepHeader, Optional[torch.Tensor]]:
        """Ranks 1..N-1: wait for the next step (with micro-batches: from rank 0's stage
        broadcast or from the previous stage, and pass it on to the next stage at once)."""
        if self.relay is None:
            return self.channel.recv()
        lay = self.layout
        header, payload = self.channel.recv() if lay.is_first_stage else self.relay.recv_step()
        if not lay.is_last_stage:
            self.relay.forward_step(header, payload)
        if header.op is Op.STOP:
            self.relay.flush()
        return header, payload

    def send_stop(self) -> None:
        """Rank 0: the STOP step to every rank (by the same path as steps)."""
        self.send_step(STOP_HEADER, None)
        if self.relay is not None:
            self.relay.flush()

    # -- one step ---------------------------------------------------------------------------

    @torch.inference_mode()
    def submit_step(self, header: StepHeader, payload: torch.Tensor):
        """Rank 0 with micro-batches: run stage 0's share, send the activations on, and post
        the receive of the logits without waiting. Returns (logits buffer, work or None)."""
        self._run_stage(header, payload)
        relay, spec = self.relay, self.spec
        if header.num_sampled:
            logits, work = relay.post_logits(header.num_sampled, spec.vocab_size, self.dtype)
        else:
            logits, work = torch.empty(0, spec.vocab_size, dtype=self.dtype, device=self.device), None
        relay.end_step()
        return logits, work

    def _run_stage(self, header: StepHeader, payload: torch.Tensor) -> None:
        """Micro-batches, every rank: this stage's share; activations and logits go by relay."""
        lay, relay = self.layout, self.relay
        if header.op is Op.GRAPH:
            # A copy: the next group's replay rewrites the graph's output while this `isend`
            # may still read it (the blocking sends of run_step need none).
            out = self._replay_stage(header, payload, relay.recv_into)
            if not lay.is_last_stage:
                relay.send_packed(out.clone())
            elif lay.rank == lay.last_stage_leader:
                relay.send_logits(out.clone())
            return
        hidden = residual = None
        if not lay.is_first_stage:
            buf = relay.recv_activations(header.num_tokens, self.spec.hidden_size, self.dtype)
            hidden, residual = buf[0], buf[1]
        first, second = self.runner.execute_stage(unpack_step(header, payload), hidden, residual)
        if not lay.is_last_stage:
            relay.send_activations(first, second)
        elif lay.rank == lay.last_stage_leader and header.num_sampled:
            relay.send_logits(first)

    @torch.inference_mode()
    def run_step(self, header: StepHeader, payload: torch.Tensor) -> Optional[torch.Tensor]:
        """Run this rank's share of the step. Rank 0 gets the sampled rows' logits
        `[num_sampled, vocab]` (in payload row order), or their argmax ids `[num_sampled]` for
        a step marked `greedy_ids`; other ranks get whatever their stage produced (ignored)."""
        runner, lay = self.runner, self.layout
        if self.relay is not None:  # ranks 1..N-1 with micro-batches (rank 0 uses submit_step)
            self._run_stage(header, payload)
            self.relay.end_step()
            return None
        if header.op is Op.GRAPH and lay.pipeline_parallel_size == 1:
            inputs = unpack_step(header, payload, widen=False)
            return self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta,
                                   batch=header.graph_batch, greedy=bool(header.greedy_ids))
        if header.op is Op.GRAPH:  # P > 1, one step at a time: blocking sends, as below
            out = self._replay_stage(header, payload, lambda buf: dist.recv(buf, src=lay.prev_rank))
            if not lay.is_last_stage:
                dist.send(out, dst=lay.next_rank)
                out = None
            return self._logits_to_rank0(out, header.num_sampled)
        inputs = unpack_step(header, payload)
        num_tokens, num_sampled = header.num_tokens, header.num_sampled
        hidden = residual = None
        if not lay.is_first_stage:
            buf = torch.empty(2, num_tokens, self.spec.hidden_size, dtype=self.dtype, device=self.device)
            dist.recv(buf, src=lay.prev_rank)
            hidden, residual = buf[0], buf[1]
        if header.greedy_ids:  # P = 1, every sampled row greedy: ids `[num_sampled]`, not logits
            local, _ = runner.execute_stage(inputs, gather=False)
            return runner.model.lm_head.greedy_ids(local)
        first, second = runner.execute_stage(inputs, hidden, residual)
        if not lay.is_last_stage:
            dist.send(torch.stack([first, second]), dst=lay.next_rank)
        return self._logits_to_rank0(first if lay.is_last_stage else None, num_sampled)

    def _logits_to_rank0(self, logits: Optional[torch.Tensor], num_sampled: int) -> Optional[torch.Tensor]:
        """One step at a time: the last stage's TP leader sends the sampled rows' logits to
        rank 0, which returns them (an empty tensor when nothing was sampled)."""
        lay = self.layout
        if lay.pipeline_parallel_size > 1 and num_sampled:
            if lay.rank == lay.last_stage_leader:
                dist.send(logits.contiguous(), dst=0)
            elif lay.rank == 0:
                logits = torch.empty(num_sampled, self.spec.vocab_size, dtype=self.dtype, device=self.device)
                dist.recv(logits, src=lay.last_stage_leader)
        if lay.rank == 0 and not num_sampled:
            logits = torch.empty(0, self.spec.vocab_size, dtype=self.dtype, device=self.device)
        return logits

    def _replay_stage(self, header: StepHeader, payload: torch.Tensor, recv) -> torch.Tensor:
        """P > 1, a decode step on this stage's graph: `recv(buf)` fills the stage input with the
        previous stage's `[rows, 2, hidden]` (not on the first stage), then the replay. Returns
        the graph's output for the real rows (valid until the next replay): `[rows, 2, hidden]`,
        or the logits on the last stage."""
        inputs = unpack_step(header, payload, widen=False)
        if not self.layout.is_first_stage:
            recv(self.graphs.stage_input(header.num_seqs))
        return self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta, batch=header.graph_batch)
