"""`INFER_CLUSTER_GREEDY_GRAPH_MAX` (worker/runner/model_runner.py): the largest decode batch whose CUDA
graph also captures a greedy variant. Unset gives the default, 0 turns it off, and a value that
is not a whole number of sequences is a one-line configuration error, not a traceback later."""

import pytest

from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker.runner.graph_set import GREEDY_GRAPH_ENV, GREEDY_GRAPH_MAX_DEFAULT, greedy_graph_max


@pytest.mark.parametrize("value,want", [(None, GREEDY_GRAPH_MAX_DEFAULT), ("", GREEDY_GRAPH_MAX_DEFAULT),
                                        ("0", 0), (" 8 ", 8), ("512", 512)])
def test_values(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(GREEDY_GRAPH_ENV, raising=False)
    else:
        monkeypatch.setenv(GREEDY_GRAPH_ENV, value)
    assert greedy_graph_max() == want


@pytest.mark.parametrize("value", ["eight", "1.5", "-1"])
def test_bad_values_name_the_variable(monkeypatch, value):
    monkeypatch.setenv(GREEDY_GRAPH_ENV, value)
    with pytest.raises(ConfigError, match=GREEDY_GRAPH_ENV):
        greedy_graph_max()
