"""`apply_token_bitmask` (kernels/bitmask.py): the plain-torch reference against a loop that
reads each bit by itself, and the Triton kernel (kernels/bitmask_triton.py) against the
reference: the bits unpacked, columns past the vocabulary banned, rows not listed untouched; in
float32 and bf16 (the kernel only writes -inf)."""

import pytest
import torch

from infer_cluster.kernels.bitmask import apply_token_bitmask_ref
from infer_cluster.kernels.bitmask_triton import BLOCK, apply_token_bitmask_triton


def by_bits(logits, bitmask, rows, vocab):
    out = logits.clone()
    for r in rows.tolist():
        for c in range(logits.shape[1]):
            word = int(bitmask[r, c // 32]) if c // 32 < bitmask.shape[1] else 0
            if c >= vocab or not (word >> (c % 32)) & 1:
                out[r, c] = float("-inf")
    return out


def case(width, vocab, dtype, device, n=5, seed=0):
    g = torch.Generator().manual_seed(seed + width)
    logits = torch.randn(n, width, generator=g).to(dtype)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (n, words), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[3] = 0  # a row that allows nothing
    rows = torch.tensor([0, 2, 3], dtype=torch.int32)
    return logits.to(device), bitmask.to(device), rows.to(device)


@pytest.mark.parametrize("width,vocab", [(70, 70), (100, 37), (130, 130)])
def test_reference_reads_every_bit(width, vocab):
    logits, bitmask, rows = case(width, vocab, torch.float32, "cpu")
    want = by_bits(logits, bitmask, rows, vocab)
    got = apply_token_bitmask_ref(logits.clone(), bitmask, rows, vocab)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width,vocab", [(100, 100), (BLOCK + 37, 70), (2 * BLOCK + 5, 2 * BLOCK + 5)])
def test_kernel_matches_reference(device, dtype, width, vocab):
    logits, bitmask, rows = case(width, vocab, dtype, device)
    want = apply_token_bitmask_ref(logits.clone(), bitmask, rows, vocab)
    got = apply_token_bitmask_triton(logits.clone(), bitmask, rows, vocab)
    assert torch.equal(got, want)
    assert torch.equal(got[[1, 4]], logits[[1, 4]])  # rows not listed are left alone


def test_refuses_what_it_cannot_apply():
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="int32 2-D bitmask"):
        apply_token_bitmask_ref(logits, torch.zeros(2, 2, dtype=torch.int64), torch.zeros(1, dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="1-D int32"):
        apply_token_bitmask_ref(logits, torch.zeros(2, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), 64)
    with pytest.raises(ValueError, match="cannot cover"):
        apply_token_bitmask_ref(logits, torch.zeros(2, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 64)
