"""Option groups shared by the `infer-cluster` commands.

Owns: the engine flags (one per `EngineConfig` field, generated, so new engine options appear
without edits), the coordinator flags, and forwarding given engine flags to `python -m infer_cluster.worker`.
Never imports torch (`worker.config` is torch-free by contract).
"""

from __future__ import annotations

import dataclasses

import click

from infer_cluster.worker.config import EngineConfig

from infer_cluster.coordinator.routing import ROUTING_POLICIES


class CliError(click.ClickException):
    """A one-line error for the user (no "Error:" prefix, no traceback); exit code 1."""

    def show(self, file=None) -> None:
        click.echo(self.message, err=True)


def _engine_type(f: dataclasses.Field):
    t = str(f.type)
    if "bool" in t:
        return bool
    if "list" in t:
        return str  # comma-separated integers, parsed by EngineConfig / `python -m infer_cluster.worker`
    if "int" in t:
        return int
    if "float" in t:
        return float
    return str


def engine_options(func):
    """Add one flag per `EngineConfig` field. Unset flags stay None (engine default applies)."""
    for f in reversed(dataclasses.fields(EngineConfig)):
        flag = f.name.replace("_", "-")
        kind = _engine_type(f)
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"{f.metadata.get('help', 'engine option ' + f.name)} (default: {default})"
        if kind is bool:
            func = click.option(f"--{flag}/--no-{flag}", f.name, default=None, help=help_text)(func)
        else:
            func = click.option(f"--{flag}", f.name, type=kind, default=None, help=help_text)(func)
    return func


def given_engine_options(kwargs: dict) -> dict:
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    given = {k: kwargs[k] for k in names if kwargs.get(k) is not None}
    for k in names:
        kwargs.pop(k, None)
    return given


def engine_argv(options: dict) -> list[str]:
    """Given engine options -> `python -m infer_cluster.worker` flags."""
    argv = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def coordinator_options(func):
    opts = [
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="interface to listen on (0.0.0.0 for all)"),
        click.option("--port", default=5555, show_default=True, type=int, help="client port"),
        click.option("--replica-port", default=None, type=int,
                     help="port replicas connect to [default: --port + 1]"),
        click.option("--routing", default="least-load", show_default=True,
                     type=click.Choice(sorted(ROUTING_POLICIES)), help="routing policy"),
        click.option("--max-requests", default=4096, show_default=True, type=int,
                     help="requests in flight before new ones get OverloadedError"),
        click.option("--heartbeat-interval", default=0.5, show_default=True, type=float,
                     help="seconds between replica heartbeats"),
        click.option("--replica-timeout", default=3.0, show_default=True, type=float,
                     help="a replica silent this long is dead; its requests are re-routed"),
        click.option("--client-timeout", default=4.0, show_default=True, type=float,
                     help="a client silent this long is gone; its requests are aborted"),
        click.option("--no-replica-timeout", default=10.0, show_default=True, type=float,
                     help="a request waits this long for any replica before failing"),
        click.option("--drain-timeout", default=30.0, show_default=True, type=float,
                     help="on SIGTERM, wait this long for in-flight requests"),
        click.option("--max-frame-bytes", default=16 * 1024 * 1024, show_default=True, type=int,
                     help="largest accepted message"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func
