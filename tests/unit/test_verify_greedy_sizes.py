"""`verify_greedy_sizes` (worker/runner/graph_set.py): the greedy-only verify graph sizes past
the verify ladder reach a row and one proposal for every sequence (twice the decode batch), and
there are none where the ladder already reaches that far."""

import pytest

from infer_cluster.worker.runner.graph_set import verify_greedy_sizes
from infer_cluster.worker.spec_decode.ngram import row_limit


@pytest.mark.parametrize("ladder_max,max_seqs,want", [
    (48, 256, [64, 96, 128, 192, 256, 384, 512]),
    (48, 40, [64, 80]),
    (48, 24, []),  # 48 rows already hold 24 rows and a proposal each
    (48, 25, [50]),
    (128, 512, [192, 256, 384, 512, 768, 1024]),
])
def test_sizes(ladder_max, max_seqs, want):
    assert verify_greedy_sizes(ladder_max, max_seqs) == want


@pytest.mark.parametrize("batch", [25, 40, 100, 256])
def test_a_full_batch_at_the_least_proposals_fits(batch):
    """Past the ladder every row gets one proposal at most (`row_limit`), so the largest size
    holds any verify step of a full batch."""
    assert row_limit(15, batch, 48) == 1
    assert 2 * batch <= verify_greedy_sizes(48, batch)[-1]
