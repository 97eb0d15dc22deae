"""Option groups shared by the `infer-cluster` commands.

Owns: the engine flags (one per `EngineConfig` field, generated, so new engine options appear
without edits), the coordinator flags, `--auth` (with INFER_CLUSTER_AUTH) and loading its keys
into one-line errors, and forwarding given engine flags to `python -m infer_cluster.worker`.
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


AUTH_HELP = ("CURVE key folder from `infer-cluster keygen DIR` (the full folder, or one made by "
             "`keygen DIR --export ROLE OUT`); without it nothing is authenticated. "
             "Env: INFER_CLUSTER_AUTH")


def auth_option(func):
    """`--auth DIR` (env INFER_CLUSTER_AUTH); the command gets `auth` = the folder or None."""
    return click.option("--auth", "auth", default=None, envvar="INFER_CLUSTER_AUTH",
                        metavar="DIR", help=AUTH_HELP)(func)


def check_auth(auth, roles: tuple) -> None:
    """Fail with one line now if `auth` cannot serve one of `roles` (the first found is used)."""
    if not auth:
        return
    from infer_cluster.client.auth import AuthError, load_keys
    try:
        keys = load_keys(auth)
        if roles == ("coordinator",):
            if "coordinator" not in keys.secret:
                raise AuthError(f"{auth} has no coordinator.key_secret: the coordinator needs the "
                                "full folder made by `infer-cluster keygen DIR`, not an export")
            for role in ("client", "admin", "replica"):
                keys.need_public(role)
        keys.pick_role(roles)
        keys.need_public("coordinator")
    except AuthError as exc:
        raise CliError(f"error: {exc}") from None


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


def typed_engine_options(engine: dict) -> dict:
    """Comma-separated list flags (`--device-ids 0,1`) -> lists of ints, or a one-line error."""
    out = dict(engine)
    if isinstance(out.get("device_ids"), str):
        try:
            out["device_ids"] = [int(x) for x in out["device_ids"].split(",") if x.strip()]
        except ValueError:
            raise CliError(f"error: --device-ids must be comma-separated GPU numbers like 0,1; "
                           f"got {engine['device_ids']!r}") from None
    return out


# What `serve` and `generate` run when no --model is given: a real model from a Python package.
DEFAULT_MODEL = "smollm2-135m-instruct"


def check_model(engine: dict) -> None:
    """A missing model, a folder without config.json (or a .gguf file), or a config.json that is
    not JSON: one line at once, before any process or torch import (the engine's own checks
    would take seconds to get there)."""
    import json
    import os
    from infer_cluster.worker.loading.embedded import EMBEDDED_MODELS  # torch-free
    for flag in ("model", "tokenizer"):
        name = engine.get(flag)
        if not name or name in EMBEDDED_MODELS:
            continue
        path = os.path.expanduser(name)
        if flag == "model" and path.endswith(".gguf"):
            if not os.path.isfile(path):
                raise CliError(f"error: --model {name!r}: no such GGUF file")
            continue
        if not os.path.isdir(path):
            raise CliError(f"error: --{flag} {name!r} is neither a folder, a .gguf file nor an "
                           f"embedded model ({', '.join(EMBEDDED_MODELS)})")
        config = os.path.join(path, "config.json")
        if flag == "model" and not os.path.isfile(config):
            if any(f.endswith(".gguf") for f in os.listdir(path)):
                continue  # the loader picks the folder's one GGUF file (and says if there are more)
            raise CliError(f"error: model folder {name!r} has no config.json and no .gguf file; "
                           "point --model at a Hugging Face folder (config.json + *.safetensors) "
                           "or at a .gguf file")
        if flag == "model":
            try:
                with open(config, encoding="utf-8") as f:
                    json.load(f)
            except (OSError, ValueError) as exc:
                raise CliError(f"error: cannot read config in {name!r}: {config} is not valid "
                               f"JSON ({exc})") from None


def check_device(engine: dict) -> None:
    """`--device cuda` where no GPU is: one line (loads torch unless there is plainly no NVIDIA
    driver; call only where the engine runs in this process)."""
    if engine.get("device") == "cuda":
        import os
        import shutil
        no_driver = shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0")
        if no_driver:
            raise CliError("error: --device cuda, but this machine has no NVIDIA driver or GPU; "
                           "use --device cpu (or auto)")
        import torch
        if not torch.cuda.is_available():
            raise CliError("error: --device cuda, but torch sees no CUDA GPU here; use --device "
                           "cpu (or auto), or check the driver / CUDA_VISIBLE_DEVICES")


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
                     help="interface to listen on (0.0.0.0 for all; anything but loopback "
                          "needs --auth or --insecure)"),
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
        click.option("--auth", "auth", default=None, envvar="INFER_CLUSTER_AUTH", metavar="DIR",
                     help="the full key folder from `infer-cluster keygen DIR`: clients need the "
                          "client or admin key, replicas the replica key, control actions the "
                          "admin key. Env: INFER_CLUSTER_AUTH"),
        click.option("--insecure", is_flag=True,
                     help="listen on a non-loopback --host WITHOUT authentication: anyone who "
                          "can reach the ports may submit work, pause or shut down replicas, "
                          "and register a fake replica that receives other users' prompts "
                          "(serve: also a non-loopback --http-host without an API key). "
                          "Only for a trusted, isolated network"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func
