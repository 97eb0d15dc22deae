"""The engine's steps in flight (async scheduling): `InFlightSteps`, the launched steps not yet
collected (one at most between `DynamicEngine.step()` calls, two for a moment inside one; two
between calls when the latest one's draw is deferred, `draw_deferred`), and
`LaunchedStep`, one step whose forward and draw are queued on the device and whose sampled ids
are on their way to the host.

`InFlightSteps.launch` runs the runner and the sampler's device half for a `SchedulerOutput`;
rows marked `pending_input` get their input id from the latest launch's draw, on the device.
`LaunchedStep` owns: the step's `SchedulerOutput`, the row of each sampled request, the `DeviceDraw` (its
`token_ids` feed the next step's `pending_input` rows), and the copy of the draw to the host:
into pinned memory with `non_blocking=True`, then a CUDA event recorded right after it.
`wait()` blocks on that event only (`device_wait.wait_event`: with the runner's
`wait_gave_up` check, a poll that gives up once a rank group failed, since a symmetric-memory
all-reduce whose peer died never ends), asks the runner whether the step's device work can be
trusted (`verify_step`: a tensor/pipeline-parallel group that failed during the step raises
there; a single-rank runner's is a no-op), then builds the `SamplerOutput` (the sampler redoes the
rare rows its candidate path flagged there: a sync, after the event anyway; the ids it changed
come back so the engine can rewind a later step that used them). On the CPU the copy is an
ordinary one and there is no event, but the same code runs.
Must never: change the scheduler or requests (the engine applies the results), or sync the
device anywhere but `wait()` / `abandon()`.
Pipeline micro-batches (worker/sched/microbatch.py): `InFlightSteps.submit` hands a step to a
runner with `submit` / `collect` (a pipeline-parallel `DistributedRunner`) and returns a
`SubmittedStep`; its logits are collected, drawn and copied to the host in `wait()`, when the
engine collects it. With async scheduling the engine first queues the oldest step's draw
(`SubmittedStep.queue_draw`: the stream waits for the logits, the host does not), then schedules
that group's next step, whose `pending_input` rows read those ids on the device.
To extend (more steps in flight): the engine's collect condition sets the depth; steps are
always collected oldest first.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from infer_cluster.protocol import SamplingParams

from infer_cluster.worker.device.streams import StreamRecorder
from infer_cluster.worker.device.to_host import to_host
from infer_cluster.worker.device.wait import wait_event
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import DeviceDraw, SamplerOutput, SamplingRequestState
from infer_cluster.worker.sched.output import SchedulerOutput

# The row of a request that ended after scheduling (its id is drawn and dropped).
_DROPPED_ROW = SamplingRequestState(SamplingParams(temperature=0), [], [], None, ())


class LaunchedStep:
    def __init__(self, out: SchedulerOutput, row_ids: list[str], draw: Optional[DeviceDraw],
                 verify: Optional[Callable[[], None]] = None,
                 gave_up: Optional[Callable[[], bool]] = None, logits: Optional[torch.Tensor] = None,
                 recorder: Optional[StreamRecorder] = None):
        """`draw` None: a deferred draw (`logits` kept until `complete`). `recorder`: records the
        step's events (its owner's; None: a recorder of the step's own)."""
        self.out = out
        self._recorder = recorder if recorder is not None else StreamRecorder()
        self._verify = verify  # the runner's check that the step's device work is trustworthy
        self._gave_up = gave_up  # the runner's `wait_gave_up`: its group failed, stop waiting
        self.row_ids = row_ids
        self.row_of = {rid: i for i, rid in enumerate(row_ids)}
        self.logits = logits
        self.draw: Optional[DeviceDraw] = None
        self._event: Optional[torch.cuda.Event] = None
        if draw is not None:
            self.complete(draw)
        elif logits is not None and logits.device.type == "cuda":  # `abandon` waits for the forward
            self._event = self._recorder.recorded(logits.device)

    def complete(self, draw: DeviceDraw) -> None:
        """Start the draw's copy to the host (the step's ids and logprob values)."""
        self.draw, self.logits = draw, None
        self._ids = to_host(draw.transfer)
        self._values = to_host(draw.values) if draw.values is not None else None
        self._event = None
        if draw.transfer.device.type == "cuda":
            self._event = self._recorder.recorded(draw.transfer.device)

    @property
    def token_ids(self) -> torch.Tensor:
        """The draw's ids on the device (the next step's pending inputs read them)."""
        return self.draw.token_ids

    def wait(self, sampler: Sampler) -> tuple[dict[str, int], dict[str, object], list[str]]:
        """Block until the ids are on the host; returns {request id: token id},
        {request id: logprob entry (deferred) or None} and the requests whose provisional id
        the sampler's redo changed (`SamplerOutput.redrawn`)."""
        if self.draw is None:
            raise RuntimeError("a step was collected before its deferred draw was queued")
        if self._event is not None:  # gives up early only once the group failed: verify raises
            wait_event(self._event, self._gave_up)
        if self._verify is not None:  # a rank group: did it stay healthy through the step?
            self._verify()
        values = self._values.flatten().tolist() if self._values is not None else None
        result: SamplerOutput = sampler.finish(self.draw, self._ids.tolist(), values,
                                               defer_logprobs=True)
        return (dict(zip(self.row_ids, result.token_ids)), dict(zip(self.row_ids, result.logprobs)),
                [self.row_ids[i] for i in result.redrawn])

    def abandon(self) -> None:
        """A failure: wait (ignoring device errors) until the device is done with the step, so
        its blocks can be freed. A failed rank group's device may never be done: then the wait
        ends at once (the runner takes no more steps, so nothing reuses the blocks)."""
        try:
            if self._event is not None:
                wait_event(self._event, self._gave_up)
        except Exception:  # the device fault is reported by the step that raised
            pass


