"""Rank 0's side of the rank processes: start them, watch them, end them.

Owns: spawning ranks 1..N-1, never as a fork of this process, which may hold CUDA: forked
from the fork server (worker/distributed/fork_server.py: torch is imported there once; the
default for a replica on the CPU) or as fresh interpreters (`python -m
infer_cluster.worker.distributed.rank_main`: on CUDA, or where `DistributedOptions.rank_start`
says "exec"); the three pipes per rank (its stdin, whose
EOF tells the rank to exit at once: rank 0 closed it or is gone; a heartbeat pipe it writes a
byte to every `heartbeat_interval_s`; its stderr, which a thread copies line by line into rank
0's stderr, the replica's log, each line prefixed `rank N |`, so a rank's traceback, NCCL's
warnings and its logging reach the one log a user reads), and `RankMonitor`, a thread that
turns a rank that exits, or falls silent for `heartbeat_timeout_s`, into one recorded failure:
it asks a silent rank for its Python stacks first (SIGUSR1, which rank_main hands to
`faulthandler`), so the log says where it hung, then kills every rank (so rank 0's pending gloo
collectives fail at once instead of waiting for the timeout), runs the failure callbacks, and
logs one clear line.

Must never touch torch or the engine: the runner decides what a failure means for a step. To
watch something else (e.g. GPU health), add a check to `RankMonitor._check` that calls `fail()`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from infer_cluster.protocol import EngineError

from infer_cluster.worker.distributed.fork_server import fork_rank
from infer_cluster.worker.distributed.topology import DistributedOptions

log = logging.getLogger(__name__)

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class RankFailedError(EngineError):
    """A rank of this replica died, hung, or its step failed; the replica cannot continue."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class RankProcess:
    rank: int
    popen: subprocess.Popen  # or a `fork_server.ForkedRank`, which answers the same calls
    heartbeat_fd: int                      # read end, owned by rank 0
    last_beat: Optional[float] = None      # monotonic time of the last heartbeat byte
    started: float = field(default_factory=time.monotonic)
    output: Optional[threading.Thread] = None  # copies the rank's stderr into ours

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn_rank(rank: int, bootstrap: dict, options: DistributedOptions,
               extra_env: Optional[dict] = None) -> RankProcess:
    """Start rank `rank`. `bootstrap` (JSON) tells it everything it needs to join and build
    its shard; the heartbeat pipe's write end is handed over by fd number."""
    hb_read, hb_write = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra_env or {})
    args = dict(bootstrap, rank=rank, options=options.to_dict())
    try:
        if options.rank_start == "fork-server":
            popen = fork_rank(args, hb_write, env)
        else:
            args.update(heartbeat_fd=hb_write, parent_pid=os.getpid())
            popen = subprocess.Popen([sys.executable, "-m", "infer_cluster.worker.distributed.rank_main",
                                      json.dumps(args)],
                                     stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(hb_write,),
                                     env=env, close_fds=True)
    except Exception:
        os.close(hb_read)
        raise
    finally:
        os.close(hb_write)
    os.set_blocking(hb_read, False)
    proc = RankProcess(rank, popen, hb_read)
    proc.output = threading.Thread(target=forward_output, args=(popen.stderr, f"rank {rank} | "),
                                   name=f"rank-{rank}-stderr", daemon=True)
    proc.output.start()
    return proc


def forward_output(stream, prefix: str, sink=None) -> None:
    """Copy `stream` (a rank's stderr, bytes) line by line into `sink` (default: this process's
    stderr), each line prefixed; returns at EOF (the rank exited). A line is written whole, so
    ranks' lines interleave but never mix."""
    sink = sink or sys.stderr
    prefix_bytes = prefix.encode()
    for line in iter(stream.readline, b""):
        text = (prefix_bytes + line.rstrip(b"\n")).decode(errors="replace") + "\n"
        try:
            sink.write(text)
            sink.flush()
        except (OSError, ValueError):  # our own stderr is closed: keep draining the pipe
            pass
    stream.close()


