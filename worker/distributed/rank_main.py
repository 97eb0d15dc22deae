"""Entry point of ranks 1..N-1: `main([_, BOOTSTRAP_JSON])`, called in a child of the fork server
(worker/distributed/fork_server.py) or by `python -m infer_cluster.worker.distributed.rank_main
BOOTSTRAP_JSON` (`DistributedOptions.rank_start` "exec").

Owns: one rank process's life. Before torch loads (seconds), it starts the heartbeat thread,
which also ends the process when rank 0 is gone (heartbeat pipe broken or parent pid changed),
and a thread that ends it at EOF on stdin (rank 0 closed the pipe, or died). Then it joins the
group, builds its `RankShard` (capturing decode graphs in lock step with the other ranks), and
loops: wait for the next step (`RankShard.next_step`: the step channel, or with pipeline
micro-batches the previous stage's relay), run it. A STOP step ends the loop: graphs
are released, the group is left, and the process exits with code 0 (`os._exit`: torch's
teardown is slow); any error ends it with code 1 after one logged traceback (rank 0's monitor
turns that into the replica's failure).

Must never decide anything: it only executes what rank 0 broadcasts. It ignores SIGINT (rank 0
owns its lifetime: a Ctrl-C in a terminal reaches the whole process group, and the replica
drains before it ends its ranks). To add an op: handle a new `step_codec.Op` in `_serve`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time

EXIT_PARENT_GONE = 3


def _start_heartbeat(fd: int, interval_s: float, parent_pid: int) -> None:
    def beat():
        while True:
            if os.getppid() != parent_pid:
                os._exit(EXIT_PARENT_GONE)
            try:
                os.write(fd, b".")
            except OSError:  # rank 0 closed its end or died
                os._exit(EXIT_PARENT_GONE)
            time.sleep(interval_s)
    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def _exit_at_stdin_eof() -> None:
    def watch():
        while True:
            try:
                if not os.read(0, 4096):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os._exit(EXIT_PARENT_GONE)
    threading.Thread(target=watch, name="stdin-eof", daemon=True).start()


def _serve(shard) -> None:
    from infer_cluster.worker.distributed.step_codec import Op

    while True:
        header, payload = shard.next_step()
        if header.op is Op.STOP:
            return
        shard.run_step(header, payload)


def main(argv: list[str]) -> None:
    args = json.loads(argv[1])
    rank = args["rank"]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Rank 0's monitor sends SIGUSR1 to a rank that fell silent: every thread's stack goes to
    # stderr (forwarded into the replica's log) before the rank is killed.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    _start_heartbeat(args["heartbeat_fd"], args["options"]["heartbeat_interval_s"], args["parent_pid"])
    _exit_at_stdin_eof()

    import logging
    logging.basicConfig(level=args.get("log_level", "WARNING"), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s")
    log = logging.getLogger("worker.distributed.rank_main")
    try:
        import datetime
        from pathlib import Path

        import torch
        import torch.distributed as dist

        from infer_cluster.worker.config import EngineConfig
        from infer_cluster.worker.models.decoder import ModelSpec
        from infer_cluster.worker.distributed.shard import RankGroups, RankShard
        from infer_cluster.worker.distributed.topology import DistributedOptions, RankLayout

        # The replica's ranks share its cores (its OMP_NUM_THREADS share, or the host's).
        share = os.environ.get("OMP_NUM_THREADS", "")
        cores = int(share) if share.isdigit() and int(share) > 0 else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // args["world_size"]))
        options = DistributedOptions(**args["options"])
        config = EngineConfig(**args["config"])
        spec = ModelSpec(**args["spec"])
        layout = RankLayout(rank, config.tensor_parallel_size, config.pipeline_parallel_size, spec.num_layers)
        store = dist.TCPStore(options.master_addr, args["master_port"], args["world_size"], is_master=False,
                              timeout=datetime.timedelta(seconds=options.join_timeout_s))
        shard = RankShard(layout, config, spec, Path(args["model_path"]), None, args["max_model_len"],
                          options, store)
        log.info("rank %d ready: stage %d, tp rank %d, layers %s, %d KV blocks", rank, layout.stage,
                 layout.tp_rank, layout.layer_range, shard.runner.num_kv_blocks)
        _serve(shard)
        shard.release_graphs()
        RankGroups.destroy()
    except BaseException:
        if os.getppid() != args["parent_pid"]:  # the group broke because rank 0 died
            os._exit(EXIT_PARENT_GONE)
        log.exception("rank %d failed", rank)
        logging.shutdown()
        os._exit(1)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (seconds with torch loaded); nothing is left to flush


if __name__ == "__main__":
    main(sys.argv)
