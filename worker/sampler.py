"""`Sampler`: turns one step's logits into one token id per running request.

Owns: per-request logit processing (repetition / frequency / presence penalties,
no_repeat_ngram_size, min_tokens suppression), logprobs, greedy argmax and random sampling
(temperature, top_k, top_p, min_p) with each request's own `torch.Generator`.

Order of operations (every row independently, batched where it is cheap):
  1. penalties on the logits, 2. min_tokens: eos/stop ids set to -inf,
  3. logprobs = log_softmax of these logits, i.e. the model's own distribution after
     penalties but BEFORE temperature / top-k / top-p / min-p (so a greedy request without
     penalties reports exactly HF's `log_softmax(logits)`),
  4. greedy rows (`temperature == 0` or `top_k == 1`): argmax, ties to the lowest id,
  5. random rows: / temperature, top_k, top_p, min_p, then an exponential race
     `argmax(probs / q)` with `q ~ Exp(1)` drawn from the row's generator.

Must never: mutate the caller's logits, read scheduler/engine state beyond the row it is
given, draw a seeded row's randomness from anything but its own generator (a seeded request
must reproduce exactly whatever else is in the batch), or sync to host more than needed
(an all-greedy batch without penalties/logprobs is one argmax and one `.tolist()`).

To extend: add the field to `SamplingParams`, decide where it sits in the order above, and
add a small function here that takes the float32 logits of only the rows that use it (skip
it entirely when no row does, so the fast path stays one argmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from infer_cluster.protocol.sampling_params import SamplingParams

_NEG_INF = float("-inf")


@dataclass
class SamplingRequestState:
    """One row of the batch, as the engine sees that request before this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far, before this step
    generator: Optional[torch.Generator]  # seeded by the engine from params.seed; None: shared
    eos_token_ids: list[int]  # suppressed with params.stop_token_ids while below min_tokens


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    # Per row: None when params.logprobs is None, else
    # [sampled_logprob, {alt_token_id: logprob}] with the top-`params.logprobs` alternatives.
    logprobs: list[Optional[list]]


class Sampler:
    """Batched sampler; holds nothing but the generator shared by unseeded rows."""

    def __init__(self, default_generator: Optional[torch.Generator] = None):
        # None means torch's global RNG; unseeded rows are not reproducible anyway.
        self.default_generator = default_generator

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRequestState]) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [num_rows={len(rows)}, vocab], got {tuple(logits.shape)}")
        if not rows:
            return SamplerOutput(token_ids=[], logprobs=[])

        penalty_rows = [i for i, r in enumerate(rows) if r.params.has_penalties]
        min_tokens_rows = [i for i, r in enumerate(rows)
                           if len(r.output_token_ids) < r.params.min_tokens
                           and (r.eos_token_ids or r.params.stop_token_ids)]
        logprob_rows = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]

        if not (penalty_rows or min_tokens_rows or logprob_rows or random_rows):
            # Fast path: argmax is exact in any float dtype, so no float32 copy is needed.
            return SamplerOutput(token_ids=logits.argmax(dim=-1).tolist(), logprobs=[None] * len(rows))

        # A private float32 copy only when rows will be edited in place.
        needs_edit = bool(penalty_rows or min_tokens_rows)
        x = logits.to(torch.float32, copy=needs_edit)
        if penalty_rows:
            apply_penalties(x, rows, penalty_rows)
        if min_tokens_rows:
            apply_min_tokens(x, rows, min_tokens_rows)

        device = x.device
        logprobs_t = None
        if logprob_rows:
            # Taken here, before temperature and the filters: the model's distribution.
            logprobs_t = torch.log_softmax(x[_index(logprob_rows, device)], dim=-1)

        token_ids = x.argmax(dim=-1)
        if random_rows:
            rand_idx = _index(random_rows, device)
            sub_rows = [rows[i] for i in random_rows]
            probs = filtered_probs(x[rand_idx], [r.params for r in sub_rows])
            token_ids[rand_idx] = self._race(probs, sub_rows)

        out_logprobs: list[Optional[list]] = [None] * len(rows)
        if logprob_rows:
            out_logprobs_rows = _collect_logprobs(
                logprobs_t, token_ids[_index(logprob_rows, device)],
                [rows[i].params.logprobs for i in logprob_rows])
            for i, entry in zip(logprob_rows, out_logprobs_rows):
                out_logprobs[i] = entry
        return SamplerOutput(token_ids=token_ids.tolist(), logprobs=out_logprobs)

    def _race(self, probs: torch.Tensor, rows: list[SamplingRequestState]) -> torch.Tensor:
        """argmax(probs / q), q ~ Exp(1): picks token i with probability probs[i] / sum(probs).

        Seeded rows draw a [vocab] vector from their own generator, so their draws never
        depend on batch size or position; unseeded rows share one draw from the default.
        """
        shared = [j for j, r in enumerate(rows) if r.generator is None]
        if len(shared) == len(rows):
            q = _exponential(probs.shape, self.default_generator, probs)
        else:
            q = torch.empty_like(probs)
            if shared:
                q[_index(shared, probs.device)] = _exponential(
                    (len(shared), probs.shape[1]), self.default_generator, probs)
            for j, r in enumerate(rows):
                if r.generator is not None:
                    q[j] = _exponential((probs.shape[1],), r.generator, probs)
        # An exact 0 from the RNG would turn 0/0 into NaN (which argmax ranks highest) and
        # let an excluded token win; clamping keeps excluded (prob 0) tokens at 0.
        q.clamp_(min=torch.finfo(q.dtype).tiny)
        return (probs / q).argmax(dim=-1)


