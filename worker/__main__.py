"""`python -m infer_cluster.worker --coordinator tcp://HOST:PORT [engine options]`: start one replica.

Owns: the replica's command line (argparse; the flags mirror `EngineConfig` fields one to one,
`--block-size 16`, `--enable-prefix-caching/--no-enable-prefix-caching`, so `infer-cluster serve`
can forward its engine flags unchanged) and logging setup. The work is in
`worker.replica_main.run_replica`. `infer-cluster replica` is the same thing behind the main CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.serving.replica_main import run_replica
from infer_cluster.worker.serving.server import ServerConfig


def _list_of_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def engine_flag_type(field: dataclasses.Field):
    """Map an `EngineConfig` field's annotation to a parser type (bool means a flag pair)."""
    t = str(field.type)
    if "bool" in t:
        return bool
    if "list" in t:
        return _list_of_ints
    if "int" in t:
        return int
    if "float" in t:
        return float
    return str


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m infer_cluster.worker",
        description="Start one infer-cluster replica: load the engine, register with the "
                    "coordinator, serve until SIGTERM (drains first) or SHUTDOWN.")
    p.add_argument("--coordinator", default="tcp://127.0.0.1:5556",
                   help="the coordinator's replica address (its --port + 1 by default)")
    p.add_argument("--name", default=None,
                   help="replica name in logs and `infer-cluster status` (default: host-pid)")
    p.add_argument("--heartbeat-interval", type=float, default=0.5,
                   help="seconds between heartbeats until the coordinator sets it")
    p.add_argument("--coordinator-timeout", type=float, default=10.0,
                   help="coordinator silent this long: drop requests and register again")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, wait this long for in-flight requests before exiting")
    p.add_argument("--auth", default=os.environ.get("INFER_CLUSTER_AUTH") or None, metavar="DIR",
                   help="CURVE key folder holding the replica keypair (from `infer-cluster "
                        "keygen`, full or `--export replica`); env INFER_CLUSTER_AUTH")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    engine = p.add_argument_group("engine options (EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = engine_flag_type(f)
        if kind is bool:
            engine.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            engine.add_argument(flag, type=kind, default=f.default, metavar=f.name.upper())
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    name = args.name or f"replica-{socket.gethostname()}-{os.getpid()}"
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [{name}] %(message)s")
    try:
        server_config = ServerConfig(coordinator=args.coordinator, name=name,
                                     heartbeat_interval=args.heartbeat_interval,
                                     coordinator_timeout=args.coordinator_timeout,
                                     drain_timeout=args.drain_timeout, auth=args.auth)
        if args.auth:
            from infer_cluster.client.auth import load_keys
            load_keys(args.auth).pick_role(("replica",))  # fail now, not after loading the model
    except ValueError as exc:  # AuthError is a ValueError
        logging.error("bad option: %s", exc)
        return 2
    engine_options = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}
    return run_replica(server_config, engine_options)


if __name__ == "__main__":
    sys.exit(main())