class RankMonitor:
    """Watches the rank processes from a daemon thread; the first failure wins."""

    def __init__(self, ranks: list[RankProcess], options: DistributedOptions):
        self.ranks = ranks
        self.options = options
        self.error: Optional[str] = None
        self.failed = threading.Event()
        self.handled = threading.Event()  # set once the failure callbacks have returned
        self._callbacks: list[Callable[[str], None]] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rank-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def on_failure(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)

    def stop(self) -> None:
        """Expected exits from here on (shutdown) are not failures."""
        self._stopping.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)

    def fail(self, reason: str) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = reason
        log.error("tensor/pipeline-parallel replica failed: %s; killing all rank processes", reason)
        kill_all(self.ranks)
        self.failed.set()
        for cb in self._callbacks:
            try:
                cb(reason)
            except Exception:
                log.exception("rank-failure callback raised")
        self.handled.set()

    def _run(self) -> None:
        fds = {r.heartbeat_fd: r for r in self.ranks}
        poll_s = min(0.25, self.options.heartbeat_interval_s)
        while not self._stopping.is_set() and self.error is None:
            live = [fd for fd, r in fds.items() if r.popen.returncode is None]
            try:
                readable = select.select(live, [], [], poll_s)[0] if live else []
            except (OSError, ValueError):  # fds closed under us: shutting down
                readable = []
            now = time.monotonic()
            for fd in readable:
                try:
                    if os.read(fd, 4096):
                        fds[fd].last_beat = now
                except (BlockingIOError, OSError):
                    pass
            if not live:
                time.sleep(poll_s)
            if not self._stopping.is_set():
                self._check(now)

    def _check(self, now: float) -> None:
        opts = self.options
        for r in self.ranks:
            code = r.popen.poll()
            if code is not None:
                if r.output is not None:  # let its last words (a traceback) reach the log first
                    r.output.join(timeout=STACK_DUMP_WAIT_S)
                self.fail(f"rank {r.rank} (pid {r.pid}) exited with {describe_exit(code)}")
                return
            if r.last_beat is None:
                if now - r.started > opts.startup_timeout_s:
                    dump_stacks(r)
                    self.fail(f"rank {r.rank} (pid {r.pid}) did not start within "
                              f"{opts.startup_timeout_s:g} s")
                    return
            elif now - r.last_beat > opts.heartbeat_timeout_s:
                dump_stacks(r)
                self.fail(f"rank {r.rank} (pid {r.pid}) sent no heartbeat for {now - r.last_beat:.1f} s "
                          f"(hung or stopped; its Python stacks are above, prefixed 'rank {r.rank} |')")
                return


STACK_DUMP_WAIT_S = 1.0


def dump_stacks(rank: RankProcess) -> None:
    """Ask a silent rank to write every thread's Python stack to its stderr (rank_main registers
    `faulthandler` for SIGUSR1; the dump needs no GIL, so a rank stuck in C code answers too),
    and give the forwarding thread a moment to copy it into the log before the rank is killed."""
    try:
        rank.popen.send_signal(signal.SIGUSR1)
    except OSError:
        return
    time.sleep(STACK_DUMP_WAIT_S)


def kill_all(ranks: list[RankProcess]) -> None:
    """SIGKILL every rank still running (works on stopped processes too) and reap it."""
    for r in ranks:
        if r.popen.poll() is None:
            try:
                r.popen.kill()
            except OSError:
                pass
    for r in ranks:
        try:
            r.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.error("rank %d (pid %d) survived SIGKILL for 5 s", r.rank, r.pid)


def close_stdin(ranks: list[RankProcess]) -> None:
    """Close every rank's stdin: at its EOF a rank exits at once (rank_main's watcher)."""
    for r in ranks:
        try:
            r.popen.stdin.close()
        except OSError:  # unflushed bytes to a dead rank
            pass


def reap(ranks: list[RankProcess], timeout_s: float) -> None:
    """Wait up to `timeout_s` in all for the ranks to exit, kill what is left, close the
    pipes. Safe to call more than once."""
    deadline = time.monotonic() + timeout_s
    for r in ranks:
        try:
            r.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("rank %d (pid %d) did not exit within %.1f s of shutdown; killing it",
                        r.rank, r.pid, timeout_s)
    kill_all(ranks)
    for r in ranks:
        try:
            r.popen.stdin.close()
        except OSError:  # unflushed bytes to a dead rank
            pass
        if r.output is not None:  # the rank is gone: its last lines are on their way
            r.output.join(timeout=2.0)
        if r.heartbeat_fd >= 0:
            try:
                os.close(r.heartbeat_fd)
            except OSError:
                pass
            r.heartbeat_fd = -1