def _exponential(shape, generator: Optional[torch.Generator], like: torch.Tensor) -> torch.Tensor:
    """Exp(1) draws from `generator` on the generator's own device, moved to `like`'s device.
    The engine creates its generators on the logits' device (so this is a no-op move there);
    a caller passing a CPU generator with CUDA logits still works instead of failing the step."""
    device = generator.device if generator is not None else like.device
    q = torch.empty(shape, dtype=like.dtype, device=device).exponential_(generator=generator)
    return q.to(like.device)


def apply_penalties(x: torch.Tensor, rows: list[SamplingRequestState], which: list[int]) -> None:
    """In place on float32 `x[which]`: repetition, frequency, presence, no_repeat_ngram_size.

    repetition_penalty (HF): every token seen in prompt + output has its logit divided by the
    penalty when positive, multiplied when not. frequency/presence (OpenAI/vLLM) count the
    OUTPUT only: logit -= frequency * count + presence * (count > 0). The engine could cache
    prompt counts per request if long prompts make the per-step rebuild show up in profiles.
    """
    vocab, device = x.shape[1], x.device
    idx = _index(which, device)
    sub = x[idx]
    params = [rows[i].params for i in which]

    rep = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in rep):
        seen = _count_tokens([rows[i].prompt_token_ids + rows[i].output_token_ids for i in which],
                             vocab, device) > 0
        rep_t = torch.tensor(rep, dtype=torch.float32, device=device).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep_t, sub * rep_t), sub)

    freq = [p.frequency_penalty for p in params]
    pres = [p.presence_penalty for p in params]
    if any(freq) or any(pres):
        counts = _count_tokens([rows[i].output_token_ids for i in which], vocab, device)
        freq_t = torch.tensor(freq, dtype=torch.float32, device=device).unsqueeze(1)
        pres_t = torch.tensor(pres, dtype=torch.float32, device=device).unsqueeze(1)
        sub = sub - freq_t * counts - pres_t * (counts > 0).to(torch.float32)

    ban_rows, ban_tokens = [], []
    for j, i in enumerate(which):
        n = params[j].no_repeat_ngram_size
        if n > 0:
            seq = rows[i].prompt_token_ids + rows[i].output_token_ids
            for t in banned_ngram_tokens(seq, n):
                if 0 <= t < vocab:
                    ban_rows.append(j)
                    ban_tokens.append(t)
    if ban_rows:
        sub[_index(ban_rows, device), _index(ban_tokens, device)] = _NEG_INF
    x[idx] = sub


