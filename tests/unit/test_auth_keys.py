"""Key folders, address checks and the loopback rule: the pure parts of authentication.

The key files are real (written by `zmq.auth.create_certificates`, as `infer-cluster keygen`
does); the end-to-end behaviour with processes is in tests/integration/test_auth.py.
"""

from __future__ import annotations

import os
import shutil

import pytest
import zmq.auth

from infer_cluster.client.auth import AuthError, load_keys, resolve
from infer_cluster.client.io_thread import check_address
from infer_cluster.coordinator.config import CoordinatorConfig, is_loopback


@pytest.fixture()
def full(tmp_path):
    for role in ("coordinator", "client", "replica", "admin"):
        zmq.auth.create_certificates(tmp_path, role)
    return tmp_path


def test_full_folder_loads_every_role(full):
    keys = load_keys(full)
    assert set(keys.secret) == set(keys.public) == {"coordinator", "client", "replica", "admin"}
    assert keys.pick_role(("client", "admin")) == "client"
    assert keys.pick_role(("admin", "client")) == "admin"
    assert keys.keys_of(("client", "admin")) == {keys.public["client"]: "client",
                                                keys.public["admin"]: "admin"}
    assert resolve(None) is None and resolve(keys) is keys


def test_exported_folder_has_one_secret_and_refuses_other_roles(full, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    for name in ("replica.key", "replica.key_secret", "coordinator.key"):
        shutil.copy(full / name, out / name)
    keys = load_keys(out)
    assert set(keys.secret) == {"replica"} and set(keys.public) == {"replica", "coordinator"}
    with pytest.raises(AuthError, match="no secret key for client"):
        keys.pick_role(("client", "admin"))
    with pytest.raises(AuthError, match="no admin.key"):
        keys.need_public("admin")


def test_bad_folders_name_the_problem(full, tmp_path_factory):
    with pytest.raises(AuthError, match="does not exist"):
        load_keys(full / "missing")
    with pytest.raises(AuthError, match="holds no infer-cluster keys"):
        load_keys(tmp_path_factory.mktemp("empty"))
    other = tmp_path_factory.mktemp("other")
    zmq.auth.create_certificates(other, "client")
    os.replace(other / "client.key", full / "client.key")  # public key of another pair
    with pytest.raises(AuthError, match="different public keys"):
        load_keys(full)
    zmq.auth.create_certificates(full, "client")  # a consistent pair again
    (full / "admin.key_secret").write_text("curve\n    nothing here\n")
    with pytest.raises(AuthError, match="cannot read key file"):
        load_keys(full)


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("*", False), ("10.0.0.5", False), ("::", False), ("head-node", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_non_loopback_bind_needs_auth_or_insecure():
    with pytest.raises(ValueError, match="--insecure"):
        CoordinatorConfig(host="0.0.0.0")
    CoordinatorConfig(host="0.0.0.0", insecure=True)
    CoordinatorConfig(host="0.0.0.0", auth="/some/keys")  # the folder is read by the server
    CoordinatorConfig(host="127.0.0.1")


@pytest.mark.parametrize("address, ok", [
    ("tcp://127.0.0.1:5555", True), ("tcp://head-node:1", True), ("tcp://[::1]:5555", True),
    ("ipc:///tmp/sock", True), ("localhost:5555", False), ("tcp://127.0.0.1", False),
    ("tcp://127.0.0.1:0", False), ("tcp://127.0.0.1:65536", False), ("tcp://:5555", False),
    ("http://127.0.0.1:5555", False), ("tcp://a b:5555", False)])
def test_check_address(address, ok):
    if ok:
        assert check_address(address) == address
    else:
        with pytest.raises(ValueError, match="bad address"):
            check_address(address)