class InFlightSteps:
    def __init__(self):
        self.steps: list[LaunchedStep] = []  # launched, not collected; oldest first
        self.last: Optional[LaunchedStep] = None  # the latest launch: pending inputs read it
        self.drain_next = False  # the last schedule needed preemption: settle first
        self.recorder = StreamRecorder()  # the launched steps' events

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def holds_verify(self) -> bool:
        """A speculative verify step is in flight (worker/spec_decode/verify.py): its rows get
        a variable number of tokens, so nothing may be scheduled after it until it is collected."""
        return any(getattr(step, "is_verify", False) for step in self.steps)

    def launch(self, out: SchedulerOutput, runner, sampler: Sampler, requests: dict,
               eos_token_ids, defer_draw: bool = False) -> LaunchedStep:
        """Queue the step's forward and draw on the device; nothing waits for them here.
        `requests`: the scheduler's live requests by id. `defer_draw`: queue the forward only;
        `draw_deferred` draws once the older steps were collected (rows whose draw needs their
        last id on the host, e.g. a grammar's mask, filled while this forward runs)."""
        pending = [s.request_id for s in out.requests if s.pending_input]
        prev_ids, prev_rows = None, ()
        if pending:
            prev_ids, prev_rows = self.last.token_ids, [self.last.row_of[r] for r in pending]
        if defer_draw:
            logits, row_ids = runner.execute(out, prev_ids, prev_rows)
            self.last = LaunchedStep(out, row_ids, None, runner.verify_step, runner.wait_gave_up, logits,
                                     self.recorder)
            self.steps.append(self.last)
            return self.last
        rows = classes = None
        greedy = False
        if runner.takes_greedy_ids:  # a T > 1 shard: ids alone when no row needs the logits
            rows = _rows(out.sampled_request_ids(), requests, eos_token_ids)
            if rows:
                classes = sampler.classify(rows, runner.vocab_size)
                greedy = classes.plain_greedy
        result, row_ids = runner.execute(out, prev_ids, prev_rows, greedy_ids=greedy)
        if rows is None:
            rows = _rows(row_ids, requests, eos_token_ids)
        if greedy:
            draw = sampler.draw_greedy_ids(result, rows)
        else:  # the runner's logits are this step's own tensor: the sampler may edit them in place
            draw = sampler.draw(result, rows, logits_writable=True, classes=classes)
        self.last = LaunchedStep(out, row_ids, draw, runner.verify_step, runner.wait_gave_up,
                                 recorder=self.recorder)
        self.steps.append(self.last)
        return self.last

    @property
    def awaiting_draw(self) -> bool:
        """The latest step was launched with `defer_draw` and its draw is not queued yet."""
        last = self.last
        return last is not None and last.draw is None and bool(self.steps) and self.steps[-1] is last

    def prefill_deferred(self, sampler: Sampler, requests: dict) -> None:
        """Start filling the grammar masks of the latest step's deferred draw on the sampler's
        helper thread (every older step collected), to overlap the next schedule."""
        step = self.last
        states = []
        for i, rid in enumerate(step.row_ids):
            req = requests.get(rid)
            if req is not None and req.grammar is not None and req.num_pending == 1:
                states.append((i, req.grammar, req.output_token_ids))
        if states:
            sampler.prefill_masks(states, len(step.row_ids), step.logits.device)

    def draw_deferred(self, sampler: Sampler, requests: dict, eos_token_ids,
                      later: Optional[SchedulerOutput] = None) -> None:
        """Queue the draw of the latest step, launched with `defer_draw` (every older step
        collected: each row's tokens are on the host); a request that ended meanwhile gets a
        dropped row. `later`: a step scheduled after this one and not launched yet (its rows'
        tokens come after this draw's)."""
        step = self.last
        rows = _rows(step.row_ids, requests, eos_token_ids,
                     later.sampled_request_ids() if later is not None else ())
        # The runner's logits are this step's own tensor: the sampler may edit them in place.
        step.complete(sampler.draw(step.logits, rows, logits_writable=True))

    def submit(self, out: SchedulerOutput, runner, requests: dict, eos_token_ids) -> "SubmittedStep":
        """A micro-batch: the runner starts it on every stage and returns at once; its logits
        are collected (and drawn) when the engine collects the step, or earlier by
        `queue_draw`. Rows marked `pending_input` continue the oldest step's group: their ids
        come from its queued draw, on the device."""
        pending = [s.request_id for s in out.requests if s.pending_input]
        if pending:
            prev = self.steps[0].launched
            if prev is None or any(r not in prev.row_of for r in pending):
                raise RuntimeError("pending rows of a micro-batch must continue the oldest step in "
                                   "flight, whose draw is queued")
            ticket = runner.submit(out, prev.token_ids, [prev.row_of[r] for r in pending])
        else:
            ticket = runner.submit(out)
        step = SubmittedStep(out, runner, ticket, requests, eos_token_ids)
        self.steps.append(step)
        return step

    def abandon(self) -> list[SchedulerOutput]:
        """After a failure: wait until the device is done with every launched step (ignoring
        its errors) and forget them; returns their outputs (their requests must end)."""
        outs = [s.out for s in self.steps]
        for launched in self.steps:
            launched.abandon()
        self.steps, self.last, self.drain_next = [], None, False
        return outs