def banned_ngram_tokens(seq: list[int], n: int) -> set[int]:
    """HF no_repeat_ngram_size: tokens that would complete an n-gram already in `seq`."""
    if n <= 0 or len(seq) < n:
        return set()
    prefix = seq[len(seq) - n + 1:] if n > 1 else []
    banned = set()
    for start in range(len(seq) - n + 1):
        if seq[start:start + n - 1] == prefix:
            banned.add(seq[start + n - 1])
    return banned


def apply_min_tokens(x: torch.Tensor, rows: list[SamplingRequestState], which: list[int]) -> None:
    """In place: eos and stop ids -> -inf for rows still below params.min_tokens."""
    vocab = x.shape[1]
    ban_rows, ban_tokens = [], []
    for i in which:
        for t in set(rows[i].eos_token_ids) | set(rows[i].params.stop_token_ids):
            if 0 <= t < vocab:  # ids beyond the logits (padded vocab, bad config) can't be sampled
                ban_rows.append(i)
                ban_tokens.append(t)
    if ban_rows:
        x[_index(ban_rows, x.device), _index(ban_tokens, x.device)] = _NEG_INF


def filtered_probs(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Unnormalised sampling probabilities of random rows: temperature, top_k, top_p, min_p.

    Every filter keeps the most likely token, so a row never ends up empty. top_k keeps ties
    with the k-th value (a cut inside a tie would be arbitrary). Excluded tokens get prob 0.
    """
    device, vocab = x.device, x.shape[1]
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    x = x / temp.unsqueeze(1)

    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    top_p = [p.top_p for p in params]
    if any(top_k) or any(p < 1.0 for p in top_p):
        sorted_x, order = x.sort(dim=-1, descending=True)
        if any(top_k):
            k = torch.tensor([k if k else vocab for k in top_k], device=device)
            kth = sorted_x.gather(1, (k - 1).unsqueeze(1))
            x = x.masked_fill(x < kth, _NEG_INF)
            sorted_x = sorted_x.masked_fill(sorted_x < kth, _NEG_INF)
        if any(p < 1.0 for p in top_p):
            sorted_probs = sorted_x.softmax(dim=-1)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            p_t = torch.tensor(top_p, dtype=torch.float32, device=device).unsqueeze(1)
            # Keep while the mass of the better tokens is still short of top_p; this is the
            # smallest set reaching top_p and always holds the top token (mass_before == 0).
            # Rows with top_p == 1 are left alone so rounding in cumsum cannot drop a tail.
            drop_sorted = (mass_before >= p_t) & (p_t < 1.0)
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            x = x.masked_fill(drop, _NEG_INF)

    probs = x.softmax(dim=-1)
    min_p = [p.min_p for p in params]
    if any(min_p):
        mp = torch.tensor(min_p, dtype=torch.float32, device=device).unsqueeze(1)
        probs = probs.masked_fill(probs < mp * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs


def _count_tokens(seqs: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(seqs), vocab] float32 occurrence counts, in one scatter for the whole batch."""
    width = max((len(s) for s in seqs), default=0)
    counts = torch.zeros((len(seqs), vocab + 1), dtype=torch.float32, device=device)
    if width:
        # Padding and out-of-range ids go to an extra column that is dropped.
        ids = torch.tensor([s + [vocab] * (width - len(s)) for s in seqs], dtype=torch.long, device=device)
        ids = ids.masked_fill((ids < 0) | (ids > vocab), vocab)
        counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab]


def _collect_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, nums: list[int]) -> list[list]:
    """[sampled_logprob, {alt_id: logprob}] per row, with one host transfer per tensor."""
    sampled = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
    k = min(max(nums), logprobs.shape[1])
    if k:
        top_vals, top_ids = logprobs.topk(k, dim=-1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    result = []
    for j, n in enumerate(nums):
        alts = dict(zip(top_ids[j][:n], top_vals[j][:n])) if n and k else {}
        result.append([sampled[j], alts])
    return result


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
