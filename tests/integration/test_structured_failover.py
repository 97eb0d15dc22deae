"""Structured requests survive a replica's death: kill -9 of a replica while 320 JSON-schema
requests stream over the 2-replica cluster (one replica with async scheduling). The resumed
requests rebuild their grammar state from the delivered tokens on the other replica, and every
output parses, validates and equals the offline engine's. The load arrives over a few seconds
(a quarter at once, the rest at a steady pace), so the kill finds a replica mid-stream whatever
the host's speed."""

from __future__ import annotations

import collections
import json
import signal

import jsonschema
import pytest
import torch

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from tests.structured.schemas import BOUNDED

from .conftest import PacedLoad

pytestmark = pytest.mark.timeout(300)

# Requests in the load. Their outputs are short (bounded schemas, ~25 tokens each): sent at once,
# 160 and then 320 of them streamed in about a second on the 2-core CI machine, and twice the load
# ended before a heartbeat (every 0.5 s) showed a replica running any ("no replica is
# mid-stream"). So after the first quarter the rest arrive over PACE_S seconds (`PacedLoad`).
NUM = 320
PACE_S = 4.0


def test_kill_9_mid_structure_stays_valid(cluster, offline_reference):
    cluster.wait_replicas(2)
    schemas = list(BOUNDED.values())
    items = [(f"structured {i}: the quick brown fox " * (1 + i % 3),
              SamplingParams(temperature=0.0, max_tokens=80,
                             structured_outputs={"json": schemas[i % len(schemas)]}))
             for i in range(NUM)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the replicas
    try:
        expected = offline_reference.llm.generate([p for p, _ in items], [sp for _, sp in items],
                                                  use_tqdm=False)
    finally:
        torch.set_num_threads(threads)
    total = sum(len(o.token_ids) for o in expected)
    before = cluster.status()["coordinator"]
    generated = cluster.generated_tokens()
    c = InferenceClient(cluster.address, name="test-structured-failover")
    tokens = collections.defaultdict(list)
    original = c._deliver

    def deliver(payload):
        tokens[payload.request_id].extend(payload.token_ids)
        original(payload)
    c._deliver = deliver
    victim = 1
    try:
        load = PacedLoad(c, items, "so-kill-", head=NUM // 4, pace_s=PACE_S).start()
        cluster.wait_generated(generated, total * 0.1)
        victim, rows = cluster.replica_mid_stream(generated)
        streamed = sum(len(v) for v in tokens.values())
        cluster.kill_replica(victim, signal.SIGKILL)
        outs = load.results()
    finally:
        c.close()
    try:
        assert streamed < total, "the load finished before the kill"
        for i, (o, want) in enumerate(zip(outs, expected)):
            assert o.finish_reason == "stop", (i, o.finish_reason, o.text)
            jsonschema.validate(json.loads(o.text), schemas[i % len(schemas)])
            assert o.token_ids == want.token_ids, f"request {i} differs from the offline engine"
        after = cluster.status()["coordinator"]
        assert after["num_resumed"] > before["num_resumed"], \
            f"no request was resumed mid-structure (killed replica-{victim}; requests per replica {rows})"
    finally:  # the session's cluster whole again, as the other tests expect it
        if cluster.replicas[victim] is None or cluster.replicas[victim].poll() is not None:
            cluster.start_replica(victim)
        cluster.wait_replicas(2)
