"""`DistributedRunner`: the replica's model runner when `tensor_parallel_size x
pipeline_parallel_size > 1`. Same surface as `ModelRunner` (`num_kv_blocks`, `execute(out)`,
`device`, `dtype`) plus `close()`; `DynamicEngine` picks it when `config.world_size > 1`.

Owns: rank 0's whole view of the rank group: checking up front that the model divides over T
ranks, opening the rendezvous store (free port unless `INFER_CLUSTER_MASTER_PORT` is set),
starting ranks 1..N-1, building rank 0's own shard while watching the others (a rank that dies
during start-up fails the constructor at once instead of after a rendezvous timeout), and each
step: pack the `SchedulerOutput` into the step tensor (`step_codec`), pick graph replay or
eager for every rank (decode-only batches that fit the captured ladder replay), broadcast it
(`channel`), run its own share, return the logits the last stage sends back. `execute` only
queues the step: with async scheduling the engine
launches step n+1 while step n runs, its `pending_input` rows filled on the device from step
n's draw (`PendingIds`); `verify_step()` after the sampled ids reached the host is where a
failure during the step shows. Any failure (a
rank died or hung, a collective raised) is fatal for the replica: every rank is killed, this
step and every later one raise `RankFailedError` naming the rank and cause, and
`on_fatal(reason)` (if given) is called from the monitor thread so a server can exit and let
the coordinator re-route. With pipeline micro-batches (`pipeline_depth` = P > 1, read by the
engine) a step is `submit(out)` (pack, hand to stage 0's ranks and the next stage, run stage
0's share, post the logits' receive) and later `collect(ticket)`; `execute` is both at once.
With async scheduling too, the engine takes a group's logits with `collect_queued` (a stream
wait, no host wait), queues their draw, and submits the group's next step with its pending
rows filled from that draw; `settle(ticket)` after the ids reached the host checks the group.

With a symmetric-memory TP all-reduce (`tp_allreduce` other than `nccl`) a failed group may
leave rank 0's device unable to finish its queued work (worker/device/wait.py): waits on the
steps poll with `wait_gave_up`, and after a failure the device gets `FAILED_DRAIN_S` to finish.
If it does not, it is left as it is (graphs, process group and buffers kept until the process
exits), so the requests still end and `close()` still returns.

Must never run a step after a failure (ranks could be mid-collective), never block forever
(collectives time out after `INFER_CLUSTER_DIST_TIMEOUT_S`, ranks heartbeat), and never leave
a rank process behind (`close()`, also run at interpreter exit). To extend: per-step work for
every rank goes into `RankShard.run_step`; new process bookkeeping into `launcher.py`. A
submitted micro-batch is a `StepTicket` (tickets.py); the model's split over T ranks is checked
by `topology.check_divisible`.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.device.wait import StuckWatch, drained, keep_until_exit
from infer_cluster.worker.runner.device_setup import resolve_device, resolve_dtype
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.distributed.channel import PendingIds
from infer_cluster.worker.distributed.launcher import RankFailedError, RankMonitor, RankProcess, close_stdin, reap, spawn_rank
from infer_cluster.worker.distributed.shard import RankGroups, RankShard
from infer_cluster.worker.distributed.step_codec import Op, StepHeader, is_decode_only, pack_step_pending
from infer_cluster.worker.distributed.tickets import StepTicket, take
from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout, check_divisible

log = logging.getLogger(__name__)

# After a failure with a symmetric-memory all-reduce: how long rank 0's device gets to finish
# its queued work before it counts as stuck behind a kernel that waits for the dead rank.
FAILED_DRAIN_S = 2.0

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class DistributedRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, model_path: Path, hf_config,
                 max_model_len: int, options: Optional[DistributedOptions] = None,
                 on_fatal: Optional[Callable[[str], None]] = None, kv_companion=None):
        """`kv_companion`: a draft model's runner on rank 0's device (worker/engine/draft.py),
        whose KV per block rank 0 counts when it sizes its pool (the ranks then agree on the
        smallest count, which both pools get)."""
        self.options = options or DistributedOptions.from_env()
        self.layout = RankLayout(0, config.tensor_parallel_size, config.pipeline_parallel_size,
                                 spec.num_layers)
        check_divisible(spec, config.tensor_parallel_size)
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group; "
                               "one tensor/pipeline-parallel replica per process")
        self.on_fatal = on_fatal
        self._closed = False
        self._lock = threading.Lock()  # orders close() against a late-finishing start-up thread
        self._step_lock = threading.Lock()  # one broadcast at a time: steps, then STOP
        self._bootstrap: Optional[threading.Thread] = None
        self._bootstrap_done = False
        self.pipeline_depth = config.microbatch_depth  # micro-batches the engine keeps in flight
        self._block_mirror = BlockTableMirror()  # the step tables, built from what changed
        self._uncollected: list[StepTicket] = []  # submitted, not collected (STOP waits for them)
        self._shard: Optional[RankShard] = None
        # Rank 0's device after a failure (worker/device/wait.py); set up with the shard.
        self._watch = StuckWatch()
        self.wait_gave_up: Optional[Callable[[], bool]] = None  # the waits on steps block
        self._ranks: list[RankProcess] = []
        device = resolve_device(config, 0)
        dtype = resolve_dtype(config, hf_config, device)
        world = self.layout.world_size
        timeout = datetime.timedelta(seconds=self.options.join_timeout_s)
        self._store = dist.TCPStore(self.options.master_addr, self.options.master_port, world,
                                    is_master=True, wait_for_workers=False, timeout=timeout)
        bootstrap = dict(config=dataclasses.asdict(config.replace(dtype=_DTYPE_NAMES[dtype])),
                         spec=dataclasses.asdict(spec), model_path=str(model_path),
                         max_model_len=max_model_len, world_size=world, master_port=self._store.port,
                         log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()))
        atexit.register(self.close)
        try:
            rank_options = dataclasses.replace(self.options, rank_start=self.options.start_for(device.type))
            for r in range(1, world):  # one at a time, so close() ends those already started
                self._ranks.append(spawn_rank(r, bootstrap, rank_options))
            self._monitor = RankMonitor(self._ranks, self.options)
            self._monitor.on_failure(self._on_failure)
            self._monitor.start()
            self._shard = self._while_watching(
                lambda: RankShard(self.layout, config, spec, model_path, hf_config, max_model_len,
                                  self.options, self._store, kv_companion), "start-up")
        except BaseException:
            self.close()
            raise
        if self._shard.device.type == "cuda":  # the shard was built on a helper thread
            torch.cuda.set_device(self._shard.device)
        self.num_kv_blocks = self._shard.runner.num_kv_blocks
        self.device = self._shard.device
        monitor = self._monitor  # the check holds the monitor, not the runner
        may_get_stuck = self.device.type == "cuda" and self.tp_allreduce != "nccl"
        self._watch = StuckWatch(self.device, may_get_stuck, lambda: monitor.error is not None,
                                 FAILED_DRAIN_S)
        # For waits on rank 0's device: gives up once the group failed where a failure may leave
        # the device never finishing (a symmetric-memory all-reduce); None: the waits block.
        self.wait_gave_up = self._watch.gave_up
        self.dtype = self._shard.dtype
        self.vocab_size = spec.vocab_size
        # Every rank takes its shard's argmax and only (value, id) pairs are gathered when all
        # of a step's rows are plain greedy (`execute(greedy_ids=True)`; shard.py).
        self.takes_greedy_ids = self._shard.greedy_ids_ok
        self.greedy_id_steps = 0  # steps that returned ids, not logits
        log.info("tensor x pipeline parallel %d x %d ready: %d ranks (pids %s), %d KV blocks",
                 config.tensor_parallel_size, config.pipeline_parallel_size, world,
                 self.rank_pids, self.num_kv_blocks)

    # -- surface shared with ModelRunner ------------------------------------------------------

    @property
    def rank_pids(self) -> list[int]:
        """Process ids of ranks 1..N-1 (rank 0 is this process)."""
        return [r.pid for r in self._ranks]

    @property
    def graph_replays(self) -> int:
        """Steps rank 0 served from a decode CUDA graph so far (0 without graphs)."""
        graphs = self._shard.graphs if self._shard is not None else None
        return graphs.replays if graphs is not None else 0

    @property
    def tp_allreduce(self) -> str:
        """The TP all-reduce rank 0 set up: a symmetric-memory mode (`auto`, `one_shot`,
        `two_shot`) or `nccl` (the default, and where the ranks fell back to it)."""
        fast = self._shard.runner.ps.fast_all_reduce if self._shard is not None else None
        return fast.mode if fast is not None else "nccl"

    @property
    def error(self) -> Optional[str]:
        """Why the rank group failed, or None while it is healthy."""
        monitor = getattr(self, "_monitor", None)
        return monitor.error if monitor is not None else None

    @property
    def device_stuck(self) -> bool:
        """True once a failure left rank 0's device unable to finish (worker/device/wait.py):
        this process cannot free its device state and should exit (worker/serving/replica_main.py)."""
        return self._watch.stuck

    def _check_usable(self) -> None:
        if self._closed:
            raise RankFailedError("the tensor/pipeline-parallel runner is closed")
        if self.error is not None:
            if self._watch.settled():
                self._shard.release_graphs()  # lets a pending NCCL abort finish (see _on_failure)
            raise RankFailedError(f"tensor/pipeline-parallel replica is down: {self.error}")

    def submit(self, out: SchedulerOutput, prev_ids: Optional[torch.Tensor] = None,
               prev_rows: Sequence[int] = ()) -> "StepTicket":
        """Micro-batches: start a step on every stage and return without its logits.
        `prev_ids` / `prev_rows`: with async scheduling, the draw (on the device) of the step
        in flight whose group this step continues, and the row there of each `pending_input`
        row, as for `execute`."""
        self._check_usable()
        shard = self._shard
        header, payload, fill = pack_step_pending(out, shard.block_size, self._block_mirror)
        pending = PendingIds.pair(fill, prev_ids, prev_rows)
        try:
            with self._step_lock:
                header = self._graph_or_eager(header)
                logits, work = shard.submit_step(header, shard.send_step(header, payload, pending))
                ticket = StepTicket(logits, work, out.sampled_request_ids())
                self._uncollected.append(ticket)
        except Exception as exc:
            raise self._step_failure(exc) from None
        if self.error is not None:
            raise self._step_failure(RuntimeError("the rank group failed during the step"))
        return ticket

    def collect(self, ticket: "StepTicket") -> tuple[torch.Tensor, list[str]]:
        """The logits `[num_sampled, vocab]` and request ids of a submitted step (steps are
        collected in submit order). Raises `RankFailedError` if the group failed."""
        take(ticket)
        try:
            self._check_usable()
            try:
                if ticket.work is not None:
                    self._shard.relay.wait(ticket.work)
                if self.device.type == "cuda":  # see execute(): only logits of a healthy group
                    if not drained(self.device, gave_up=self.wait_gave_up):
                        raise RankFailedError("the rank group failed during the step")
            except Exception as exc:
                raise self._step_failure(exc) from None
            if self.error is not None:
                raise self._step_failure(RuntimeError("the rank group failed during the step"))
        finally:
            self._uncollected.remove(ticket)
        return ticket.logits, ticket.request_ids

    def collect_queued(self, ticket: "StepTicket") -> tuple[torch.Tensor, list[str]]:
        """`collect` without waiting on the host (async scheduling with micro-batches): the
        current stream waits for the logits' receive, so a draw queued next runs once they are
        in, while the host goes on to schedule the group's next step. The logits may be used
        only after `settle(ticket)`, called once the draw's ids reached the host: it raises
        `RankFailedError` if the group failed meanwhile (see `verify_step`)."""
        self._check_usable()
        take(ticket)
        try:
            if ticket.work is not None:
                ticket.work.wait()  # NCCL: a stream wait; gloo (CPU): the receive itself
        except Exception as exc:
            raise self._step_failure(exc) from None
        return ticket.logits, ticket.request_ids

    def settle(self, ticket: "StepTicket") -> None:
        """A step taken by `collect_queued` is done on the device: forget it, then
        `verify_step()`."""
        if ticket in self._uncollected:
            self._uncollected.remove(ticket)
        self.verify_step()

    def discard(self, ticket: "StepTicket") -> None:
        """Take a step's logits and drop them (the engine abandons it after a failure
        elsewhere); nothing to take if the group failed."""
        if not ticket.done:
            try:
                self.collect(ticket)
            except RankFailedError:
                pass
        elif ticket in self._uncollected:  # queued by collect_queued: let its receive land
            try:
                if self.error is None and ticket.work is not None:
                    self._shard.relay.wait(ticket.work)
            except Exception:
                log.debug("a discarded step's receive failed", exc_info=True)
            self._uncollected.remove(ticket)

    def execute(self, out: SchedulerOutput, prev_ids: Optional[torch.Tensor] = None,
                prev_rows: Sequence[int] = (), greedy_ids: bool = False) -> tuple[torch.Tensor, list[str]]:
        """Queue one step on every rank; returns rank 0's logits `[num_sampled, vocab]` and
        request ids. `prev_ids` / `prev_rows`: the previous step's draw (on the device) and the
        row there of each `pending_input` row, as for `ModelRunner.execute`. `greedy_ids` (the
        caller found every sampled row plain greedy; only where `takes_greedy_ids`): the argmax
        ids `[num_sampled]` (int64) instead of the logits. Nothing here waits for the device:
        call `verify_step()` once results derived from them are on the host. Raises
        `RankFailedError` if the group failed (now or before)."""
        self._check_usable()
        if self.pipeline_depth > 1:
            return self.collect(self.submit(out, prev_ids, prev_rows))
        shard = self._shard
        header, payload, fill = pack_step_pending(out, shard.block_size, self._block_mirror)
        if greedy_ids and self.takes_greedy_ids and header.num_sampled:
            header = dataclasses.replace(header, greedy_ids=1)
            self.greedy_id_steps += 1
        pending = PendingIds.pair(fill, prev_ids, prev_rows)
        try:
            with self._step_lock:
                header = self._graph_or_eager(header)
                logits = shard.run_step(header, shard.channel.send(header, payload, pending))
        except Exception as exc:
            raise self._step_failure(exc) from None
        if self.error is not None:
            raise self._step_failure(RuntimeError("the rank group failed during the step"))
        return logits, out.sampled_request_ids()

    def _graph_or_eager(self, header: StepHeader) -> StepHeader:
        """Rank 0 decides for every rank: a decode-only step that fits the captured ladder
        replays the graph of the smallest captured batch that holds it."""
        graphs = self._shard.graphs
        if graphs is not None and is_decode_only(header) and header.num_seqs <= graphs.max_batch:
            return dataclasses.replace(header, op=Op.GRAPH, graph_batch=graphs.batch_for(header.num_seqs))
        return header

    def verify_step(self) -> None:
        """Call after the device finished a step and its sampled ids are on the host: raises
        `RankFailedError` if the group failed meanwhile. NCCL returns before the data is there,
        and an aborted collective (a peer died) leaves garbage rather than an error, so only
        results of a step that ended while the group was still healthy may be used (the abort
        comes after the failure is recorded)."""
        if self.error is not None:
            raise self._step_failure(RuntimeError("the rank group failed during the step"))

    def close(self) -> None:
        """End every rank process (a STOP step, else EOF on its stdin; SIGKILL after a grace
        period) and leave the process group. Idempotent; also run at interpreter exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            own_group = self._bootstrap_done  # else the start-up thread leaves it when it ends
        atexit.unregister(self.close)
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            monitor.stop()
        stopped = own_group and self.error is None and self._send_stop()
        if not stopped:  # ranks that got no STOP exit at their stdin's EOF (a pending send fails)
            close_stdin(self._ranks)
        if own_group:
            if self.error is not None and not self._watch.settled():
                keep_until_exit(self._shard)  # freeing its device state would wait forever
                keep_until_exit(getattr(dist.distributed_c10d, "_world", None))  # every group
            else:
                if self._shard is not None:
                    self._shard.release_graphs()
                RankGroups.destroy()
        reap(self._ranks, self.options.shutdown_timeout_s)
        if self._bootstrap is not None and self._bootstrap.is_alive():
            # Its peers are dead now, so its collectives fail fast; a rendezvous wait can last
            # up to the collective timeout, after which it leaves the group itself.
            self._bootstrap.join(timeout=self.options.shutdown_timeout_s)
        self._store = None

    def _send_stop(self) -> bool:
        """Broadcast STOP (ranks release their graphs, leave the group, exit 0). Bounded: a
        rank that stopped responding must not hold close() up; reap() kills it."""
        if self._shard is None or not self._step_lock.acquire(timeout=self.options.shutdown_timeout_s):
            return False
        done = threading.Event()

        def send():
            try:
                for ticket in self._uncollected:  # micro-batches still in flight finish first
                    if ticket.work is not None:
                        self._shard.relay.wait(ticket.work)
                self._shard.send_stop()
                done.set()
            except Exception:
                log.debug("STOP broadcast failed", exc_info=True)
            finally:
                self._step_lock.release()

        threading.Thread(target=send, name="rank0-stop", daemon=True).start()
        return done.wait(timeout=2.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- failure handling ---------------------------------------------------------------------

    def _while_watching(self, build, what: str):
        """Run `build()` on a helper thread; if a rank fails first, raise at once (rank 0 may be
        stuck in a rendezvous with the dead rank until a timeout otherwise)."""
        result: dict = {}

        def target():
            try:
                result["value"] = build()
            except BaseException as exc:
                result["error"] = exc
            finally:
                with self._lock:
                    self._bootstrap_done = True
                    abandoned = self._closed
                if abandoned:  # the constructor gave up on this thread: leave no group behind
                    RankGroups.destroy()

        thread = self._bootstrap = threading.Thread(target=target, name=f"rank0-{what}", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.1)
            if self._monitor.failed.is_set() and thread.is_alive():
                raise RankFailedError(f"tensor/pipeline-parallel {what} failed: {self._monitor.error}")
        if "error" in result:
            err = result["error"]
            if self._monitor.failed.wait(timeout=1.0):  # the rank's death explains rank 0's error
                raise RankFailedError(f"tensor/pipeline-parallel {what} failed: "
                                      f"{self._monitor.error}") from err
            raise err
        return result["value"]

    def _step_failure(self, exc: Exception) -> RankFailedError:
        """Turn whatever rank 0's step raised into the replica's one recorded failure. A peer's
        death usually reaches rank 0 as a collective error a moment before the monitor sees the
        exit, so give the monitor a moment to name the rank."""
        if not self._monitor.failed.wait(timeout=1.0):
            self._monitor.fail(f"step failed on rank 0: {type(exc).__name__}: {exc}")
        log.debug("rank 0's view of the failure", exc_info=exc)
        try:  # the replaying thread lets go of the graphs so that the NCCL abort can finish
            if self._watch.settled():
                self._shard.release_graphs()
        except Exception:
            log.debug("releasing the decode graphs after the failure raised", exc_info=True)
        self._monitor.handled.wait(timeout=3.0)  # on_fatal has run before the step reports
        return RankFailedError(f"tensor/pipeline-parallel replica is down: {self._monitor.error}")

    def _on_failure(self, reason: str) -> None:
        """Monitor thread, once, after every other rank was killed. The NCCL abort unblocks
        rank 0's pending kernels at once but returns only when no captured graph holds the
        communicator (the step thread releases them), so it runs on its own thread and the
        server hears of the failure regardless."""
        aborter = threading.Thread(target=RankGroups.abort, name="rank0-abort", daemon=True)
        aborter.start()
        if self.on_fatal is not None:
            self.on_fatal(reason)
        aborter.join(timeout=2.0)
