"""`infer-cluster gateway` and the HTTP / metrics options of `serve` and `coordinator`.

Owns: the `gateway` command (one OpenAI-compatible HTTP gateway in front of a running
coordinator, e.g. on another host), the option groups `http_options` (`--http-port`,
`--http-host`, `--api-key`, `--api-key-file`: `serve` then starts a gateway child) and
`metrics_option` (`--metrics-port`: the coordinator serves Prometheus metrics itself),
`gateway_keys` (the keys checked, as one line on error), and the argv of a gateway child
process (`serve` hands a command-line key to the child in its environment, not its argv).
Never imports torch, and imports FastAPI only inside the `gateway` command.
"""

from __future__ import annotations

import os
from typing import Optional

import click

from .cli_options import CliError, auth_option, check_auth

api_key_options_list = [
    click.option("--api-key", default=None, envvar="INFER_CLUSTER_API_KEY", metavar="KEY",
                 help="HTTP callers must send 'Authorization: Bearer KEY' (the openai client's "
                      "api_key) on every route but /health, /metrics and the docs. A "
                      "command-line key shows in the process list: prefer the env "
                      "INFER_CLUSTER_API_KEY or --api-key-file"),
    click.option("--api-key-file", default=None, envvar="INFER_CLUSTER_API_KEY_FILE",
                 metavar="FILE", help="accepted API keys, one per line (# comments); with "
                                      "--api-key, both are accepted. Env: INFER_CLUSTER_API_KEY_FILE"),
]

http_options_list = [
    click.option("--http-port", default=None, type=int,
                 help="also start an OpenAI-compatible HTTP gateway on this port "
                      "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)"),
    click.option("--http-host", default="127.0.0.1", show_default=True,
                 help="interface the HTTP gateway listens on (0.0.0.0 for all; anything but "
                      "loopback needs an API key or --insecure)"),
    *api_key_options_list,
]


def http_options(func):
    for opt in reversed(http_options_list):
        func = opt(func)
    return func


def api_key_options(func):
    for opt in reversed(api_key_options_list):
        func = opt(func)
    return func


def gateway_keys(api_key: Optional[str], api_key_file: Optional[str]) -> tuple:
    from infer_cluster.gateway.api_keys import read_api_keys  # standard library only
    try:
        return read_api_keys(api_key, api_key_file)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None


def check_gateway_config(**kw):
    """A `GatewayConfig`, or one line naming the bad option."""
    from infer_cluster.gateway.config import GatewayConfig  # no FastAPI
    try:
        return GatewayConfig(**kw)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None


metrics_option = click.option(
    "--metrics-port", default=None, type=int,
    help="serve Prometheus metrics of the coordinator and its replicas on this port "
         "(http://HOST:PORT/metrics), without a gateway")


def gateway_child_argv(coordinator_address: str, http_host: str, http_port: int,
                       log_level: str, auth: Optional[str] = None,
                       api_key_file: Optional[str] = None, insecure: bool = False) -> list[str]:
    from .launcher import python_module_argv
    key_file = ["--api-key-file", os.path.abspath(os.path.expanduser(api_key_file))] if api_key_file else []
    return python_module_argv("infer_cluster", "--log-level", log_level, "gateway",
                              "--coordinator", coordinator_address, "--host", http_host,
                              "--port", str(http_port), *(["--auth", auth] if auth else []),
                              *key_file, *(["--insecure"] if insecure else []))


def start_coordinator_metrics(port: Optional[int], host: str, client_address: str,
                              auth: Optional[str] = None) -> None:
    """`--metrics-port` for a coordinator process: a daemon HTTP thread (prometheus_client)
    whose collector asks this coordinator for its status through the client port."""
    if port is None:
        return
    if not 0 < port <= 65535:
        raise CliError(f"error: --metrics-port must be a TCP port in 1..65535, got {port}")
    from infer_cluster.gateway.cluster_metrics import start_metrics_server
    try:
        start_metrics_server(port, client_address, host=host, auth=auth)
    except OSError as exc:
        raise CliError(f"error: cannot serve metrics on {host}:{port}: {exc}") from None
    click.echo(f"coordinator: Prometheus metrics on http://{host}:{port}/metrics", err=True)


@click.command()
@click.option("--coordinator", "coordinator_address", default="tcp://127.0.0.1:5555",
              show_default=True, help="the coordinator's client address, tcp://HOST:PORT")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="interface to listen on (0.0.0.0 for all)")
@click.option("--port", default=8000, show_default=True, type=int, help="HTTP port")
@click.option("--served-model-name", default=None,
              help="another model name the API accepts (besides the replicas' own)")
@click.option("--request-timeout", default=None, type=float,
              help="seconds; a request still running after this ends with a 504 / error event")
@click.option("--max-n", default=16, show_default=True, type=int, help="largest accepted `n`")
@api_key_options
@click.option("--insecure", is_flag=True,
              help="listen on a non-loopback --host WITHOUT an API key: anyone who reaches the "
                   "port can generate with the cluster. Only for a trusted, isolated network")
@auth_option
@click.pass_context
def gateway(ctx, coordinator_address, host, port, served_model_name, request_timeout, max_n,
            api_key, api_key_file, insecure, auth):
    """Run an OpenAI-compatible HTTP gateway in front of a running coordinator.

    The gateway holds no model and needs no GPU: it is a client of the coordinator. Start
    several for more HTTP capacity. Try it: `curl http://HOST:PORT/v1/completions -H
    'Content-Type: application/json' -d '{"prompt": "Hello", "max_tokens": 16}'`."""
    check_auth(auth, ("client", "admin"))
    keys = gateway_keys(api_key, api_key_file)
    config = check_gateway_config(coordinator=coordinator_address, host=host, port=port,
                                  served_model_name=served_model_name,
                                  request_timeout=request_timeout, max_n=max_n,
                                  log_level=ctx.obj["log_level"] if ctx.obj else "info",
                                  auth=auth, api_keys=keys, insecure=insecure)
    from infer_cluster.gateway import run_gateway
    click.echo(f"gateway: http://{host}:{port}/v1 -> coordinator {coordinator_address}"
               + (f" ({len(keys)} API key(s) required)" if keys else " (no API key)"), err=True)
    run_gateway(config)
