"""CURVE keys for every side of the cluster: the key folder, loading it, keys onto sockets.

Owns: the key folder layout (one zmq certificate pair per role, written by
`zmq.auth.create_certificates`: `ROLE.key` holds the public key, `ROLE.key_secret` both), loading
a full or an exported folder into `AuthKeys`, and the socket options for the CURVE client side
(`curve_client`) and server side (`curve_server`). The coordinator's ZAP handler that accepts or
refuses peers lives in `coordinator/auth.py`; this module has no policy beyond "which role's keys
does this process need". It lives in `client/` because the client may import only protocol and
zmq; the coordinator, the replicas and the CLI import it from here. Never imports torch, never
does crypto itself: libzmq's CURVE mechanism does all of it.

Roles: `coordinator` (the server key), `client` (submit, status), `admin` (also pause / resume /
drain / shutdown), `replica` (registers on the replica port). A full folder has all four
keypairs; an exported folder (`infer-cluster keygen DIR --export ROLE OUT`) has one role's
keypair and the coordinator's public key only.

To add a role: add it to `ROLES` (and `CLIENT_PORT_ROLES` if it may use the client port); the
coordinator's ZAP handler then reports it as the connection's User-Id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Union

import zmq
import zmq.auth

ROLES = ("coordinator", "client", "replica", "admin")
PEER_ROLES = ("client", "replica", "admin")   # roles `keygen --export` hands out
CLIENT_PORT_ROLES = ("client", "admin")       # keys the client port accepts
REPLICA_PORT_ROLES = ("replica",)             # keys the replica port accepts
ENV_VAR = "INFER_CLUSTER_AUTH"


class AuthError(ValueError):
    """The key folder is missing, incomplete for this role, or unreadable. The message names
    the folder and the fix."""


@dataclass
class AuthKeys:
    """The keys one process loaded: every role's public key it found, and the secret keys."""

    directory: str
    public: dict[str, bytes] = field(default_factory=dict)   # role -> z85 public key
    secret: dict[str, bytes] = field(default_factory=dict)   # role -> z85 secret key

    def pick_role(self, preferred: tuple[str, ...]) -> str:
        """The first role in `preferred` whose secret key is here; AuthError if none is."""
        for role in preferred:
            if role in self.secret:
                return role
        raise AuthError(f"{self.directory} has no secret key for {' or '.join(preferred)} "
                        f"(no {preferred[0]}.key_secret); export one with `infer-cluster keygen "
                        f"FULL_DIR --export {preferred[0]} OUT`")

    def need_public(self, role: str) -> bytes:
        if role not in self.public:
            raise AuthError(f"{self.directory} has no {role}.key (the {role}'s public key); "
                            "use the folder made by `infer-cluster keygen` or one it exported")
        return self.public[role]

    def keys_of(self, roles: tuple[str, ...]) -> dict[bytes, str]:
        """z85 public key -> role, for the roles a socket accepts."""
        return {self.need_public(r): r for r in roles}


AuthArg = Union[None, str, os.PathLike, AuthKeys]


def load_keys(directory: Union[str, os.PathLike]) -> AuthKeys:
    """Read every `ROLE.key` / `ROLE.key_secret` in `directory` (full or exported folder)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise AuthError(f"auth folder {directory!r} does not exist; create one with "
                        f"`infer-cluster keygen {directory}`")
    keys = AuthKeys(directory=directory)
    for role in ROLES:
        for suffix in (".key_secret", ".key"):
            path = os.path.join(directory, role + suffix)
            if not os.path.isfile(path):
                continue
            try:
                public, secret = zmq.auth.load_certificate(path)
            except (OSError, ValueError) as exc:
                raise AuthError(f"cannot read key file {path}: {exc}") from None
            if keys.public.setdefault(role, public) != public:
                raise AuthError(f"{role}.key and {role}.key_secret in {directory} hold different "
                                "public keys; run `infer-cluster keygen` again")
            if secret:
                keys.secret[role] = secret
    if not keys.public:
        raise AuthError(f"{directory} holds no infer-cluster keys (expected files like "
                        f"coordinator.key); create them with `infer-cluster keygen {directory}`")
    for role, secret in keys.secret.items():
        if zmq.curve_public(secret) != keys.public[role]:
            raise AuthError(f"{role}.key and {role}.key_secret in {directory} do not belong "
                            "together; run `infer-cluster keygen` again")
    return keys


def resolve(auth: AuthArg) -> Optional[AuthKeys]:
    """`auth` as given by a caller (None, a folder, or loaded keys) -> AuthKeys or None."""
    if auth is None or auth == "":
        return None
    if isinstance(auth, AuthKeys):
        return auth
    return load_keys(auth)


def curve_client(sock: zmq.Socket, keys: AuthKeys, role: str) -> None:
    """Make `sock` (before connect) a CURVE client with `role`'s keypair that trusts only the
    coordinator's public key."""
    if not zmq.has("curve"):
        raise AuthError("this libzmq was built without CURVE support; install pyzmq from PyPI")
    sock.curve_secretkey = keys.secret[role]
    sock.curve_publickey = keys.public[role]
    sock.curve_serverkey = keys.need_public("coordinator")


def curve_server(sock: zmq.Socket, keys: AuthKeys, zap_domain: str) -> None:
    """Make `sock` (before bind) a CURVE server with the coordinator's keypair; each peer is
    checked by the ZAP handler registered for `zap_domain`."""
    if "coordinator" not in keys.secret:
        raise AuthError(f"{keys.directory} has no coordinator.key_secret: the coordinator needs "
                        "the full folder made by `infer-cluster keygen`")
    sock.curve_secretkey = keys.secret["coordinator"]
    sock.curve_publickey = keys.public["coordinator"]
    sock.curve_server = True
    sock.zap_domain = zap_domain.encode()
