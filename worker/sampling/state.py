"""`SamplingState`: per-request penalty state kept between steps, updated incrementally.

Owns, per request (keyed by request id):
  * on the device, a slot in two [slots, width] tensors: the distinct token ids the request has
    seen (prompt + output) and how often each occurs in its output, plus the distinct count.
    Filled once when the request is first sampled (from its prompt and any resumed output) and
    then grown by one batched scatter of the step's new tokens (`append`). Penalties are applied
    to only those columns of the logits (`apply_penalties`): no [rows, vocab] count tensor exists.
  * on the host, for no_repeat_ngram_size = n: a map (n-1 previous tokens) -> tokens that
    followed them, and the last n-1 tokens; banned tokens are one dict lookup per step.

Consistency: each entry records how many tokens it has folded in. The sampler folds the token
it samples right away; if a request's token lists ever disagree with that count (a token that
was not appended, tokens appended elsewhere), the entry is rebuilt from the lists, so the
penalties always equal the from-scratch definition.

Must never: hold logits, or keep an entry after `remove` (the engine calls it when a request
ends). Slots are reused; a reused slot is cleared first.
On CUDA both per-step updates are one Triton launch each (kernels/penalty_triton.py), with the
torch code below as their reference and the CPU's implementation.

To extend: a new per-token statistic is one more [slots, width] tensor updated in `append`
(and in the kernels).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Optional

import numpy as np
import torch

from infer_cluster.kernels.sample import append_tokens, use_sample_kernels
from infer_cluster.kernels.sample import apply_penalties as kernel_penalties
from infer_cluster.protocol.sampling_params import SamplingParams

from infer_cluster.worker.sampling.ops import to_device
from infer_cluster.worker.device.upload import dma_upload


def penalty_columns(params: list[SamplingParams]) -> np.ndarray:
    """float64 [len(params), 3]: each one's repetition, frequency and presence penalty (the
    columns `apply_penalties` takes; the sampler reads them from its plan table)."""
    return np.array([(p.repetition_penalty, p.frequency_penalty, p.presence_penalty) for p in params],
                    dtype=np.float64).reshape(len(params), 3)


def uses_counts(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


@dataclass
class _Entry:
    slot: Optional[int]          # row in the device tensors; None when only n-grams are used
    num_tokens: int              # prompt + output tokens folded in
    width: int                   # upper bound of the distinct tokens in the slot
    ngram_size: int
    ngrams: dict = field(default_factory=dict)   # tuple of n-1 tokens -> set of next tokens
    tail: list = field(default_factory=list)     # the last n-1 tokens

    def fold_ngram(self, token: int) -> None:
        n = self.ngram_size
        if n == 1:
            self.ngrams.setdefault((), set()).add(token)
            return
        if len(self.tail) == n - 1:
            self.ngrams.setdefault(tuple(self.tail), set()).add(token)
        self.tail.append(token)
        if len(self.tail) > n - 1:
            del self.tail[0]

    def banned(self) -> set:
        n = self.ngram_size
        if n == 1 or len(self.tail) == n - 1:
            return self.ngrams.get(tuple(self.tail) if n > 1 else (), set())
        return set()


class SamplingState:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._entries: dict[Hashable, _Entry] = {}
        self._free: list[int] = []
        self._num_slots = 0
        self._width = 0
        self.token_ids = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.output_counts = torch.zeros(0, 0, dtype=torch.float32, device=self.device)
        self.num_distinct = torch.zeros(0, dtype=torch.long, device=self.device)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    # -- lifecycle ------------------------------------------------------------------------------

    def entry(self, key: Hashable, prompt: list[int], output: list[int], params: SamplingParams,
              num_pending: int = 0) -> _Entry:
        """The request's entry, created (or rebuilt) from its token lists when missing or stale.
        `num_pending`: tokens already folded in on the device whose ids the lists lack yet."""
        e = self._entries.get(key)
        total = len(prompt) + len(output)
        if e is not None and e.num_tokens == total + num_pending:
            return e
        if num_pending:  # a rebuild from the lists would miss the pending tokens
            raise RuntimeError(f"penalty state of request {key!r} is out of step with its tokens "
                               f"while {num_pending} token(s) are pending")
        if e is not None:
            self.remove(key)
        return self._add(key, prompt, output, params)

    def remove(self, key: Hashable) -> None:
        e = self._entries.pop(key, None)
        if e is not None and e.slot is not None:
            self._free.append(e.slot)

    def _add(self, key, prompt: list[int], output: list[int], params: SamplingParams) -> _Entry:
        e = _Entry(slot=None, num_tokens=len(prompt) + len(output), width=0,
                   ngram_size=params.no_repeat_ngram_size)
        if uses_counts(params):
            seen = Counter(t for t in prompt if 0 <= t < self.vocab_size)
            out_counts = Counter(t for t in output if 0 <= t < self.vocab_size)
            for t in out_counts:
                seen.setdefault(t, 0)
            ids = list(seen)
            e.width = len(ids)
            e.slot = self._take_slot(max(1, e.width))
            self.output_counts[e.slot].zero_()
            if ids:
                self.token_ids[e.slot, :len(ids)] = to_device(ids, torch.long, self.device)
                self.output_counts[e.slot, :len(ids)] = to_device(
                    [float(out_counts.get(t, 0)) for t in ids], torch.float32, self.device)
            # fill_, not `[slot] = int`: that copies a host scalar with a blocking copy on CUDA
            self.num_distinct[e.slot:e.slot + 1].fill_(len(ids))
        if e.ngram_size:
            for t in prompt:
                e.fold_ngram(t)
            for t in output:
                e.fold_ngram(t)
        self._entries[key] = e
        return e

    def _take_slot(self, width: int) -> int:
        self._ensure_width(width)
        if not self._free:
            self._grow_slots(max(8, 2 * self._num_slots))
        return self._free.pop()

    def _grow_slots(self, num: int) -> None:
        old = self._num_slots
        self.token_ids = _grow(self.token_ids, (num, self._width))
        self.output_counts = _grow(self.output_counts, (num, self._width))
        self.num_distinct = _grow(self.num_distinct, (num,))
        self._free.extend(range(num - 1, old - 1, -1))
        self._num_slots = num

    def _ensure_width(self, width: int) -> None:
        if width <= self._width:
            return
        new = max(64, 2 * self._width)
        while new < width:
            new *= 2
        self._width = new
        self.token_ids = _grow(self.token_ids, (self._num_slots, new))
        self.output_counts = _grow(self.output_counts, (self._num_slots, new))

    # -- per step -------------------------------------------------------------------------------

    def apply_penalties(self, x: torch.Tensor, rows: list[int], entries: list[_Entry],
                        penalties: np.ndarray) -> Optional[torch.Tensor]:
        """In place on float32 logits `x`: rows[j] gets entries[j]'s repetition (prompt + output),
        frequency and presence (output only) penalties, `penalties[j]` (float64 [len(rows), 3]:
        `penalty_columns`). Touches only seen columns. Returns the step's upload (float64
        [5, m]: slot, row, the three penalties of the m entries with a slot), whose slot row
        `append` reads instead of uploading the slots again; None when no entry has a slot."""
        use = [j for j, e in enumerate(entries) if e.slot is not None]
        if not use:
            return None
        dev = x.device
        every = len(use) == len(entries)
        # One copy to the device: slots, rows and the three penalties as float64 columns (exact
        # for any slot or row index), instead of three copies of which one is a nested list.
        packed = np.empty((5, len(use)), dtype=np.float64)
        packed[0] = [e.slot for e in entries] if every else [entries[j].slot for j in use]
        packed[1] = rows if every else [rows[j] for j in use]
        packed[2:] = (penalties if every else penalties[use]).T
        packed = dma_upload(packed, dev)
        if use_sample_kernels(x) and x.stride(1) == 1:  # one launch (kernels/penalty_triton.py)
            kernel_penalties(x, self.token_ids, self.output_counts, self.num_distinct, packed)
            return packed
        width = max(entries[j].width for j in use)
        slots, row_idx = packed[:2].long()
        row_idx = row_idx.unsqueeze(1)
        per_row = packed[2:].float().unsqueeze(2)
        rep, freq, pres = per_row[0], per_row[1], per_row[2]
        ids = self.token_ids[slots, :width]
        counts = self.output_counts[slots, :width]
        num = self.num_distinct[slots].unsqueeze(1)
        valid = torch.arange(width, device=dev) < num
        # Padding repeats column 0 with its own count, so the duplicate writes below agree.
        ids = torch.where(valid, ids, ids[:, :1])
        counts = torch.where(valid, counts, counts[:, :1])
        y = x[row_idx, ids]
        z = torch.where(y > 0, y / rep, y * rep)
        z = z - freq * counts - pres * (counts > 0).to(torch.float32)
        x[row_idx, ids] = torch.where(num > 0, z, y)
        return packed

    def fold_ngrams(self, entries: list[_Entry], host_tokens: list[int]) -> None:
        """The host half of `append` for n-gram entries: fold the new ids into their maps."""
        for e, t in zip(entries, host_tokens):
            e.fold_ngram(t)

    def append(self, entries: list[_Entry], tokens: torch.Tensor,
               host_tokens: Optional[list[int]] = None, upload: Optional[torch.Tensor] = None) -> None:
        """Fold one new token per entry (device `tokens`). The n-gram maps need the ids on
        the host: `host_tokens` here, or `fold_ngrams` later (before the next `entry`).
        `upload`: what `apply_penalties` returned for these entries this step (its slot row is
        read on the device; without it the slots are uploaded here)."""
        counted = [j for j, e in enumerate(entries) if e.slot is not None]
        for e in entries:
            e.num_tokens += 1
        if host_tokens is not None:
            self.fold_ngrams([e for e in entries if e.ngram_size],
                             [t for e, t in zip(entries, host_tokens) if e.ngram_size])
        if not counted:
            return
        width = 0
        for j in counted:
            e = entries[j]
            e.width += 1  # an upper bound: the token may already be there
            width = max(width, e.width)
        self._ensure_width(width)
        dev = self.device
        # The slots as float64 (exact), the upload's first row where the caller has it.
        slots = upload[0] if upload is not None else to_device(
            [float(entries[j].slot) for j in counted], torch.float64, dev)
        # every entry counted (the usual batch): the tokens as they are, no index tensor
        new = (tokens if len(counted) == len(entries)
               else tokens[to_device(counted, torch.long, tokens.device)]).to(dev)
        if use_sample_kernels(new):  # one launch (kernels/penalty_triton.py)
            append_tokens(self.token_ids, self.output_counts, self.num_distinct, slots, new.contiguous())
            return
        slots = slots.long()
        num = self.num_distinct[slots]
        hit = (self.token_ids[slots, :width] == new.unsqueeze(1)) & \
            (torch.arange(width, device=dev) < num.unsqueeze(1))
        found = hit.any(dim=1)
        pos = torch.where(found, hit.to(torch.int32).argmax(dim=1), num)
        self.token_ids[slots, pos] = new
        self.output_counts[slots, pos] += 1.0
        self.num_distinct[slots] = num + (~found).to(torch.long)


def _grow(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    if t.numel():
        out[tuple(slice(0, s) for s in t.shape)] = t
    return out
