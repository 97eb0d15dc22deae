"""`infer-cluster gateway` and the HTTP / metrics options of `serve` and `coordinator`.

Owns: the `gateway` command (one OpenAI-compatible HTTP gateway in front of a running
coordinator, e.g. on another host), the option groups `http_options` (`--http-port`,
`--http-host`: `serve` then starts a gateway child) and `metrics_option` (`--metrics-port`: the
coordinator serves Prometheus metrics itself), and the argv of a gateway child process.
Never imports torch, and imports FastAPI only inside the `gateway` command.
"""

from __future__ import annotations

from typing import Optional

import click

from .cli_options import CliError, auth_option, check_auth

http_options_list = [
    click.option("--http-port", default=None, type=int,
                 help="also start an OpenAI-compatible HTTP gateway on this port "
                      "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)"),
    click.option("--http-host", default="127.0.0.1", show_default=True,
                 help="interface the HTTP gateway listens on (0.0.0.0 for all)"),
]


def http_options(func):
    for opt in reversed(http_options_list):
        func = opt(func)
    return func


metrics_option = click.option(
    "--metrics-port", default=None, type=int,
    help="serve Prometheus metrics of the coordinator and its replicas on this port "
         "(http://HOST:PORT/metrics), without a gateway")


def gateway_child_argv(coordinator_address: str, http_host: str, http_port: int,
                       log_level: str, auth: Optional[str] = None) -> list[str]:
    from .launcher import python_module_argv
    return python_module_argv("infer_cluster", "--log-level", log_level, "gateway",
                              "--coordinator", coordinator_address, "--host", http_host,
                              "--port", str(http_port), *(["--auth", auth] if auth else []))


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
@auth_option
@click.pass_context
def gateway(ctx, coordinator_address, host, port, served_model_name, request_timeout, max_n, auth):
    """Run an OpenAI-compatible HTTP gateway in front of a running coordinator.

    The gateway holds no model and needs no GPU: it is a client of the coordinator. Start
    several for more HTTP capacity. Try it: `curl http://HOST:PORT/v1/completions -H
    'Content-Type: application/json' -d '{"prompt": "Hello", "max_tokens": 16}'`."""
    from infer_cluster.gateway import GatewayConfig, run_gateway
    check_auth(auth, ("client", "admin"))
    try:
        config = GatewayConfig(coordinator=coordinator_address, host=host, port=port,
                               served_model_name=served_model_name,
                               request_timeout=request_timeout, max_n=max_n,
                               log_level=ctx.obj["log_level"] if ctx.obj else "info",
                               auth=auth)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None
    click.echo(f"gateway: http://{host}:{port}/v1 -> coordinator {coordinator_address}", err=True)
    run_gateway(config)
