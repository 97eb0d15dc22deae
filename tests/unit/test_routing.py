"""Routing policies, tested with plain objects (no sockets)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from infer_cluster.coordinator.routing import (ROUTING_POLICIES, LeastLoadPolicy, PrefixAffinityPolicy,
                                 RoundRobinPolicy, RoutingInfo, make_policy, prefix_chain_hashes)


@dataclass
class R:
    key: str
    outstanding_tokens: int = 0
    num_requests: int = 0


def test_registry_names():
    assert set(ROUTING_POLICIES) == {"least-load", "prefix", "round-robin"}
    assert isinstance(make_policy("prefix"), PrefixAffinityPolicy)
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        make_policy("fastest")


def test_least_load_picks_fewest_outstanding_tokens():
    p = LeastLoadPolicy()
    reps = [R("a", 500), R("b", 20), R("c", 300)]
    assert p.choose(reps, RoutingInfo(prompt="x")).key == "b"


def test_least_load_spreads_a_burst_when_charged():
    p = LeastLoadPolicy()
    reps = [R("a"), R("b"), R("c")]
    counts = {"a": 0, "b": 0, "c": 0}
    for _ in range(30):
        r = p.choose(reps, RoutingInfo(prompt="x", num_tokens=10))
        r.outstanding_tokens += 10  # the dispatcher charges the chosen replica
        counts[r.key] += 1
    assert counts == {"a": 10, "b": 10, "c": 10}


def test_least_load_weighs_load_by_kv_capacity():
    """A replica with twice the KV pool (e.g. after `control resize`) takes twice the work."""
    p = LeastLoadPolicy()
    big, small = R("big"), R("small")
    big.kv_capacity_tokens, small.kv_capacity_tokens = 2048, 1024
    counts = {"big": 0, "small": 0}
    for _ in range(30):
        r = p.choose([big, small], RoutingInfo(prompt="x", num_tokens=10))
        r.outstanding_tokens += 10
        counts[r.key] += 1
    assert counts == {"big": 20, "small": 10}
    small.kv_capacity_tokens = 2048  # resized to match: plain least-load again
    assert p.choose([big, small], RoutingInfo(prompt="x")).key == "small"


def test_least_load_ties_rotate():
    p = LeastLoadPolicy()
    reps = [R("a"), R("b")]
    picks = {p.choose(reps, RoutingInfo()).key for _ in range(4)}
    assert picks == {"a", "b"}


def test_round_robin_cycles():
    p = RoundRobinPolicy()
    reps = [R("a", 1000), R("b"), R("c")]
    assert [p.choose(reps, RoutingInfo()).key for _ in range(6)] == ["a", "b", "c"] * 2


def test_empty_candidates_is_an_error():
    for cls in ROUTING_POLICIES.values():
        with pytest.raises(ValueError):
            cls().choose([], RoutingInfo())


def test_chain_hashes_share_exactly_the_common_prefix():
    a = RoutingInfo(prompt_token_ids=list(range(64)))
    b = RoutingInfo(prompt_token_ids=list(range(40)) + [999] * 24)
    ha = prefix_chain_hashes(a, 16, 64, 32)
    hb = prefix_chain_hashes(b, 16, 64, 32)
    assert len(ha) == 4 and len(hb) == 4
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert prefix_chain_hashes(RoutingInfo(prompt_token_ids=[1, 2]), 16, 64, 32) == []
    text = prefix_chain_hashes(RoutingInfo(prompt="x" * 130), 16, 64, 32)
    assert len(text) == 2


def test_prefix_affinity_sticks_to_the_replica_that_saw_the_prefix():
    p = PrefixAffinityPolicy(chunk_chars=8, imbalance_slack_tokens=100)
    reps = [R("a"), R("b")]
    shared = "system prompt: you are helpful. "
    first = p.choose(reps, RoutingInfo(prompt=shared + "question one"))
    first.outstanding_tokens += 10
    for i in range(5):
        again = p.choose(reps, RoutingInfo(prompt=shared + f"another question {i}"))
        assert again.key == first.key
    assert p.num_affinity_hits == 5


def test_prefix_affinity_falls_back_to_load_when_imbalanced():
    p = PrefixAffinityPolicy(chunk_chars=8, imbalance_ratio=1.5, imbalance_slack_tokens=50)
    a, b = R("a"), R("b")
    owner = p.choose([a, b], RoutingInfo(prompt="shared prefix text " * 4))
    other = b if owner is a else a
    owner.outstanding_tokens = 1000
    other.outstanding_tokens = 100
    assert p.choose([a, b], RoutingInfo(prompt="shared prefix text " * 4)).key == other.key


def test_prefix_forget_drops_a_dead_replica():
    p = PrefixAffinityPolicy(chunk_chars=8)
    a, b = R("a"), R("b")
    owner = p.choose([a, b], RoutingInfo(prompt="abcdefgh" * 4))
    p.forget(owner.key)
    assert owner.key not in p._owner.values()
    # the survivor takes it and keeps it
    survivor = b if owner is a else a
    assert p.choose([survivor], RoutingInfo(prompt="abcdefgh" * 4)).key == survivor.key


def test_prefix_table_is_bounded():
    p = PrefixAffinityPolicy(chunk_chars=4, max_entries=10)
    reps = [R("a")]
    for i in range(50):
        p.choose(reps, RoutingInfo(prompt=f"{i:04d}" * 3))
    assert len(p._owner) == 10
