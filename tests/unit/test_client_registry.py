"""`ClientRegistry`'s memory of gone clients: the ids a client lost come back once, to that
client only, within `GONE_TTL_S`; the memory is bounded by `MAX_GONE` (oldest forgotten first)."""

from infer_cluster.coordinator import clients as clients_mod
from infer_cluster.coordinator.clients import GONE_TTL_S, ClientRegistry


def test_lost_ids_come_back_once_to_their_client():
    reg = ClientRegistry()
    reg.remember_gone(b"a", ["r1", "r2"], "silent for 5.0 s", now=100.0)
    reg.remember_gone(b"b", [], "silent", now=100.0)  # nothing lost: nothing to remember
    assert reg.num_gone() == 1
    assert reg.take_gone(b"b", now=101.0) is None
    assert reg.take_gone(b"a", now=130.0) == (["r1", "r2"], "silent for 5.0 s", 30.0)
    assert reg.take_gone(b"a", now=131.0) is None
    assert reg.num_gone() == 0


def test_a_second_loss_adds_to_the_first():
    reg = ClientRegistry()
    reg.remember_gone(b"a", ["r1"], "silent", now=1.0)
    reg.remember_gone(b"a", ["r2"], "send queue full", now=2.0)
    assert reg.take_gone(b"a", now=3.0) == (["r1", "r2"], "send queue full", 1.0)


def test_old_entries_expire():
    reg = ClientRegistry()
    reg.remember_gone(b"old", ["r1"], "silent", now=0.0)
    reg.remember_gone(b"new", ["r2"], "silent", now=GONE_TTL_S)
    assert reg.take_gone(b"old", now=GONE_TTL_S + 1.0) is None
    assert reg.take_gone(b"new", now=GONE_TTL_S + 1.0) == (["r2"], "silent", 1.0)


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(clients_mod, "MAX_GONE", 3)
    reg = ClientRegistry()
    for i in range(5):
        reg.remember_gone(bytes([i]), [f"r{i}"], "silent", now=float(i))
    assert reg.num_gone() == 3
    assert reg.take_gone(bytes([0]), now=5.0) is None and reg.take_gone(bytes([1]), now=5.0) is None
    assert reg.take_gone(bytes([4]), now=5.0) == (["r4"], "silent", 1.0)
