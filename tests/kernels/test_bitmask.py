"""`apply_token_bitmask` (kernels/bitmask_triton.py) against a plain-torch reference: the bits
unpacked, columns past the vocabulary banned, rows not listed untouched; in float32 and bf16
(loaded as stored: the kernel only writes -inf)."""

import pytest
import torch

from infer_cluster.kernels.bitmask_triton import BLOCK, apply_token_bitmask


def reference(logits, bitmask, rows, vocab):
    out = logits.clone()
    n, width = logits.shape
    cols = torch.arange(width)
    for r in rows.tolist():
        words = bitmask[r].cpu().to(torch.int64) & 0xFFFFFFFF
        bit = (words[(cols // 32).clamp(max=words.shape[0] - 1)] >> (cols % 32)) & 1
        allowed = (bit == 1) & (cols < vocab)
        out[r][~allowed.to(out.device)] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width,vocab", [(100, 100), (BLOCK + 37, 70), (2 * BLOCK + 5, 2 * BLOCK + 5)])
def test_matches_reference(device, dtype, width, vocab):
    g = torch.Generator().manual_seed(width)
    n = 5
    logits = torch.randn(n, width, generator=g).to(dtype).to(device)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (n, words), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[3] = 0  # a row that allows nothing
    bitmask = bitmask.to(device)
    rows = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    want = reference(logits, bitmask, rows, vocab)
    got = apply_token_bitmask(logits.clone(), bitmask, rows, vocab)
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got[~got.isinf()], want[~want.isinf()])
    assert torch.equal(got[[1, 4]], logits[[1, 4]])  # rows not listed are left alone


def test_refuses_what_it_cannot_apply():
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="int32 2-D bitmask"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64), torch.zeros(1, dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="1-D int32"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), 64)
    with pytest.raises(ValueError, match="cannot cover"):
        apply_token_bitmask(logits, torch.zeros(2, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 64)