class SubmittedStep:
    """A micro-batch whose stages run on the ranks; `wait` collects its logits and samples.
    With async scheduling the engine calls `queue_draw` first (the group's next step reads the
    ids), and `wait` then only waits for them."""

    def __init__(self, out: SchedulerOutput, runner, ticket, requests: dict, eos_token_ids):
        self.out = out
        self._runner, self._ticket = runner, ticket
        self._requests, self._eos = requests, eos_token_ids
        self.launched: Optional[LaunchedStep] = None  # the queued draw (`queue_draw`)

    def queue_draw(self, sampler: Sampler) -> LaunchedStep:
        """Queue the draw of this step's logits behind their receive on the device; nothing
        waits on the host. Rows are built now: call it before the group's next schedule."""
        if self.launched is None:
            runner, ticket = self._runner, self._ticket
            logits, row_ids = runner.collect_queued(ticket)
            # The check closes over the runner and ticket, not self: a cycle through the
            # launched step would keep its device tensors alive until a GC pass.
            self.launched = _draw(self.out, logits, row_ids, sampler, self._requests, self._eos,
                                  lambda: runner.settle(ticket), runner.wait_gave_up)
        return self.launched

    def wait(self, sampler: Sampler) -> tuple[dict[str, int], dict[str, object], list[str]]:
        """`LaunchedStep.wait` of the step once its logits arrived (rows built now: a request
        that ended meanwhile gets a dropped row)."""
        if self.launched is not None:
            self._ticket = None
            return self.launched.wait(sampler)
        logits, row_ids = self._runner.collect(self._ticket)
        self._ticket = None
        return _draw(self.out, logits, row_ids, sampler, self._requests, self._eos,
                     gave_up=self._runner.wait_gave_up).wait(sampler)

    def abandon(self) -> None:
        """A failure elsewhere: let the runner take this step's logits (if the group is still
        healthy), so that the next step's logits are not mistaken for them."""
        if self.launched is not None:
            self.launched.abandon()
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._runner.discard(ticket)


def _rows(row_ids: list[str], requests: dict, eos_token_ids, later=()) -> list[SamplingRequestState]:
    """The sampler's row of each id; `requests`: the scheduler's live requests by id; `later`:
    ids sampled by a step scheduled after this one (that token is not before this draw's)."""
    rows = []
    later = set(later) if later else ()
    for rid in row_ids:
        req = requests.get(rid)
        if req is None:  # ended after scheduling (an id that arrived meanwhile)
            rows.append(_DROPPED_ROW)
            continue
        # num_pending counts this step's own token (and a later one's); the others are drawn
        # on the device before it
        pending = req.num_pending - 1 - (rid in later)
        rows.append(SamplingRequestState(req.params, req.prompt_token_ids, req.output_token_ids,
                                         None, eos_token_ids, rid, pending, req.grammar))
    return rows


def _draw(out: SchedulerOutput, logits: torch.Tensor, row_ids: list[str], sampler: Sampler,
          requests: dict, eos_token_ids, verify: Optional[Callable[[], None]] = None,
          gave_up: Optional[Callable[[], bool]] = None) -> LaunchedStep:
    """Queue the draw of `logits` (one row per id in `row_ids`); `requests`: the scheduler's
    live requests by id."""
    rows = _rows(row_ids, requests, eos_token_ids)
    # The runner's logits are this step's own tensor: the sampler may edit them in place.
    return LaunchedStep(out, row_ids, sampler.draw(logits, rows, logits_writable=True), verify,
                        gave_up)
