"""Speculative decoding across the cluster: two replicas started with `--speculative-config`,
one proposing by n-gram lookup and one with a draft model (tiny-random drafting for itself),
answer 120 concurrent greedy requests with the offline engine's tokens and text (speculation
off), through a kill -9 of one replica mid-stream (resumed requests continue exactly, on a
replica of the other method), and their proposals and acceptances reach `status`."""

from __future__ import annotations

import json
import signal

import pytest

from infer_cluster.cli_client import render_status
from infer_cluster.protocol import SamplingParams

from .conftest import ClusterProcs, PacedLoad
from .test_cluster import counting_client

pytestmark = pytest.mark.timeout(240)

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "adaptive": False}
DRAFT = {"method": "draft_model", "model": "tiny-random", "num_speculative_tokens": 3, "adaptive": False}
# The load: a quarter at once, the rest over PACE_S seconds (`PacedLoad`), so a status poll sees a
# replica mid-stream after the first tenth however fast the host streams.
NUM, MAX_TOKENS, PACE_S = 120, 96, 3.0


@pytest.fixture(scope="module")
def spec_cluster(tmp_path_factory):
    procs = ClusterProcs(tmp_path_factory.mktemp("spec-cluster-logs"), num_replicas=2,
                         replica_extra_args={0: ["--speculative-config", json.dumps(SPEC)],
                                             1: ["--speculative-config", json.dumps(DRAFT)]})
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


def test_kill_9_while_speculating_matches_the_offline_engine(spec_cluster, offline_reference):
    words = ["one two three", "red green blue red green", "a b a b a b", "def f(x): return x"]
    items = [(f"{i}: " + " ".join([words[i % 4]] * 4), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                                      ignore_eos=True))
             for i in range(NUM)]
    expected = offline_reference(items)
    generated = spec_cluster.generated_tokens()
    c, finals, tokens = counting_client(spec_cluster.address)
    try:
        load = PacedLoad(c, items, "spec-", head=NUM // 4, pace_s=PACE_S).start()
        spec_cluster.wait_generated(generated, NUM * MAX_TOKENS * 0.1)
        victim, rows = spec_cluster.replica_mid_stream(generated)
        streamed = sum(len(v) for v in tokens.values())
        spec_cluster.kill_replica(victim, signal.SIGKILL)
        outs = load.results()
    finally:
        c.close()
    assert streamed < NUM * MAX_TOKENS, "the load finished before the kill; make requests longer"
    assert len(finals) == NUM and set(finals.values()) == {1}
    for i, (o, (toks, text)) in enumerate(zip(outs, expected)):
        assert tokens[f"spec-{i}"] == o.token_ids  # what crossed the wire, no duplicates
        assert o.token_ids == toks and o.text == text, f"request {i} differs from the offline engine"
    status = spec_cluster.status()
    assert status["coordinator"]["num_resumed"] > 0, f"nothing resumed (killed replica-{victim}; {rows})"
    assert "speculative decoding: ngram, 4 proposals a row" in spec_cluster.replica_log(0)
    assert "speculative decoding: draft_model, 3 proposals a row, draft tiny-random" in spec_cluster.replica_log(1)
    row = next(r for r in status["replicas"] if r["name"] == f"replica-{1 - victim}")
    assert row["num_spec_draft_tokens"] >= row["num_spec_accepted_tokens"] > 0
    assert row["speculative"] == ("ngram" if row["name"] == "replica-0" else "draft_model")
    table = render_status(status)  # what `infer-cluster status` prints
    line = next(x for x in table.splitlines() if x.startswith(row["name"]))
    assert "SPEC ACCEPTED" in table
    assert f'{row["num_spec_accepted_tokens"]}/{row["num_spec_draft_tokens"]} (' in line, table
    # by position in a row's proposals: they add up to the totals, and the table says them
    assert sum(row["spec_draft_tokens_per_position"]) == row["num_spec_draft_tokens"]
    assert sum(row["spec_accepted_tokens_per_position"]) == row["num_spec_accepted_tokens"]
    assert f'{row["name"]}: speculative acceptance by position ' in table, table
