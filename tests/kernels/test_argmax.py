"""The split row argmax (kernels/argmax_triton.py) against torch.argmax, bit for bit: random
rows, ties (inside one part and across parts), -inf rows, NaN, and a vocabulary that is not a
multiple of the part width."""

import pytest
import torch

from infer_cluster.kernels.argmax import row_argmax
from infer_cluster.kernels.argmax_triton import BLOCK, row_argmax_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 100), (3, BLOCK), (5, 3 * BLOCK + 17), (2, 151_936)])
def test_random_rows_match_torch(device, dtype, shape):
    x = (4 * torch.randn(shape, device=device)).to(dtype)
    got = row_argmax_triton(x)
    assert got.dtype == torch.int64 and got.shape == (shape[0],)
    assert torch.equal(got, x.argmax(dim=-1))


def test_ties_go_to_the_lowest_index(device):
    x = torch.zeros(6, 3 * BLOCK + 5, device=device, dtype=torch.bfloat16)
    x[1, [BLOCK + 3, 7, 2 * BLOCK]] = 2.0          # the same maximum in three parts
    x[2, [BLOCK - 1, BLOCK]] = 1.5                 # on both sides of a part boundary
    x[3, -1] = 1.0                                 # the last column, in a short part
    x[4] = float("-inf")                           # a banned row: torch answers 0
    x[5, [9, 2 * BLOCK + 1]] = float("inf")        # +inf twice
    assert torch.equal(row_argmax_triton(x), x.argmax(dim=-1))
    assert row_argmax_triton(x).tolist()[:5] == [0, 7, BLOCK - 1, 3 * BLOCK + 4, 0]


def test_nan_wins_like_torch(device):
    x = torch.randn(3, 2 * BLOCK + 100, device=device)
    x[0, BLOCK + 50] = float("nan")
    x[1, [3, 2 * BLOCK + 7]] = float("nan")
    x[1, 0] = float("inf")
    x[2, 2 * BLOCK + 99] = float("nan")
    assert torch.equal(row_argmax_triton(x), x.argmax(dim=-1))
    assert row_argmax_triton(x).tolist() == [BLOCK + 50, 3, 2 * BLOCK + 99]


def test_strided_rows_and_dispatch(device):
    wide = torch.randn(4, 3000, device=device)
    x = wide[:, :2500]                             # rows with a stride larger than the width
    assert torch.equal(row_argmax_triton(x), x.argmax(dim=-1))
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    assert row_argmax_triton(torch.empty(0, 10, device=device)).shape == (0,)
    with pytest.raises(ValueError, match="non-empty"):
        row_argmax(torch.empty(3, 0, device=device))


from tests.kernels.conftest import sm90_check  # noqa: E402

SM90_SPILLS = sm90_check("argmax_spills", """
from bench.ptxas_check import argmax_variants
from bench.sm90_build import compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in argmax_variants():
    regs, spills = ptxas_info(compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"])
    print(name.replace(" ", "_"), regs, spills)
""")


def test_sm90_builds_do_not_spill(sm90_builds):
    """Compiled ahead of time for an H100 (no GPU needed; in a child process, as the interpreter
    cannot compile), at the launch options `row_argmax_triton` uses: no kernel spills."""
    rows = [line.split() for line in sm90_builds.get(SM90_SPILLS).splitlines()]
    assert [name for name, _, _ in rows] == ["argmax_parts_fp32", "argmax_parts_bf16", "argmax_pick"]
    assert [name for name, _, spills in rows if int(spills)] == []
