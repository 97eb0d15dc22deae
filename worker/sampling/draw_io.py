"""What one step's draw takes and gives: `SamplingRequestState` (a row, as the engine sees its
request before the step), `RowClasses` (`Sampler.classify`: which rows use which feature),
`DeviceDraw` (the draw on the device, before its host copy) and `SamplerOutput` (the ids and
logprobs `Sampler.finish` returns). Plain data; the `Sampler` (sampler.py) fills them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence

import numpy as np
import torch

from infer_cluster.protocol.sampling_params import SamplingParams

from infer_cluster.worker.sampling.ops import Unresolved


@dataclass(slots=True)  # one per row per step
class SamplingRequestState:
    """One row of the batch, as the engine sees that request before this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far, before this step
    generator: Optional[torch.Generator]  # unseeded rows only: their random key's source
    eos_token_ids: Sequence[int]  # suppressed with params.stop_token_ids while below min_tokens
    request_id: Optional[Hashable] = None  # keys the penalty state kept between steps
    # Tokens already drawn for the request on the device whose ids are not in
    # `output_token_ids` yet (async scheduling): they count as generated (min_tokens, the
    # seeded stream's step, the penalty state's consistency check).
    num_pending: int = 0
    # The request's `GrammarState` (worker/structured/state.py) when its params have
    # structured_outputs: its mask restricts the row (it needs num_pending == 0).
    grammar: Optional[object] = None


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    # Per row: None when params.logprobs is None, else
    # [sampled_logprob, {alt_token_id: logprob}] with the top-`params.logprobs` alternatives
    # (a `DeferredLogprob` of it when the call asked for `defer_logprobs`).
    logprobs: list
    # Rows whose id the redo in `finish` changed: a step drawn after this one may have used
    # the provisional id (async scheduling's pending input); the engine rewinds that request.
    redrawn: list = field(default_factory=list)


@dataclass(slots=True)
class RowClasses:
    """`Sampler.classify`: the plan table of one step's rows and the rows of each feature."""
    table: np.ndarray
    seeds: np.ndarray
    seeded: np.ndarray
    penalty_rows: list
    logprob_rows: list
    random_rows: list
    min_tokens_rows: list  # rows still below their min_tokens
    grammar_rows: list = field(default_factory=list)  # rows whose grammar masks their logits
    bias_rows: list = field(default_factory=list)  # rows with a logit_bias

    @property
    def plain_greedy(self) -> bool:
        """Every row is an argmax of the raw logits: nothing to edit, report or draw."""
        return not (self.penalty_rows or self.min_tokens_rows or self.logprob_rows or self.random_rows
                    or self.grammar_rows or self.bias_rows)


@dataclass
class DeviceDraw:
    """One step's draw before its host copy: `transfer` (int64) is the sampled ids, then the
    logprob alternatives' ids, then the `unresolved` rows' flags; `values` (float64) the logprob
    pack, or None. `token_ids` are provisional for rows that `unresolved` flags."""

    token_ids: torch.Tensor  # [num_rows] int64 on the device
    transfer: torch.Tensor
    values: Optional[torch.Tensor]
    num_rows: int
    logprob_rows: list = field(default_factory=list)
    lp_nums: list = field(default_factory=list)
    lp_k: int = 0
    ngram: list = field(default_factory=list)  # (row, state entry) whose n-gram map needs the id
    unresolved: Optional[Unresolved] = None  # candidate-path rows that may need the full path
    random_rows: list = field(default_factory=list)  # the row of each random row
    penalty_keys: dict = field(default_factory=dict)  # row -> its penalty state key (when a redo may run)
    lp_lse: Optional[torch.Tensor] = None  # logprob rows' log-sum-exp (to fix a redrawn row's)
