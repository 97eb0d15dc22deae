"""The coordinator's ZAP handler: which public keys may connect to which port, and as whom.

Owns: one `zmq.auth.thread.ThreadAuthenticator` per coordinator context, with one ZAP domain per
ROUTER socket (`CLIENT_DOMAIN`: client and admin keys; `REPLICA_DOMAIN`: the replica key only),
and the key -> role mapping that libzmq hands back on every received frame as its `User-Id`
property (`frame.get("User-Id")`). A peer whose key is not accepted fails the CURVE handshake:
it never gets a frame through, so no reply, no registration. Authorization by role (only
`admin` may send control actions) is checked per message in `server.py`; this module only
authenticates. Never imports torch; never does crypto itself (libzmq's CURVE does).

To accept a new role on a port: add it to the role tuples in `client/auth.py`.
"""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from infer_cluster.client.auth import CLIENT_PORT_ROLES, REPLICA_PORT_ROLES, AuthKeys

log = logging.getLogger("infer_cluster.coordinator")

CLIENT_DOMAIN = "infer-cluster-clients"
REPLICA_DOMAIN = "infer-cluster-replicas"


class _AllowedKeys:
    """pyzmq's credentials-provider interface: `callback(domain, z85_key) -> bool`."""

    def __init__(self, keys: dict[bytes, str]):
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key in self.keys
        if not allowed:
            log.warning("refused a connection to %s: unknown CURVE key %s",
                        "the replica port" if domain == REPLICA_DOMAIN else "the client port",
                        key[:8].decode(errors="replace") + "...")
        return allowed


class RoleAuthenticator(ThreadAuthenticator):
    """A ZAP handler whose User-Id for an accepted CURVE key is that key's role."""

    def __init__(self, context: zmq.Context, keys: AuthKeys):
        super().__init__(context)
        self._roles: dict[bytes, str] = {}
        self._domains = {CLIENT_DOMAIN: keys.keys_of(CLIENT_PORT_ROLES),
                         REPLICA_DOMAIN: keys.keys_of(REPLICA_PORT_ROLES)}
        for domain, allowed in self._domains.items():
            self._roles.update(allowed)
            self.configure_curve_callback(domain, _AllowedKeys(allowed))

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._roles.get(z85.encode(client_public_key), "unknown")
