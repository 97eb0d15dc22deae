"""`GrammarMasks`: the sampler's grammar step, in place on one step's logits.

Owns: the packed token bitmask of a step's constrained rows, filled on the host, and applying it
to those rows of the logits only (kernels/bitmask.py: one Triton launch with little host work
on CUDA, its plain-torch reference elsewhere); `apply_argmax` for greedy rows, whose uploads,
mask and argmax replay from one CUDA graph at small batches (worker/structured/mask_graphs.py).
The bitmask covers the tokenizer's ids (worker/structured/compiler.py); logits wider than that
(a padded LM head) get their extra columns set to -inf, narrower ones use the mask's prefix.

Speed (issue 42: all rows constrained >= 0.90 of none): filling one row of a JSON grammar over a
large vocabulary costs 0.1-0.2 ms of host time (xgrammar checks every token whose acceptance
depends on the stack, e.g. each token holding a quote inside a string), so 256 rows filled one by
one took longer than the step's forward. The rows are filled by one `BatchGrammarMatcher` call
on a few threads, into one pinned host buffer kept across steps (no allocation or pinning per
step); the mask and the rows' indices go up with non-blocking copies into device buffers kept
too. Nothing here may wait for the device: the draw is queued while the forward still runs, and
a copy from pageable memory (xgrammar's own upload of a list of indices) would block the host
until the forward ended. The engine fills while the step's forward runs on the device
(worker/engine/engine.py, deferred draws): `prefill` first advances the rows' matchers by the
tokens the step before gave them, then fills, both on a helper thread in xgrammar calls that
release the GIL, while the engine schedules the next step. On the H200 host the matchers'
advance had cost the main thread ~10 us a row (547aa05).
While a fill runs beside the main thread, the interpreter's thread switch interval is 0.2 ms
instead of 5 ms (`FILL_SWITCH_INTERVAL_S`, restored at `join`): between its xgrammar calls the
helper needs the GIL back, and the main thread, scheduling in Python, kept it for up to the full
interval, so the fill ran mostly after the main thread had started waiting for it. H200,
2026-11-29, the whole process at 0.2 ms against 5 ms in one call: workload A
(`bench/structured.py`) all rows constrained 0.836 -> 0.882 of none, half 0.903 -> 0.944; the
draw's wait for 256 rows' fill 4.1-4.3 -> 2.5-2.8 ms a step (timers around the draw). As built here
(b79a985), two calls on two hosts gave all 0.940 and 0.835, half 0.944 and 0.918: the hosts
differ more than the change. It only applies from `BATCH_FILL_MIN_ROWS` up: at batch 1 the
fill is the main thread's own.
The host buffer is reused at the next step once the device has read it: an event recorded after
the copy is waited on before the next fill (at depth 1 it has long passed: the engine waited for
this step's ids, copied after the mask).

Bans the sampler would put on a constrained row (no_repeat_ngram_size, min_tokens) are cleared
from its mask instead, and only where they leave a token the grammar allows: a ban that would
empty the row is dropped (the grammar wins; an all -inf row would pick token 0).
Must never: touch rows without a grammar, or run for a row with tokens pending on the device
(its matcher would be a token behind: the engine draws such a step after those tokens landed).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import numpy as np
import torch

from infer_cluster.kernels.bitmask import apply_token_bitmask
from infer_cluster.worker.structured.mask_graphs import MaskArgmaxGraphs
from infer_cluster.worker.structured.state import accept_all

# Threads for one step's fill: enough to cover a 256-row step behind its forward, few enough
# to leave the replica's other host work (scheduling, detokenizing) its cores.
FILL_THREADS = max(1, min(8, (os.cpu_count() or 2) - 1))
# The interpreter's thread switch interval while a fill runs beside the main thread (see above).
FILL_SWITCH_INTERVAL_S = 0.0002
# Fewer rows are filled one by one on the calling thread: a batched fill costs about 0.6 ms of
# start-up on the H200 host even for one row (cProfile, 2026-11-28), four times a row's fill.
BATCH_FILL_MIN_ROWS = 8


class GrammarMasks:
    """One sampler's bitmask buffers and batched filler (made on the first constrained row)."""

    def __init__(self, threads: int = FILL_THREADS, graphs: Optional[MaskArgmaxGraphs] = None):
        import xgrammar as xgr
        self.graphs = graphs  # `apply_argmax`'s CUDA graphs; None: eager draws
        self._batch = xgr.BatchGrammarMatcher(max_threads=threads)
        self._host: Optional[torch.Tensor] = None  # [rows, words] int32, pinned on CUDA
        self._device: Optional[torch.Tensor] = None
        self._idx_host: Optional[torch.Tensor] = None  # [rows] int32: the rows to mask
        self._idx_device: Optional[torch.Tensor] = None
        self._copied: Optional[torch.cuda.Event] = None  # recorded after each upload out of `_host`
        self._stream = None  # the device's current stream, looked up once (the lookup is slow)
        self._pending_copy = False  # `_copied` recorded and not waited on yet
        self._filler: Optional[ThreadPoolExecutor] = None  # `prefill`'s one thread
        # a fill started ahead of the draw: (future, n, [(row, state, num_accepted)])
        self._prefill: Optional[tuple] = None
        self._switch_interval: Optional[float] = None  # the interpreter's, while a fill runs

    def _buffers(self, n: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `n` rows of the host buffer and of its device twin. Rows not filled keep
        stale bits: only the indexed rows are applied."""
        words = (vocab + 31) // 32
        if self._pending_copy:  # the device may still be reading the last step's mask
            self._copied.synchronize()
            self._pending_copy = False
        host = self._host
        if host is None or host.shape[0] < n or host.shape[1] != words:
            rows = max(n, host.shape[0] if host is not None and host.shape[1] == words else 0)
            pin = device.type == "cuda"
            host = torch.empty(rows, words, dtype=torch.int32, pin_memory=pin)
            self._host, self._device = host, None
            self._idx_host = torch.empty(rows, dtype=torch.int32, pin_memory=pin)
        if device.type == "cuda" and (self._device is None or self._device.device != device):
            self._device = torch.empty(host.shape, dtype=torch.int32, device=device)
            self._idx_device = torch.empty(host.shape[0], dtype=torch.int32, device=device)
            self._stream = torch.cuda.current_stream(device)
            self._copied = torch.cuda.Event()
        view = host[:n]
        return view, (self._device[:n] if device.type == "cuda" else view)

    def prefill(self, states: list[tuple[int, object, list[int]]], n: int, device: torch.device) -> None:
        """Start, on a helper thread, advancing the states of the next `apply`'s rows by their
        new tokens and filling their mask rows (`n` rows; `states`: (row, its `GrammarState`,
        its output tokens)), so the caller can schedule the next step meanwhile: xgrammar's
        batched accept and fill release the GIL. Only the tokens there now count (a list that
        grows later is read up to its present length). The caller must not touch those states
        until `apply` (or `join`) has waited for it."""
        self.join()
        if len(states) < BATCH_FILL_MIN_ROWS or len({id(g) for _, g, _ in states}) < len(states):
            return  # a few rows fill faster than a thread starts; shared states fill in rounds (`_fill`)
        host, _ = self._buffers(n, states[0][1].vocab_size, device)
        if self._filler is None:
            self._filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-fill")
        items = [(g, tokens, len(tokens)) for _, g, tokens in states]
        rows = [i for i, _, _ in states]
        self._switch_interval = sys.getswitchinterval()  # restored by `join`
        sys.setswitchinterval(min(self._switch_interval, FILL_SWITCH_INTERVAL_S))
        try:
            future = self._filler.submit(self._advance_and_fill, items, rows, host)
        except BaseException:
            sys.setswitchinterval(self._switch_interval)
            raise
        self._prefill = (future, n, rows, [(g, size) for g, _, size in items])

    def _advance_and_fill(self, items: list, rows: list[int], host: torch.Tensor) -> list[int]:
        """The helper's job: sync the states, fill the rows of those not broken; returns them."""
        accept_all(items)
        live = [(i, g) for i, (g, _, _) in zip(rows, items) if not g.broken]
        if live:
            self._batch.batch_fill_next_token_bitmask([g.matcher for _, g in live], host,
                                                      [i for i, _ in live])
        return [i for i, _ in live]

    def join(self) -> Optional[tuple]:
        """Wait for a started `prefill` and hand it over (None if none was started)."""
        pre, self._prefill = self._prefill, None
        if pre is not None:
            try:
                pre[0].result()
            finally:
                sys.setswitchinterval(self._switch_interval)
        return pre

    def close(self) -> None:
        self.join()
        if self._filler is not None:
            self._filler.shutdown(wait=True)
            self._filler = None

    def apply(self, x: torch.Tensor, rows: Sequence, which: list[int],
              bans: Optional[dict] = None) -> list[int]:
        """x[which] restricted to each row's allowed tokens (`rows[i].grammar`), less the tokens
        of `bans[i]` (the sampler's n-gram and min_tokens bans) unless that would leave none.
        Returns the rows whose state is broken (their logits are left as they are). Rows a
        `prefill` filled from the same states are not filled again."""
        use, broken, vocab = self._fill(x, rows, which)
        if use:
            self._mask(x, *self._stage(x, vocab, use, bans), len(use), vocab)
        return broken

    def apply_argmax(self, x: torch.Tensor, rows: Sequence, which: list[int],
                     bans: Optional[dict] = None) -> tuple[torch.Tensor, list[int]]:
        """`apply`, then each row's argmax: (ids `[rows]`, the broken rows). On CUDA with graphs
        (`graphs`), the uploads, the mask and the argmax replay from one CUDA graph
        (worker/structured/mask_graphs.py) once the logits' buffer was seen before."""
        use, broken, vocab = self._fill(x, rows, which)
        if not use:
            return x.argmax(dim=-1), broken
        host, dev = self._stage(x, vocab, use, bans)
        k = len(use)
        if self.graphs is not None and dev is not host:
            ids = self.graphs.argmax(x, host, dev, self._idx_host[:k], self._idx_device, vocab)
            if ids is not None:
                self._copied.record(self._stream)
                self._pending_copy = True
                return ids, broken
        self._mask(x, host, dev, k, vocab)
        return x.argmax(dim=-1), broken

    def _fill(self, x: torch.Tensor, rows: Sequence, which: list[int]) -> tuple[list, list, Optional[int]]:
        """Sync the states of rows `which` and fill their host mask rows, unless a `prefill`
        did from the same states and tokens: (rows to mask, broken rows, the grammar's vocab)."""
        pre = self.join()  # before any state is touched: the helper may still be filling
        n = x.shape[0]
        if pre is not None and pre[1] == n and pre[2] == which and pre[3] == [
                (rows[i].grammar, len(rows[i].output_token_ids)) for i in which]:
            # filled ahead from these very states and tokens: only the broken are left out
            use = pre[0].result()
            broken = [i for i in which if rows[i].grammar.broken]
            return use, broken, rows[use[0]].grammar.vocab_size if use else None
        use, broken, vocab, host = [], [], None, None
        # Rows that share a state (a verify step's positions of one request, each row's tokens
        # one proposal longer than the row before: worker/spec_decode/verify.py `expand_rows`)
        # are filled in rounds: round j syncs and fills each state's j-th row, so a state walks
        # through its proposals and stays after the last (the next sync rolls it back to the
        # tokens kept). Rows of states of their own all fall in round 0.
        rounds = _rounds(rows, which)
        for members in rounds:
            matchers, filled = [], []
            for i in members:
                r = rows[i]
                if not _synced(r):
                    broken.append(i)
                    continue
                matchers.append(r.grammar.matcher)
                filled.append(i)
                vocab = r.grammar.vocab_size
            if not filled:
                continue
            if host is None:
                host, _ = self._buffers(n, vocab, x.device)
            if len(matchers) >= BATCH_FILL_MIN_ROWS:
                self._batch.batch_fill_next_token_bitmask(matchers, host, filled)
            else:
                for matcher, i in zip(matchers, filled):
                    matcher.fill_next_token_bitmask(host, i)
            use.extend(filled)
        if len(rounds) > 1:  # rows in `which`'s order again
            use.sort()
            broken.sort()
        return use, broken, vocab

    def _stage(self, x: torch.Tensor, vocab: int, use: list[int],
               bans: Optional[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled host rows `use` less their bans, the rows' indices written to the host
        index buffer: (host mask rows, their device twin)."""
        host, dev = self._buffers(x.shape[0], vocab, x.device)
        if bans:
            for i in use:
                if bans.get(i):
                    _clear_bans(host[i], bans[i], vocab)
        self._idx_host[:len(use)].numpy()[:] = use
        return host, dev

    def _mask(self, x: torch.Tensor, host: torch.Tensor, dev: torch.Tensor, k: int, vocab: int) -> None:
        """The eager way: send the mask and its `k` row indices up (non-blocking, from pinned
        memory; nothing to send on the CPU) and mask those rows of x, the padded head's
        columns banned too."""
        idx = self._idx_host[:k]
        if dev is not host:
            dev.copy_(host, non_blocking=True)
            idx = self._idx_device[:k].copy_(idx, non_blocking=True)
            self._copied.record(self._stream)
            self._pending_copy = True
        apply_token_bitmask(x, dev, idx, vocab)


def _rounds(rows: Sequence, which: list[int]) -> list[list[int]]:
    """`which` in rounds: round j holds each state's j-th row (in `which`'s order)."""
    seen: dict[int, int] = {}
    rounds: list[list[int]] = []
    for i in which:
        key = id(rows[i].grammar)
        j = seen.get(key, 0)
        seen[key] = j + 1
        if j == len(rounds):
            rounds.append([])
        rounds[j].append(i)
    return rounds


def _synced(row) -> bool:
    """Sync a constrained row's state with its tokens, all on the host; False where the grammar
    refuses one (the row is broken)."""
    if row.num_pending:
        raise RuntimeError("a constrained row was drawn with tokens pending on the device; "
                           "its grammar needs them on the host first")
    return row.grammar.sync(row.output_token_ids)


def _clear_bans(row: torch.Tensor, banned, vocab: int) -> None:
    """Clear the bits of `banned` in one packed bitmask row (int32 words, bit t % 32 of word
    t // 32), unless no allowed token would be left."""
    words = row.numpy().view(np.uint32)
    hits = [t for t in banned if 0 <= t < vocab and words[t >> 5] >> np.uint32(t & 31) & np.uint32(1)]
    if not hits:
        return
    if len(hits) >= int(np.unpackbits(words.view(np.uint8)).sum()):
        return  # every allowed token is banned: the grammar wins
    for t in hits:
        words[t >> 5] &= ~np.uint32(1 << (t & 31))
