"""`infer-cluster keygen`: make the cluster's CURVE keys, and export what one user or host needs.

Owns: writing the key folder (`zmq.auth.create_certificates`, one keypair per role in
`client.auth.ROLES`; secrets 0600, folder 0700) and exporting one role's keypair with the
coordinator's public key. Never generates or handles key material itself beyond copying files
that libzmq wrote; never imports torch.

To add a role: add it to `client/auth.py`; keygen writes every role listed there.
"""

from __future__ import annotations

import os
import shutil

import click
import zmq.auth

from infer_cluster.client.auth import PEER_ROLES, ROLES, AuthError, load_keys

from .cli_options import CliError


def _prepare_dir(path: str, force: bool) -> None:
    existing = [n for n in os.listdir(path) if n.endswith((".key", ".key_secret"))] \
        if os.path.isdir(path) else []
    if existing and not force:
        raise CliError(f"error: {path} already holds keys ({', '.join(sorted(existing)[:3])}...); "
                       "pass --force to replace them (every host then needs the new keys)")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise CliError(f"error: cannot create {path}: {exc.strerror}") from None


def _protect(path: str, role: str) -> None:
    os.chmod(os.path.join(path, f"{role}.key"), 0o644)
    secret = os.path.join(path, f"{role}.key_secret")
    if os.path.exists(secret):
        os.chmod(secret, 0o600)


@click.command()
@click.argument("directory", metavar="DIR")
@click.option("--export", "export", nargs=2, default=None, metavar="ROLE OUT",
              help=f"write to OUT only what ROLE ({', '.join(PEER_ROLES)}) needs: its keypair and "
                   "the coordinator's public key")
@click.option("--force", is_flag=True, help="replace keys that are already there")
def keygen(directory, export, force):
    """Create CURVE keypairs for the coordinator, clients, replicas and an admin in DIR.

    Start the cluster with `--auth DIR` (serve / coordinator; replicas and clients may use DIR
    too on a single host). For other hosts and users, `keygen DIR --export ROLE OUT` writes a
    folder with only that role's keypair and the coordinator's public key: hand `client` to
    users, `replica` to replica hosts, `admin` to operators (pause / resume / drain / shutdown).
    Secret files are written 0600; keep them so.
    """
    if export is not None:
        _export(directory, export[0], export[1], force)
        return
    _prepare_dir(directory, force)
    for role in ROLES:
        zmq.auth.create_certificates(directory, role)
        _protect(directory, role)
    click.echo(f"wrote keypairs for {', '.join(ROLES)} to {directory}; start the cluster with "
               f"--auth {directory}, export a role for others with `infer-cluster keygen "
               f"{directory} --export client OUT`")


def _export(directory: str, role: str, out: str, force: bool) -> None:
    if role not in PEER_ROLES:
        raise CliError(f"error: --export ROLE must be one of {', '.join(PEER_ROLES)}, got {role!r}")
    try:
        keys = load_keys(directory)
        keys.pick_role((role,))
        keys.need_public("coordinator")
    except AuthError as exc:
        raise CliError(f"error: {exc}") from None
    if os.path.abspath(out) == os.path.abspath(directory):
        raise CliError("error: OUT must be a different folder than DIR")
    _prepare_dir(out, force)
    for name in (f"{role}.key", f"{role}.key_secret", "coordinator.key"):
        shutil.copyfile(os.path.join(directory, name), os.path.join(out, name))
    _protect(out, role)
    os.chmod(os.path.join(out, "coordinator.key"), 0o644)
    click.echo(f"wrote the {role} keypair and the coordinator's public key to {out}; use it "
               f"with --auth {out}")
