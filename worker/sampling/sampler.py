"""`Sampler`: turns one step's logits into one token id per running request.

Owns: per-request logit processing (repetition / frequency / presence penalties,
no_repeat_ngram_size, min_tokens suppression), logprobs, greedy argmax and random sampling
(temperature, top_k, top_p, min_p), all batched over the rows that use each feature. Penalty
state lives in a `SamplingState` (device-resident, updated by one scatter per step); the
filters and the draw are in `sampling_ops` (no vocabulary sort); the random rows' parameters
and uniforms (`random_stream`'s Philox keyed by (seed, step), on the device where the draw runs
its kernels) are packed and uploaded by `random_params`. Token bans (min_tokens,
n-grams) are in `token_bans`, the logprob values and top-k ids in `logprob_pack`. `classify` says
which rows use which feature; a step of plain greedy rows needs only their argmax (a T > 1
runner gathers ids for it: `draw_greedy_ids`).

Order of operations (every row independently):
  1. penalties on the logits, 1b. logit_bias added, 2. min_tokens: eos/stop ids set to -inf
     (constrained rows take this ban and the n-gram ban through their mask, step 2b),
  2b. structured outputs: tokens the row's grammar does not allow next set to -inf
     (worker/structured/bitmask.py; the row's `grammar` is synced to its tokens first), less
     its bans, unless they would leave no token the grammar allows (the grammar wins),
  3. logprobs = log_softmax of these logits, i.e. the model's own distribution after
     penalties (and the grammar's mask: a constrained row reports the distribution it was
     drawn from) but BEFORE temperature / top-k / top-p / min-p (so a greedy request without
     penalties reports exactly HF's `log_softmax(logits)`),
  4. greedy rows (`temperature == 0` or `top_k == 1`): argmax, ties to the lowest id,
  5. random rows: temperature, top_k, top_p, min_p, then the inverse CDF (token-id order) at
     the row's uniform for step s = the number of tokens the request has generated:
       seeded rows: Philox(seed, s) -- the same token whatever else is in the batch, and after
       a failover (a resumed request has generated the delivered tokens already);
       rows with a `generator` but no seed: a key drawn from that generator each step;
       other rows: a key per row per step from the sampler's default generator.

Two halves (their inputs and outputs in draw_io.py): `draw` leaves every id and logprob on the
device (async scheduling copies them to pinned memory behind an event,
worker/engine/inflight.py); `finish` turns their host copies into a `SamplerOutput`; `__call__`
is both with one `.tolist()` between. A request's rows may be drawn again before `finish` ran
for the previous draw (`SamplingRequestState.num_pending`), except with no_repeat_ngram_size
(its map needs the ids on the host).
Small steps whose rows are all random on the candidate path, with no penalties, bans or
logprobs (or grammar, logit_bias), replay the device half from a CUDA graph (`draw_graphs`, given by the engine): the same
kernels, a few host operations instead of ~25 (at batch 1 the eager draw's host time set TPOT).
Random rows with top_k / top_p take a candidate path whose id is provisional where the row's
kept set did not fit its candidates; the flags ride in the same transfer as the ids, and
`finish` redoes those rows on the full path (same uniform: same result as a synchronous draw).
A redone id that changed is listed in `SamplerOutput.redrawn` (the engine rewinds a step that
used it as a pending input) and drops the request's penalty state (it folded the provisional
id; it is rebuilt from the token lists at the request's next draw, which the engine makes
with nothing pending).

Must never: mutate the caller's logits unless told they are scratch (`logits_writable`), read
engine state beyond the rows it is given, or sync to host inside `draw`.

To extend: add the field to `SamplingParams`, decide where it sits in the order above, and
batch it over only the rows that use it (skip it entirely when no row does).
"""

from __future__ import annotations

from typing import Hashable, Optional

import numpy as np
import torch

from infer_cluster.kernels.argmax import row_argmax
from infer_cluster.kernels.sample import MAX_CANDIDATES, float32_copy, use_sample_kernels

from infer_cluster.worker.sampling.draw_graphs import DrawGraphs
from infer_cluster.worker.sampling.draw_io import DeviceDraw, RowClasses, SamplerOutput, SamplingRequestState
from infer_cluster.worker.sampling.logprob_pack import logprob_pack, lse_and_block_maxima
from infer_cluster.worker.text.logprob_rows import DeferredLogprob, LogprobRows
from infer_cluster.worker.sampling.random_params import random_params, random_plan
from infer_cluster.worker.sampling.row_plans import FLAGS, LOGIT_BIAS, LOGPROBS, MIN_TOKENS, NEED, PENALTIES, PRESENCE, RANDOM
from infer_cluster.worker.sampling.row_plans import REPETITION, STRUCTURED, TOP_K
from infer_cluster.worker.sampling.row_plans import RowPlans, rows_with
from infer_cluster.worker.sampling.ops import any_top_p_alone, draw_random_rows, to_device
from infer_cluster.worker.sampling.state import SamplingState
from infer_cluster.worker.sampling.token_bans import apply_logit_bias, apply_min_tokens, ban_tokens
from infer_cluster.worker.structured.bitmask import GrammarMasks

