"""Decode steps as two half-batches whose all-reduces overlap the other half
(`INFER_CLUSTER_TP_OVERLAP`, worker/models/overlap.py): greedy tokens at T=2 equal T=1's and HF's
for every tiny family (float32, gloo, real rank processes), the split really ran, and the
switch and the metadata split behave. GPU runs (side stream, CUDA graphs) are in test_gpu.py."""

import pytest
import torch

from infer_cluster.worker import LLM
from infer_cluster.worker.models.decoder import AttentionMetadata
from infer_cluster.worker.models.overlap import ENV, overlap_min_rows, split_meta, split_point

from .conftest import ENGINE, FAMILIES, GREEDY, check_parallel_greedy, make_prompts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_overlapped_decode_matches_t1_and_hf(started, dist_checkpoints, hf_greedy, monkeypatch, family):
    import infer_cluster.worker.model_runner as mr

    with LLM(dist_checkpoints[family], **ENGINE) as llm:
        single = [o.token_ids for o in llm.generate(make_prompts(), GREEDY, use_tqdm=False)]
    splits = []
    real = mr.forward_overlapped
    monkeypatch.setattr(mr, "forward_overlapped", lambda *a: splits.append(a[-1]) or real(*a))
    monkeypatch.setenv(ENV, "2")  # every decode step of 2 rows or more (ranks inherit it)
    llm = check_parallel_greedy(started, dist_checkpoints[family], 2, 1, ENGINE,
                                [single, hf_greedy[family]])
    assert llm.engine.runner._shard.runner.overlap_rows == 2
    # Rank 0's decode steps of 4, 3 and 2 rows ran split (halves of 2 + 2, 1 + 2, 1 + 1).
    assert {1, 2} <= set(splits)


def test_switch_values(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert overlap_min_rows() == 0
    for off in ("0", "off", ""):
        monkeypatch.setenv(ENV, off)
        assert overlap_min_rows() == 0
    monkeypatch.setenv(ENV, "128")
    assert overlap_min_rows() == 128
    for bad, message in (("many", "row count"), ("1", "at least 2")):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=message):
            overlap_min_rows()


def test_one_rank_never_splits(dist_checkpoints, monkeypatch):
    monkeypatch.setenv(ENV, "2")
    with LLM(dist_checkpoints["llama"], **ENGINE) as llm:
        assert llm.engine.runner.overlap_rows == 0  # T=1: nothing to overlap


def test_split_meta_cuts_rows_and_rebases_query_starts():
    n = 5
    meta = AttentionMetadata(slot_mapping=torch.arange(10, 10 + n), block_tables=torch.arange(n * 3).view(n, 3),
                             seq_lens=torch.tensor([4, 7, 1, 9, 2], dtype=torch.int32),
                             query_start_loc=torch.arange(n + 1, dtype=torch.int32), max_query_len=1)
    a, b = split_meta(meta, 2)
    assert a.slot_mapping.tolist() == [10, 11] and b.slot_mapping.tolist() == [12, 13, 14]
    assert a.block_tables.tolist() == [[0, 1, 2], [3, 4, 5]] and b.block_tables.shape == (3, 3)
    assert a.seq_lens.tolist() == [4, 7] and b.seq_lens.tolist() == [1, 9, 2]
    assert a.query_start_loc.tolist() == [0, 1, 2] and b.query_start_loc.tolist() == [0, 1, 2, 3]
    assert a.max_query_len == b.max_query_len == 1


def test_split_point_only_for_decode_steps_of_enough_rows():
    def meta(num_seqs, max_query_len):
        return AttentionMetadata(torch.zeros(5), torch.zeros(num_seqs, 1), torch.ones(num_seqs),
                                 torch.arange(num_seqs + 1), max_query_len)
    assert split_point(5, meta(5, 1), 4) == 2
    assert split_point(5, meta(5, 1), 6) == 0   # too few rows
    assert split_point(5, meta(5, 1), 0) == 0   # switched off
    assert split_point(5, meta(3, 2), 2) == 0   # a prefill / mixed step
    assert split_point(1, meta(1, 1), 2) == 0   # one row cannot split
