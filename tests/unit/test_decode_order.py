"""`with_decode_order`: which steps get the decode kernel's longest-first launch order. Its CUDA
test is only `hidden.is_cuda`, so a stand-in with that attribute runs the rule on the CPU (the
sort is `kernels.attention.decode_order`, exact on any device)."""

import types

import torch

from infer_cluster.worker.models.decoder import AttentionMetadata, with_decode_order

CUDA = types.SimpleNamespace(is_cuda=True)


def _meta(lens, max_query_len=1, row_span=None):
    n = len(lens)
    return AttentionMetadata(slot_mapping=torch.zeros(n, dtype=torch.int64),
                             block_tables=torch.zeros(n, 4, dtype=torch.int32),
                             seq_lens=torch.tensor(lens, dtype=torch.int32),
                             query_start_loc=torch.arange(n + 1, dtype=torch.int32),
                             max_query_len=max_query_len, row_span=row_span)


def test_decode_steps_of_several_sequences_get_the_order():
    meta = _meta([5, 300, 0, 41])
    got = with_decode_order(meta, CUDA)
    assert got is not meta and meta.decode_order is None  # a copy; the step's meta is kept
    assert got.decode_order.tolist() == [1, 3, 0, 2] and got.decode_order.dtype == torch.int32
    assert with_decode_order(got, CUDA) is got  # once a step: layers and stages reuse it


def test_other_steps_keep_the_row_order(monkeypatch):
    cpu = torch.zeros(1)
    for meta, hidden in ((_meta([5, 300]), cpu),                      # no CUDA: no Triton kernel
                         (_meta([7]), CUDA),                           # one sequence
                         (_meta([5, 300], max_query_len=3), CUDA),     # prompts in the step
                         (_meta([5, 6], row_span=torch.tensor([2, -1], dtype=torch.int32)), CUDA)):
        assert with_decode_order(meta, hidden) is meta
    monkeypatch.setenv("INFER_CLUSTER_DECODE_LONGEST_FIRST", "0")
    meta = _meta([5, 300])
    assert with_decode_order(meta, CUDA) is meta