class _Scratch:
    """Key of a row without a request id: its penalty state lives for one call only."""

    __slots__ = ()


class Sampler:
    """Batched sampler; holds the default generator and the penalty state of live requests."""

    def __init__(self, default_generator: Optional[torch.Generator] = None,
                 draw_graphs: Optional[DrawGraphs] = None):
        # None means torch's global RNG; unseeded rows are not reproducible anyway.
        self.default_generator = default_generator
        # Small all-random steps replay their draw from a CUDA graph (worker/sampling/draw_graphs.py);
        # the owner (the engine) keeps it across sampler resets and releases it.
        self.draw_graphs = draw_graphs
        self.state: Optional[SamplingState] = None
        self.plans = RowPlans()  # each live request's fixed sampler row (worker/sampling/row_plans.py)
        self.grammar_masks: Optional[GrammarMasks] = None  # made on the first constrained row

    def prefill_masks(self, states: list, num_rows: int, device) -> None:
        """Start filling the grammar masks of the next draw (`states`: (row, `GrammarState`))
        on a helper thread (worker/structured/bitmask.py, `GrammarMasks.prefill`)."""
        self._masks().prefill(states, num_rows, device)

    def _masks(self) -> GrammarMasks:
        """The grammar masks, made on the first constrained row (with the draw graphs' masked
        argmax graphs, where those are on)."""
        if self.grammar_masks is None:
            graphs = self.draw_graphs.mask_argmax if self.draw_graphs is not None else None
            self.grammar_masks = GrammarMasks(graphs=graphs)
        return self.grammar_masks

    def close(self) -> None:
        """Stop the mask filler's thread, if one was started."""
        if self.grammar_masks is not None:
            self.grammar_masks.close()

    def release(self, request_id: Hashable) -> None:
        """Forget a request's penalty state and plan row (the engine calls this when a request
        ends)."""
        self.plans.release(request_id)
        if self.state is not None:
            self.state.remove(request_id)  # host bookkeeping only: no tensor is touched

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRequestState],
                 logits_writable: bool = False, defer_logprobs: bool = False) -> SamplerOutput:
        """Token ids (and logprobs) for one step's rows. `defer_logprobs`: logprob entries come
        as `DeferredLogprob`s, built later by whoever needs them (worker/text/logprob_rows.py)."""
        draw = self.draw(logits, rows, logits_writable)
        values = draw.values.flatten().tolist() if draw.values is not None else None
        return self.finish(draw, draw.transfer.tolist(), values, defer_logprobs)  # the one sync (+ a rare redo)

    def classify(self, rows: list[SamplingRequestState], vocab_size: int) -> "RowClasses":
        """Which of `rows` use which feature this step. Each row's fixed part (feature flags,
        parameter columns, candidate count) comes from the plan table: one dict lookup per row,
        then numpy (worker/sampling/row_plans.py)."""
        scratch_slots: list = []
        try:
            table, seeds, seeded = self.plans.gather(self.plans.slots(rows, vocab_size, scratch_slots))
        finally:
            self.plans.free_scratch(scratch_slots)
        flags = table[:, FLAGS].astype(np.int64)
        present = int(np.bitwise_or.reduce(flags)) if len(flags) else 0  # a feature no row uses costs nothing

        def rows_of(bit: int) -> list:
            return rows_with(flags, bit) if present & bit else []
        grammar_rows = [i for i in rows_of(STRUCTURED) if rows[i].grammar is not None]
        min_tokens_rows = [i for i in rows_of(MIN_TOKENS)
                           if len(rows[i].output_token_ids) + rows[i].num_pending < rows[i].params.min_tokens
                           and rows[i].grammar is None]
        return RowClasses(table, seeds, seeded, rows_of(PENALTIES), rows_of(LOGPROBS), rows_of(RANDOM),
                          min_tokens_rows, grammar_rows, rows_of(LOGIT_BIAS))

    def draw_greedy_ids(self, token_ids: torch.Tensor, rows: list[SamplingRequestState]) -> "DeviceDraw":
        """The draw of a step whose rows are all plain greedy (`RowClasses.plain_greedy`) from
        its argmax ids, taken by the runner (a T > 1 shard gathers ids, not logits)."""
        if token_ids.shape != (len(rows),):
            raise ValueError(f"greedy ids must be [num_rows={len(rows)}], got {tuple(token_ids.shape)}")
        return DeviceDraw(token_ids, token_ids, None, len(rows))

    @torch.inference_mode()  # the runner's logits are inference tensors; edits need this mode
    def draw(self, logits: torch.Tensor, rows: list[SamplingRequestState],
             logits_writable: bool = False, classes: Optional["RowClasses"] = None) -> "DeviceDraw":
        """The device half of `__call__`: every id and logprob of the step, left on the device
        (no host sync). The caller copies `transfer` (and `values`) to the host and passes them
        to `finish`, which settles the rows the candidate path could not (`sampling_ops`).
        Rows with no_repeat_ngram_size need `finish` before the request's next draw.
        `classes`: `classify(rows, vocab)` of this step, where the caller took it already."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [num_rows={len(rows)}, vocab], got {tuple(logits.shape)}")
        if not rows:
            empty = torch.empty(0, dtype=torch.long, device=logits.device)
            return DeviceDraw(empty, empty, None, len(rows))
        if classes is None:
            classes = self.classify(rows, logits.shape[1])
        table, seeds, seeded = classes.table, classes.seeds, classes.seeded
        penalty_rows, logprob_rows = classes.penalty_rows, classes.logprob_rows
        random_rows, min_tokens_rows = classes.random_rows, classes.min_tokens_rows
        grammar_rows, bias_rows = classes.grammar_rows, classes.bias_rows

        if classes.plain_greedy:
            # Fast path: argmax is exact in any float dtype, so no float32 copy is needed.
            token_ids = _argmax(logits, logits)
            return DeviceDraw(token_ids, token_ids, None, len(rows))
        if (self.draw_graphs is not None and len(random_rows) == len(rows)
                and not (penalty_rows or logprob_rows or min_tokens_rows or bias_rows)):
            draw = self._graph_draw(logits, rows, classes)
            if draw is not None:
                return draw

        # A private float32 copy only when rows will be edited in place and the caller's
        # logits must stay as they are.
        needs_edit = bool(penalty_rows or min_tokens_rows or grammar_rows or bias_rows)
        # Greedy rows whose only edit is a grammar's mask: -inf written into the step's own
        # logits in their dtype, then argmax (exact in any dtype), without a float32 copy.
        mask_only = (logits_writable and grammar_rows and not (penalty_rows or min_tokens_rows
                     or bias_rows or random_rows or logprob_rows))
        if mask_only:
            x = logits
        elif needs_edit and not (logits_writable and logits.dtype == torch.float32):
            x = float32_copy(logits)  # a private float32 copy to edit
        elif needs_edit or (random_rows and not use_sample_kernels(logits)):
            x = logits.to(torch.float32)  # float32 logits the sampler may edit, or the torch draw's input
        else:  # greedy + logprobs: argmax, gather, top-k and row_stats are exact in any float dtype,
            x = logits  # and the draw kernels load any float dtype as float32 (no float32 copy)
        device, n = x.device, len(rows)
        scratch: list = []
        try:
            # Constrained rows take their bans (n-grams, min_tokens) through the grammar's
            # mask, which keeps at least one token the grammar allows (token_bans cannot know).
            grammar_bans = _grammar_bans(rows, grammar_rows) if grammar_rows else None
            entries, upload = (self._penalise(x, rows, penalty_rows, table, scratch, grammar_bans)
                               if penalty_rows else ([], None))
            if bias_rows:
                apply_logit_bias(x, rows, bias_rows)
            if min_tokens_rows:
                apply_min_tokens(x, rows, min_tokens_rows)
            if mask_only:  # greedy rows and a grammar's mask: one graph replay where it can
                token_ids, _ = self._masks().apply_argmax(x, rows, grammar_rows, grammar_bans)
                return DeviceDraw(token_ids, token_ids, None, n)
            if grammar_rows:  # a broken row (a token its grammar refused) is drawn as it is:
                self._masks().apply(x, rows, grammar_rows, grammar_bans)  # the engine ends it when it collects

            x_lp = lse = maxima = None
            if logprob_rows:
                # Taken here, before temperature and the filters: the model's distribution.
                x_lp = _rows_of(x, logprob_rows, n)
                lse, maxima = lse_and_block_maxima(x_lp)

            if not random_rows:
                # Greedy rows that all take logprobs get their ids from the logprob pack (on
                # the kernel path found from row_stats' block maxima: no pass of its own).
                token_ids = None if len(logprob_rows) == n else _argmax(x, logits)
            else:
                token_ids = torch.empty(n, dtype=torch.long, device=device)
                if len(random_rows) < n:  # the greedy rows: those the loop above did not list
                    is_random = set(random_rows)
                    greedy_rows = [i for i in range(n) if i not in is_random]
                    token_ids[_index(greedy_rows, device)] = _argmax(_rows_of(x, greedy_rows, n), logits)
            unresolved = None
            if random_rows:
                sub = slice(None) if len(random_rows) == n else random_rows
                params = random_params([rows[i] for i in random_rows], x,
                                       (table[sub], seeds[sub], seeded[sub]), self.default_generator)
                xr = _rows_of(x, random_rows, n)
                # A redo needs these logits after the next step's forward: the runner's own
                # buffer (float32 models, CUDA graphs) may be rewritten by then.
                drawn, unresolved = draw_random_rows(xr, params, private=xr is not logits)
                if len(random_rows) == n:
                    token_ids = drawn
                else:
                    token_ids[_index(random_rows, device)] = drawn
            values = alt_ids = lp_k = None
            if logprob_rows:
                lp_nums = [rows[i].params.logprobs for i in logprob_rows]
                lp_k = min(max(lp_nums), x.shape[1])
                chosen = (None if token_ids is None else token_ids if len(logprob_rows) == n
                          else token_ids[_index(logprob_rows, device)])
                values, alt_ids, chosen = logprob_pack(x_lp, lse, chosen, lp_k, maxima)
                if token_ids is None:
                    token_ids = chosen
            draw = DeviceDraw(token_ids, token_ids, None, n, unresolved=unresolved,
                              random_rows=random_rows)
            # Everything the host needs comes back in one transfer: ids, logprob ids, flags.
            transfer = [token_ids]
            if logprob_rows:
                draw.logprob_rows, draw.lp_nums, draw.lp_k, draw.values = logprob_rows, lp_nums, lp_k, values
                transfer.append(alt_ids.flatten())
                if unresolved is not None:
                    draw.lp_lse = lse
            if unresolved is not None:
                transfer.append(unresolved.flags.long())
            if len(transfer) > 1:
                draw.transfer = torch.cat(transfer)
            if entries:
                self.state.append(entries, _rows_of(token_ids, penalty_rows, n), upload=upload)
                draw.ngram = [(i, e) for i, e in zip(penalty_rows, entries) if e.ngram_size]
                if unresolved is not None:  # only a redo (`_redo`) looks them up
                    draw.penalty_keys = {i: rows[i].request_id for i in penalty_rows
                                         if rows[i].request_id is not None}
        finally:
            for key in scratch:
                self.state.remove(key)
        return draw

    def finish(self, draw: "DeviceDraw", host_transfer: list[int], host_values: Optional[list],
               defer_logprobs: bool = False) -> SamplerOutput:
        """The host half: `draw.transfer` and `draw.values` as host lists -> `SamplerOutput`."""
        n = draw.num_rows
        host_ids = host_transfer[:n]
        redrawn = self._redo(draw, host_ids, host_transfer, host_values) if draw.unresolved else []
        if draw.ngram:
            self.state.fold_ngrams([e for _, e in draw.ngram], [host_ids[i] for i, _ in draw.ngram])
        out_logprobs: list = [None] * n
        if draw.logprob_rows:
            lp = LogprobRows(host_values, host_transfer[n:n + len(draw.logprob_rows) * draw.lp_k],
                             draw.lp_k)
            for j, (i, num) in enumerate(zip(draw.logprob_rows, draw.lp_nums)):
                out_logprobs[i] = DeferredLogprob(lp, j, num) if defer_logprobs else lp.entry(j, num)
        return SamplerOutput(token_ids=host_ids, logprobs=out_logprobs, redrawn=redrawn)

    def _redo(self, draw: "DeviceDraw", host_ids: list[int], host_transfer: list[int],
              host_values: Optional[list]) -> list[int]:
        """Redo the rows the candidate path flagged (rare; a sync) and fix `host_ids` and the
        sampled logprobs in place. Returns the rows whose id changed; their penalty state,
        which folded the provisional id, is dropped (rebuilt from the token lists next time)."""
        u = draw.unresolved
        flags = host_transfer[len(host_transfer) - len(u.rows):]
        which = [j for j, f in enumerate(flags) if f]
        if not which:
            return []
        lp_pos = {i: j for j, i in enumerate(draw.logprob_rows)}
        changed = []
        for j, t in zip(which, u.redo(which).tolist()):
            i = draw.random_rows[u.rows[j]]
            if t == host_ids[i]:
                continue
            host_ids[i] = t
            changed.append(i)
            key = draw.penalty_keys.get(i)
            if key is not None:
                self.release(key)
            if i in lp_pos:  # the sampled token's logprob was taken for the provisional id
                jl = lp_pos[i]
                host_values[jl * (1 + draw.lp_k)] = float(u.x[u.rows[j], t].double() - draw.lp_lse[jl])
        return changed

    def _penalise(self, x: torch.Tensor, rows, which: list[int], table: np.ndarray, scratch: list,
                  deferred: Optional[dict] = None) -> tuple[list, Optional[torch.Tensor]]:
        """Penalties and no_repeat_ngram bans in place on x[which]; returns the state entries
        and the penalties' upload (for `SamplingState.append`). `table`: the step's plan rows.
        Rows in `deferred` get their n-gram bans added to it instead (grammar rows)."""
        vocab = x.shape[1]
        if self.state is None or self.state.vocab_size != vocab or self.state.device != x.device:
            self.state = SamplingState(vocab, x.device)
        entries = []
        for i in which:
            r = rows[i]
            key = r.request_id
            if key is None:
                key = _Scratch()
                scratch.append(key)
            entries.append(self.state.entry(key, r.prompt_token_ids, r.output_token_ids, r.params,
                                            r.num_pending))
        upload = self.state.apply_penalties(x, which, entries, table[which, REPETITION:PRESENCE + 1])
        ban_rows, ban_ids = [], []
        for i, e in zip(which, entries):
            if e.ngram_size and deferred is not None and i in deferred:
                deferred[i].update(e.banned())
            elif e.ngram_size:
                for t in e.banned():
                    if 0 <= t < vocab:
                        ban_rows.append(i)
                        ban_ids.append(t)
        if ban_rows:
            ban_tokens(x, ban_rows, ban_ids)
        return entries, upload

    def _graph_draw(self, logits: torch.Tensor, rows: list[SamplingRequestState],
                    classes: "RowClasses") -> Optional["DeviceDraw"]:
        """The draw of a step whose rows are all random, on the candidate path and free of
        edits other than a grammar's mask and of logprobs, replayed from a CUDA graph (worker/sampling/draw_graphs.py); None where the
        step does not qualify (nothing was drawn: the caller takes the eager path)."""
        graphs, n, vocab = self.draw_graphs, len(rows), logits.shape[1]  # `accepts` checks n
        table = classes.table
        need = table[:, NEED]
        if (not use_sample_kernels(logits) or logits.stride(1) != 1
                or not need.all() or need.max() > MAX_CANDIDATES):
            return None
        if not graphs.accepts(logits, int(need.max()), any_top_p_alone(table[:, TOP_K], need, vocab),
                              constrained=bool(classes.grammar_rows)):
            return None
        plan = random_plan(rows, logits, (table, classes.seeds, classes.seeded), self.default_generator)
        edit = None
        if classes.grammar_rows:  # the mask goes onto the graph's copy of the logits, then the draw
            which, bans = classes.grammar_rows, _grammar_bans(rows, classes.grammar_rows)
            edit = lambda x: self._masks().apply(x, rows, which, bans)  # noqa: E731
        drawn = graphs.draw(logits, plan, edit)
        if drawn is None:  # its graph could not be captured: the eager draw, same tokens
            return None
        transfer, unresolved = drawn
        return DeviceDraw(transfer[:n], transfer, None, n, unresolved=unresolved, random_rows=list(range(n)))


def _grammar_bans(rows: list[SamplingRequestState], grammar_rows: list[int]) -> dict:
    """Each constrained row's tokens to ban through its mask: eos and stop ids while below
    min_tokens (n-gram bans are added by `_penalise`)."""
    bans = {}
    for i in grammar_rows:
        r = rows[i]
        p = r.params
        below = p.min_tokens and len(r.output_token_ids) + r.num_pending < p.min_tokens
        bans[i] = set(r.eos_token_ids) | set(p.stop_token_ids) if below else set()
    return bans


def _argmax(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, torch's rule. Rows in the runner's logits dtype take `row_argmax`'s
    kernel (its variant is the one the decode graphs compiled; torch's reduction took 52 us at
    256 x 151,936 bf16 on an H200), a float32 copy torch's own."""
    return row_argmax(x) if x.dtype == logits.dtype else x.argmax(dim=-1)


def _rows_of(x: torch.Tensor, which: list[int], n: int) -> torch.Tensor:
    """x[which] without a copy when that is every row."""
    return x if len(which) == n else x[_index(which, x.device)]


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.long, device)
