"""Speculative decoding's counters from the engine to the operator: `stats()` (zeros when off),
the replica's heartbeat load (`ReplicaLoad`, through the codec), `infer-cluster status` rows
and the Prometheus families, the totals and the same by position in a row's proposals."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infer_cluster.coordinator.registry import ReplicaRecord
from infer_cluster.gateway.cluster_metrics import ClusterCollector
from infer_cluster.protocol import SamplingParams, codec
from infer_cluster.protocol.messages import Heartbeat, ReplicaCapacity
from infer_cluster.worker import LLM
from infer_cluster.worker.serving.server import EngineServer

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
        "adaptive": False}
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_stats_keys_off_and_on():
    off = LLM("tiny-random", num_kv_blocks=32).stats()
    assert (off["num_spec_draft_tokens"], off["num_spec_accepted_tokens"]) == (0, 0)
    assert off["spec_acceptance_per_position"] == []
    llm = LLM("tiny-random", num_kv_blocks=32, speculative_config=SPEC)
    llm.generate([[7, 8, 9] * 6], GREEDY, use_tqdm=False)
    s = llm.stats()
    assert s["num_spec_draft_tokens"] >= s["num_spec_accepted_tokens"] > 0
    rates = s["spec_acceptance_per_position"]
    assert len(rates) == 3 and all(0.0 <= r <= 1.0 for r in rates) and rates[0] > 0


def test_counters_reach_status_and_prometheus():
    llm = LLM("tiny-random", num_kv_blocks=32, speculative_config=SPEC)
    llm.generate([[7, 8, 9] * 6, [4, 5] * 9], GREEDY, use_tqdm=False)
    stats = llm.stats()
    load = EngineServer._read_load(SimpleNamespace(engine=llm.engine))  # the heartbeat's load
    sent = codec.decode(codec.encode(Heartbeat(state="active", load=load))).load
    assert (sent.num_spec_draft_tokens, sent.num_spec_accepted_tokens) == (
        stats["num_spec_draft_tokens"], stats["num_spec_accepted_tokens"])
    record = ReplicaRecord(b"k", "r0", ReplicaCapacity(model="tiny-random"), 0, load=sent)
    row = record.status_row(now=0.0)
    assert row["num_spec_accepted_tokens"] == stats["num_spec_accepted_tokens"] > 0
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: {"coordinator": {}, "replicas": [row]}))
    samples = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples if s.labels.get("replica") == "r0"}
    assert samples["infer_cluster_replica_spec_draft_tokens_total"] == stats["num_spec_draft_tokens"]
    assert samples["infer_cluster_replica_spec_accepted_tokens_total"] == stats["num_spec_accepted_tokens"]
    # by position in a row's proposals (label `position`, from 1), adding up to the totals
    drafted, accepted = stats["spec_draft_tokens_per_position"], stats["spec_accepted_tokens_per_position"]
    assert len(drafted) == len(accepted) == 3 and sum(drafted) == stats["num_spec_draft_tokens"]
    assert (sent.spec_draft_tokens_per_position, sent.spec_accepted_tokens_per_position) == (drafted, accepted)
    by_position = {(s.name, s.labels["position"]): s.value
                   for f in text_string_to_metric_families(generate_latest(registry).decode())
                   for s in f.samples if s.labels.get("replica") == "r0" and "position" in s.labels}
    for j in range(3):
        assert by_position[("infer_cluster_replica_spec_draft_tokens_by_position_total", str(j + 1))] == drafted[j]
        assert by_position[("infer_cluster_replica_spec_accepted_tokens_by_position_total", str(j + 1))] == accepted[j]
    assert [a / d if d else 0.0 for a, d in zip(accepted, drafted)] == stats["spec_acceptance_per_position"]
