"""`run_replica`: one replica process from options to exit code.

Owns: building the `EngineConfig` and `DynamicEngine` (bad options and unknown models become one
logged line and exit code 2), SIGTERM / SIGINT handling (drain, then a second signal exits at
once), wiring a dead tensor-parallel rank to an immediate stop, and the exit code (an immediate
one when that failure left rank 0's device stuck: worker/device/wait.py). The serving itself is
`EngineServer` (worker/serving/server.py). Entry points: `python -m infer_cluster.worker` and
`infer-cluster replica`.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time

from infer_cluster.protocol import InferClusterError

from infer_cluster.worker.serving.server import EngineServer, ServerConfig

log = logging.getLogger("infer_cluster.replica")


def install_signal_handlers(server: EngineServer) -> None:
    """SIGTERM / SIGINT: drain then exit; a second one exits at once."""
    def handler(signum, _frame):
        if server._stop_requested:
            log.warning("second %s: exiting without draining", signal.Signals(signum).name)
            server.request_stop(graceful=False)
        else:
            log.info("%s: draining, then exiting", signal.Signals(signum).name)
            server.request_stop(graceful=True)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_replica(server_config: ServerConfig, engine_options: dict) -> int:
    """Build the engine, serve until told to stop; returns a process exit code.
    Errors a person can fix (bad option, unknown model) are logged as one line, exit code 2."""
    from infer_cluster.worker.config import EngineConfig
    try:
        config = EngineConfig(**engine_options)
    except (InferClusterError, TypeError, ValueError) as exc:
        log.error("bad engine option: %s", exc)
        return 2
    started = time.monotonic()
    try:
        from infer_cluster.worker.engine.engine import DynamicEngine
        engine = DynamicEngine(config, detokenize=False)
    except InferClusterError as exc:
        log.error("cannot start the engine: %s", exc)
        return 2
    log.info("engine ready in %.1f s: %s", time.monotonic() - started, engine.capacity())
    server = EngineServer(engine, server_config)
    install_signal_handlers(server)
    rank_failure: list[str] = []
    if hasattr(engine.runner, "on_fatal"):
        # A dead or hung rank: leave at once so the coordinator re-routes this replica's work.
        def on_rank_failure(reason: str) -> None:
            log.error("replica stopping: %s", reason)
            rank_failure.append(reason)
            server.request_stop(graceful=False)
        engine.runner.on_fatal = on_rank_failure
    # Everything built so far (torch, the model, compiled kernels, warm-up) lives as long as the
    # process: out of the collector's sight, a full collection no longer walks it while serving.
    gc.collect()
    gc.freeze()
    try:
        server.serve_forever()
    finally:
        if hasattr(engine, "close"):
            engine.close()
    code = 1 if (server.io.fatal_error or rank_failure) else 0
    if getattr(engine.runner, "device_stuck", False):
        # A symmetric-memory all-reduce waits on the dead rank forever (worker/device/wait.py):
        # the interpreter's teardown could wait on that device, so leave without it.
        log.error("exiting without tearing down rank 0's device, which is stuck behind the "
                  "dead rank")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
