"""Entry points of the sampler's kernels (the draw: kernels/sample_triton.py; the top-p cut:
kernels/top_p_cut_triton.py; the penalty state: kernels/penalty_triton.py; the random rows'
columns and uniforms: kernels/random_columns_triton.py), importable without
Triton: the constants the callers plan with, and wrappers that load the Triton module on first
use. `worker.sampling_ops` calls them where `dispatch.use_triton` holds, and keeps the plain-torch
paths that are their references (and the CPU's implementation).

To extend: a new kernel gets a wrapper here and its launch in sample_triton.py.
"""

from __future__ import annotations

import torch

from .dispatch import env_switch, use_triton

MAX_CANDIDATES = 512  # widest candidate set `candidate_draw` takes; wider rows use the torch path


def use_sample_kernels(x: torch.Tensor) -> bool:
    """Whether the draw of logits `x` runs these kernels: where `use_triton` holds, unless
    `INFER_CLUSTER_SAMPLER_KERNELS=0` (the A/B switch: the torch paths and the host Philox)."""
    return use_triton(x) and env_switch("INFER_CLUSTER_SAMPLER_KERNELS")


def candidate_draw(x, vals, ids, m, inv_t, top_k, top_p, min_p, uniform, margin: int, p_candidates: int,
                   block: int, any_top_p_alone: bool = False):
    """(ids [n] int64, codes [n] int8, kth [n, 1] float32, mass [n] float32): filters and draw of
    candidate rows in one launch (two when `any_top_p_alone`: those rows' whole-row masses first,
    returned in `mass`); codes 1 and 2 flag rows whose kept set may reach past their candidates
    (2: a top-p row without top-k).
    See `sample_triton.candidate_draw`."""
    from .sample_triton import candidate_draw as launch
    return launch(x, vals, ids, m, inv_t, top_k, top_p, min_p, uniform, margin, p_candidates, block,
                  any_top_p_alone)


def full_draw(x, m, inv_t, tau, min_p, uniform, block: int, active=None, active_code: int = 0,
              out=None) -> torch.Tensor:
    """ids [n] int64 over the whole vocabulary; with `active`, only the rows whose code is
    `active_code` run and are written into `out` (see `sample_triton.full_draw`)."""
    from .sample_triton import full_draw as launch
    return launch(x, m, inv_t, tau, min_p, uniform, block, active, active_code, out)


def top_p_threshold(x, m, inv_t, tau, top_p, active=None, active_code: int = 0, mass=None) -> torch.Tensor:
    """[n, 1] float32 top-p cut of full-path rows (see `top_p_cut_triton.top_p_threshold`)."""
    from .top_p_cut_triton import top_p_threshold as launch
    return launch(x, m, inv_t, tau, top_p, active, active_code, mass)


def copy_flagged_rows(x, flags, rows=None) -> torch.Tensor:
    """Like `x`, with only the flagged rows copied (see `sample_triton.copy_flagged_rows`): what
    a later redo of those rows reads once x's own buffer may have been rewritten."""
    from .sample_triton import copy_flagged_rows as launch
    return launch(x, flags, rows)


def topk_select_fits(x: torch.Tensor, maxima: torch.Tensor, width: int, block: int) -> bool:
    """Whether `topk_select` takes this call: 16-bit logits and maxima with unit column stride,
    128-column blocks, 1 <= width <= MAX_CANDIDATES and at most the vocabulary, unless
    `INFER_CLUSTER_TOPK_SELECT=0`."""
    return (env_switch("INFER_CLUSTER_TOPK_SELECT")  # =0: the torch top-ks (the A/B)
            and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and x.stride(1) == 1
            and maxima.dtype == x.dtype and maxima.stride(1) == 1 and block == 128
            and 1 <= width <= min(MAX_CANDIDATES, x.shape[1]))


def topk_select(x, maxima, width: int, block: int = 128):
    """(values [n, width] float32, ids [n, width] int64): each row's top `width`, highest first,
    in one launch from its block maxima (see kernels/topk_select_triton.py)."""
    from .topk_select_triton import topk_select as launch
    return launch(x, maxima, width, block)


def float32_copy(x: torch.Tensor) -> torch.Tensor:
    """A new float32 copy of logits x [n, vocab]: the cast kernel (`sample_triton.float32_copy`)
    for 16-bit logits with unit column stride where the sampler's kernels run, else torch's."""
    if use_sample_kernels(x) and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and x.stride(1) == 1:
        from .sample_triton import float32_copy as launch
        return launch(x)
    return x.to(torch.float32, copy=True)


def random_columns(packed: torch.Tensor):
    """(float32 [4, n]: temperature, top_p, min_p, 1 / temperature; int64 [n] top_k; float64 [n]
    uniform) from the sampler's float64 upload [6, n], in one launch (see
    kernels/random_columns_triton.py)."""
    from .random_columns_triton import random_columns as launch
    return launch(packed)


def apply_penalties(x, token_ids, counts, num_distinct, packed) -> None:
    """The penalties on the seen columns of x, in place (see `penalty_triton.apply_penalties`)."""
    from .penalty_triton import apply_penalties as launch
    launch(x, token_ids, counts, num_distinct, packed)


def append_tokens(token_ids, counts, num_distinct, slots, tokens) -> None:
    """Fold one new token per slot (see `penalty_triton.append_tokens`)."""
    from .penalty_triton import append_tokens as launch
    launch(token_ids, counts, num_distinct, slots, tokens)
