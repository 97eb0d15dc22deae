"""CURVE authentication with real processes and real keys on loopback.

One cluster (coordinator + 1 replica, both started with keys from `infer-cluster keygen`) serves
every test here. Peers without an accepted key (no key, keys of another cluster, the client key
on the replica port) must get nothing: no reply, no registration, no request; a client key must
not pause or shut down replicas; and the cluster must keep serving throughout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time

import pytest
import zmq

from infer_cluster.client import AsyncInferenceClient, InferenceClient
from infer_cluster.client.auth import curve_client, load_keys
from infer_cluster.protocol import SamplingParams, UnreachableError, codec
from infer_cluster.protocol.messages import ClientHello, Hello, ReplicaCapacity

from .conftest import REPO, ClusterProcs, child_env, free_port, spawn, stop_process

pytestmark = pytest.mark.timeout(240)

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("INFER_CLUSTER_AUTH", None)
    return subprocess.run([sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    full, other = str(root / "full"), str(root / "other")
    for args in (["keygen", full], ["keygen", other]):
        assert cli(*args).returncode == 0
    out = {"full": full, "other": other}
    for role in ("client", "admin", "replica"):
        out[role] = str(root / role)
        r = cli("keygen", full, "--export", role, out[role])
        assert r.returncode == 0, r.stderr
    # The cluster's client keypair posing as a replica keypair: a valid key, the wrong role.
    out["client_as_replica"] = str(root / "client_as_replica")
    os.makedirs(out["client_as_replica"])
    for src, dst in (("client.key", "replica.key"), ("client.key_secret", "replica.key_secret"),
                     ("coordinator.key", "coordinator.key")):
        shutil.copy(os.path.join(out["client"], src), os.path.join(out["client_as_replica"], dst))
    return out


@pytest.fixture(scope="module")
def cluster(keys, tmp_path_factory):
    procs = ClusterProcs(tmp_path_factory.mktemp("auth-cluster"), num_replicas=1,
                         coordinator_args=["--auth", keys["full"]],
                         replica_args=["--auth", keys["replica"]], auth=keys["admin"])
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


def _serves(cluster, auth) -> None:
    with InferenceClient(cluster.address, auth=auth) as c:
        outs = c.generate(["hello", [11, 12, 13]], PARAMS, timeout=60)
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert all(len(o.token_ids) == 6 for o in outs)


def test_exported_keys_work_and_key_folders_are_minimal(cluster, keys):
    assert sorted(os.listdir(keys["client"])) == ["client.key", "client.key_secret", "coordinator.key"]
    assert oct(os.stat(os.path.join(keys["client"], "client.key_secret")).st_mode & 0o777) == "0o600"
    assert load_keys(keys["client"]).secret.keys() == {"client"}
    _serves(cluster, keys["client"])
    _serves(cluster, keys["full"])

    async def through_asyncio():
        async with AsyncInferenceClient(cluster.address, auth=keys["client"]) as c:
            return await c.generate(["hello"], PARAMS)
    assert [len(o.token_ids) for o in asyncio.run(through_asyncio())] == [6]


@pytest.mark.parametrize("who", ["no key", "another cluster's keys"])
def test_client_without_accepted_key_gets_a_clear_error_fast(cluster, keys, who):
    auth = None if who == "no key" else keys["other"]
    started = time.monotonic()
    with InferenceClient(cluster.address, auth=auth, connect_timeout=2.0) as c:
        handle = c.submit("hello", PARAMS)
        with pytest.raises(UnreachableError) as info:
            handle.result(timeout=10)
        with pytest.raises(UnreachableError):
            c.status(timeout=10)
    assert time.monotonic() - started < 6
    message = str(info.value)
    assert ("requires authentication" in message if auth is None
            else "coordinator key" in message), message
    _serves(cluster, keys["client"])  # the cluster kept serving


def test_raw_peer_without_curve_gets_no_reply(cluster, keys):
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 200)
        sock.connect(cluster.address)
        # The coordinator's CURVE handshake drops this peer's connection, and zmq
        # reconnects; between the two there is no pipe to queue on (zmq.Again).
        # Retry until the frame is queued on one attempt.
        frame = [b"", codec.encode(ClientHello(client_name="intruder"))]
        deadline, sent = time.monotonic() + 10, False
        while not sent and time.monotonic() < deadline:
            try:
                sock.send_multipart(frame)
                sent = True
            except zmq.Again:
                pass
        assert sent, "the raw DEALER never had a pipe to queue its frame on"
        assert sock.poll(1500) == 0  # nothing comes back
    finally:
        ctx.destroy(linger=0)
    assert cluster.status()["coordinator"]["num_bad_frames"] == 0  # no frame got through


def test_client_key_cannot_control_admin_key_can(cluster, keys):
    with InferenceClient(cluster.address, auth=keys["client"]) as c:
        reply = c.control("shutdown", timeout=10)
        assert not reply["ok"] and "admin key" in reply["message"]
        assert c.control("pause", timeout=10)["ok"] is False
        total = cluster.status()["replicas"][0]["num_total_blocks"]
        resize = c.resize("replica-0", num_kv_blocks=total + 64, timeout=10)
        assert not resize["ok"] and "admin key" in resize["message"]
    st = cluster.status()
    assert st["replicas"][0]["num_total_blocks"] == total  # the refused resize changed nothing
    assert [r["state"] for r in st["replicas"]] == ["active"]
    assert cluster.replicas[0].poll() is None
    r = cli("control", "shutdown", "--address", cluster.address, "--auth", keys["client"])
    assert r.returncode == 1 and "admin key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("control", "drain", "--address", cluster.address)  # no key at all
    assert r.returncode == 1 and "requires authentication" in r.stderr
    assert cluster.replicas[0].poll() is None
    with InferenceClient(cluster.address, auth=keys["admin"]) as admin:
        assert admin.control("pause", timeout=10)["ok"]
        assert admin.control("resume", timeout=10)["ok"]
        grown = admin.resize("replica-0", num_kv_blocks=total + 64, timeout=30)
        assert grown["ok"] and grown["capacity"]["num_total_blocks"] == total + 64, grown
        assert admin.resize("replica-0", num_kv_blocks=total, timeout=30)["ok"]
    _serves(cluster, keys["client"])


def _fake_replica(ctx, address, auth_dir=None, role="client"):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"fake-replica")
    if auth_dir:
        curve_client(sock, load_keys(auth_dir), role)
    sock.connect(address)
    hello = Hello(replica_name="fake", capacity=ReplicaCapacity(
        model="tiny-random", num_total_blocks=100000, block_size=16, max_num_seqs=1024,
        max_model_len=4096), pid=1, host="evil")
    for _ in range(3):
        try:
            sock.send_multipart([b"", codec.encode(hello)], zmq.NOBLOCK)
        except zmq.Again:
            pass
    return sock


def test_fake_replicas_without_the_replica_key_never_receive_a_request(cluster, keys):
    replica_address = f"tcp://127.0.0.1:{cluster.replica_port}"
    ctx = zmq.Context()
    try:
        fakes = [_fake_replica(ctx, replica_address),                      # no key
                 _fake_replica(ctx, replica_address, keys["client"]),      # client key
                 _fake_replica(ctx, replica_address, keys["admin"], "admin"),
                 _fake_replica(ctx, replica_address, keys["other"], "replica")]  # other cluster
        time.sleep(1.0)
        st = cluster.status()
        assert st["coordinator"]["num_replicas"] == 1
        assert [r["name"] for r in st["replicas"]] == ["replica-0"]
        with InferenceClient(cluster.address, auth=keys["client"]) as c:
            outs = c.generate([f"secret prompt {i}" for i in range(8)], PARAMS, timeout=60)
        assert all(o.finish_reason == "length" for o in outs)
        assert all(f.poll(200) == 0 for f in fakes)  # not a byte reached any of them
    finally:
        ctx.destroy(linger=0)


def test_real_replica_with_a_client_key_is_refused_and_exits(cluster, keys, tmp_path):
    proc = spawn([sys.executable, "-m", "infer_cluster.worker", "--coordinator",
                  f"tcp://127.0.0.1:{cluster.replica_port}", "--name", "impostor",
                  "--auth", keys["client_as_replica"], "--model", "tiny-random",
                  "--num-kv-blocks", "64"], tmp_path / "impostor.log")
    try:
        assert proc.wait(90) == 1
    finally:
        stop_process(proc)
    log = (tmp_path / "impostor.log").read_text()
    assert "refused this replica's key" in log
    assert cluster.status()["coordinator"]["num_replicas"] == 1
    _serves(cluster, keys["client"])


def test_non_loopback_bind_needs_auth_or_insecure(keys, tmp_path):
    port = free_port()
    for cmd in ("coordinator", "serve"):
        r = cli(cmd, "--host", "0.0.0.0", "--port", str(port), timeout=20)
        assert r.returncode == 1 and "Traceback" not in r.stderr
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and "--auth" in line and "--insecure" in line, line
    for extra in (["--insecure"], ["--auth", keys["full"]]):
        proc = spawn([sys.executable, "-m", "infer_cluster", "coordinator", "--host", "0.0.0.0",
                      "--port", str(port), "--replica-port", str(free_port()), *extra],
                     tmp_path / "coord.log")
        try:
            time.sleep(1.5)
            assert proc.poll() is None, (tmp_path / "coord.log").read_text()
        finally:
            stop_process(proc)
