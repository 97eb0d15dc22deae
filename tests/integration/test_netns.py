"""Multi-host over network namespaces: coordinator and two replicas each in its own namespace,
joined by veth pairs; one replica's link is cut mid-load. Every request must still end exactly
once, complete and duplicate-free (equal to the offline engine).

Topology (a.b = a per-run /16 so concurrent runs do not collide):
    test process (root ns) --veth-- coordinator ns --veth-- replica A ns
                                                   --veth-- replica B ns
Skipped with a reason when namespaces cannot be created (not root, no CAP_NET_ADMIN, no `ip`).
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from .conftest import ClusterProcs, prompt_set

pytestmark = [pytest.mark.timeout(300), pytest.mark.netns]


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


class Netns:
    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.coord, self.rep_a, self.rep_b = f"icc{tag}", f"ica{tag}", f"icb{tag}"
        self.host_if = f"ich{tag}"
        octet = 100 + os.getpid() % 150
        self.net = f"10.{octet}"
        self.created: list[str] = []
        self.host_link = False

    def setup(self) -> None:
        for ns in (self.coord, self.rep_a, self.rep_b):
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        # root <-> coordinator
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", f"{self.host_if}p")
        self.host_link = True
        _ip("link", "set", f"{self.host_if}p", "netns", self.coord)
        _ip("addr", "add", f"{self.net}.3.2/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("addr", "add", f"{self.net}.3.1/24", "dev", f"{self.host_if}p", ns=self.coord)
        _ip("link", "set", f"{self.host_if}p", "up", ns=self.coord)
        # coordinator <-> each replica
        for i, ns in ((1, self.rep_a), (2, self.rep_b)):
            a, b = f"{self.host_if}c{i}", f"{self.host_if}r{i}"
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", self.coord)
            _ip("link", "set", b, "netns", ns)
            _ip("addr", "add", f"{self.net}.{i}.1/24", "dev", a, ns=self.coord)
            _ip("link", "set", a, "up", ns=self.coord)
            _ip("addr", "add", f"{self.net}.{i}.2/24", "dev", b, ns=ns)
            _ip("link", "set", b, "up", ns=ns)

    def cut(self, replica: int, up: bool = False) -> None:
        ns = self.rep_a if replica == 1 else self.rep_b
        _ip("link", "set", f"{self.host_if}r{replica}", "up" if up else "down", ns=ns)

    def teardown(self) -> None:
        for ns in self.created:
            _ip("netns", "del", ns, check=False)
        if self.host_link:
            _ip("link", "del", self.host_if, check=False)


@pytest.fixture
def netns():
    if shutil.which("ip") is None:
        pytest.skip("the `ip` tool (iproute2) is not installed")
    n = Netns()
    try:
        n.setup()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        n.teardown()
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        yield n
    finally:
        n.teardown()


def test_link_cut_mid_load_loses_nothing(netns, tmp_path, offline_reference):
    procs = ClusterProcs(
        tmp_path, num_replicas=2, host="0.0.0.0", connect_host=f"{netns.net}.3.1",
        coordinator_args=["--insecure"],  # an isolated test network: no keys needed
        coordinator_prefix=["ip", "netns", "exec", netns.coord],
        replica_prefixes=[["ip", "netns", "exec", netns.rep_a], ["ip", "netns", "exec", netns.rep_b]],
        replica_connect_hosts=[f"{netns.net}.1.1", f"{netns.net}.2.1"])
    # Lengths of 12 to 48 tokens: requests dispatched together end in four waves, so replica-0
    # still holds requests for many steps after the cut (with one length, a loaded host could
    # see its whole batch end between the last status and the cut: nothing to re-route).
    items = [(p, SamplingParams(temperature=0.0, max_tokens=12 * (1 + i % 4), ignore_eos=True))
             for i, (p, _) in enumerate(prompt_set(200, seed=4))]
    expected = offline_reference(items)
    try:
        procs.start()
        c = InferenceClient(procs.address, name="netns-test")
        finals = collections.Counter()
        tokens = collections.defaultdict(list)
        original = c._deliver

        def deliver(payload):
            tokens[payload.request_id].extend(payload.token_ids)
            finals[payload.request_id] += payload.finish_reason is not None
            original(payload)
        c._deliver = deliver
        try:
            handles = [c.submit(p, sp, request_id=f"ns-{i}") for i, (p, sp) in enumerate(items)]
            # Cut once replica-0, by the coordinator's count, has generated a request's worth of
            # tokens and still runs requests. Counting the tokens this client received cut too
            # late on a loaded host (the client lagged while both replicas had finished), and
            # waiting for a quarter of replica-0's half missed the window on an idle one (its
            # half took about as long as a few heartbeats).
            deadline = time.monotonic() + 60
            while True:
                r0 = {r["name"]: r for r in c.status()["replicas"]}.get("replica-0", {})
                if r0.get("num_requests", 0) > 0 and r0.get("num_running", 0) > 0 \
                        and r0.get("num_generated_tokens", 0) >= 24:
                    break
                assert time.monotonic() < deadline, f"replica-0 never ran mid-load: {r0}"
                time.sleep(0.01)
            streamed = sum(map(len, tokens.values()))
            netns.cut(1)
            t_cut = time.monotonic()
            outs = [h.result(timeout=200) for h in handles]
            recovery = time.monotonic() - t_cut
            status = c.status()
            # Heal the link: the replica finds it was declared dead, drops what it held,
            # registers again and takes new work.
            netns.cut(1, up=True)
            t_heal = time.monotonic()
            procs.wait_replicas(2, timeout=60)
            rejoin = time.monotonic() - t_heal
            more = c.generate([f"after heal {i}" for i in range(16)],
                              SamplingParams(temperature=0.0, max_tokens=4))
            healed = c.status()
        finally:
            c.close()
    finally:
        procs.stop()
    assert streamed < sum(len(toks) for toks, _ in expected)
    load_finals = {k: v for k, v in finals.items() if k.startswith("ns-")}
    assert len(load_finals) == 200 and set(load_finals.values()) == {1}
    for i, (o, (toks, text)) in enumerate(zip(outs, expected)):
        assert o.finish_reason == "length" and tokens[f"ns-{i}"] == o.token_ids == toks, i
        assert o.text == text, i
    co = status["coordinator"]
    assert co["num_reroutes"] > 0 and co["num_replica_deaths"] >= 1
    dead = [r for r in status["replicas"] if r["state"] == "dead"]
    assert dead and "no heartbeat" in dead[0]["death_reason"]
    assert all(o.finish_reason == "length" for o in more)
    back = [r for r in healed["replicas"] if r["name"] == "replica-0" and r["state"] == "active"]
    assert back and back[0]["num_dispatched"] > 0, healed["replicas"]
    print(f"\nlink of replica-0 cut after {streamed} tokens: {co['num_reroutes']} re-routes "
          f"({co['num_resumed']} resumed); all 200 done {recovery:.2f} s after the cut; "
          f"re-registered {rejoin:.1f} s after the link came back")
