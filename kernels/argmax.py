"""The argmax of each row of a logits matrix, as `torch.argmax(x, dim=-1)` gives it.

Owns `row_argmax(x)`: int64 `[rows]`, the first (lowest) index of each row's largest value,
and the first NaN where a row holds one (torch's rule). On CUDA it is the split kernel of
`argmax_triton.py`, which a decode graph can capture: torch's reduction gives a batch-1 row of
151,936 logits to one block (9.3 us on the H100, docs/kernels.md), the split kernel spreads it
over ~75 programs and merges their (value, index) pairs in a second launch. Elsewhere it is
torch's own argmax.

To extend (e.g. the value beside the index): add an output to `_part_kernel` / `_pick_kernel`
and a case to tests/kernels/test_argmax.py, which compares with torch on every input it covers.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"row_argmax needs a non-empty [rows, vocab] matrix, got {tuple(x.shape)}")
    if use_triton(x) and x.stride(1) == 1:
        from .argmax_triton import row_argmax_triton
        return row_argmax_triton(x)
    return x.argmax(dim=-1)
