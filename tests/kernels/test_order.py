"""The decode order kernel (kernels/order_triton.py) against torch's stable descending sort: random
lengths with many ties, every size around its tile edges, and a CUDA-graph replay that follows new
lengths. `decode_order` itself is the same permutation on either path."""

import pytest
import torch

from infer_cluster.kernels.attention import decode_order
from infer_cluster.kernels.order_triton import BLOCK_I, BLOCK_J, order_desc_triton


def _stable_desc(lens):
    return torch.sort(lens, descending=True, stable=True).indices.to(torch.int32)


@pytest.mark.parametrize("n", [1, 2, 7, BLOCK_I - 1, BLOCK_I, BLOCK_I + 1, BLOCK_J + 3, 300])
@pytest.mark.parametrize("high", [3, 5000])  # many ties; few
def test_matches_a_stable_descending_sort(device, n, high):
    g = torch.Generator().manual_seed(n * 31 + high)
    lens = torch.randint(1, high, (n,), generator=g, dtype=torch.int32).to(device)
    got = order_desc_triton(lens)
    assert got.dtype == torch.int32 and got.shape == (n,)
    assert torch.equal(got.cpu(), _stable_desc(lens.cpu()))


def test_empty_and_equal_lengths(device):
    assert order_desc_triton(torch.empty(0, dtype=torch.int32, device=device)).shape == (0,)
    same = torch.full((BLOCK_I + 9,), 7, dtype=torch.int32, device=device)
    assert order_desc_triton(same).tolist() == list(range(BLOCK_I + 9))  # ties in index order


def test_decode_order_is_the_same_permutation_on_either_path(device):
    lens = torch.tensor([5, 900, 5, 17, 900, 1], dtype=torch.int32, device=device)
    assert decode_order(lens).tolist() == [1, 4, 3, 0, 2, 5]
    assert decode_order(lens.cpu()).tolist() == [1, 4, 3, 0, 2, 5]


def test_gpu_graph_replay_follows_new_lengths(gpu_device):
    lens = torch.randint(1, 2000, (256,), dtype=torch.int32, device=gpu_device)
    order_desc_triton(lens)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = order_desc_triton(lens)
    lens.copy_(torch.randint(1, 2000, (256,), dtype=torch.int32, device=gpu_device))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), _stable_desc(lens.cpu()))
