"""Rank processes forked from a fork server that has torch imported already.

Why: a rank started as a fresh interpreter spends ~2 s of CPU importing torch before it does
anything (1.8 s of 2.2 s on the 2-core CI machine). A replica that starts its ranks one after
another, or a process that builds many tensor-parallel engines (the test suite), pays that for
every rank. The standard library's fork server (`multiprocessing`, start method "forkserver")
is one fresh interpreter per replica process that imports `PRELOAD` once and forks a child per
rank on request. It never runs torch code, so it holds no CUDA context and no thread pool: its
children start as clean as a fresh interpreter (this process, which may hold CUDA, is never
forked). It exits with the process that started it. Used for replicas on the CPU
(`DistributedOptions.start_for`); CUDA replicas exec their ranks until this has run beside them.

Owns: `fork_rank(args, env)`, which starts `rank_main.main` in a forked child with the rank's
three pipes in place: its stdin on fd 0 (EOF: rank 0 is gone), its stderr on fd 2 (rank 0
forwards it into the log) and its heartbeat pipe; and `ForkedRank`, the parent's handle, with
the part of `subprocess.Popen`'s interface the launcher uses (pid, poll, wait, kill,
send_signal, returncode, stdin, stderr).
The child's environment is the caller's at the time of the call (the fork server's own is that
of its start); its `sys.path` and working directory are the caller's too (`multiprocessing`).
Only the pipes' file descriptors cross to the fork server (SCM_RIGHTS); the rank's settings go
as one JSON string, as on an exec'd rank's command line.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from multiprocessing import reduction
from typing import Optional

# Imported once by the fork server. Our own modules are not: each child imports them after
# its environment is set (a few tenths of a second), so a setting read at import time is the
# child's own.
PRELOAD = ["torch", "torch.distributed"]


def _context():
    """The fork-server start method (the server itself is `multiprocessing`'s, one per process,
    started by the first `Process.start`: the preload list only counts until then)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class _Fd:
    """A file descriptor handed to the child: duplicated into it through the fork server when
    the process object is sent there (the standard library's mechanism for connections)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _child(settings: str, env: dict, stdin: int, stderr: int, heartbeat: int) -> None:
    """The forked rank: its environment and pipes as an exec'd rank has them, then rank_main."""
    os.environ.clear()
    os.environ.update(env)
    os.dup2(stdin, 0)
    os.dup2(stderr, 2)
    os.dup2(stderr, 1)  # nothing prints, but a stray print must not reach the fork server's stdout
    for fd in (stdin, stderr):
        os.close(fd)
    args = json.loads(settings)
    args["heartbeat_fd"] = heartbeat
    args["parent_pid"] = os.getppid()  # the fork server: it exits when rank 0 does
    from infer_cluster.worker.distributed import rank_main
    rank_main.main(["rank_main", json.dumps(args)])


class ForkedRank:
    """The parent's handle on a forked rank (`subprocess.Popen`'s calls that the launcher uses)."""

    def __init__(self, process, stdin, stderr):
        self._process = process
        self.stdin = stdin    # binary file, the write end of the rank's fd 0
        self.stderr = stderr  # binary file, the read end of the rank's fd 2

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode

    def poll(self) -> Optional[int]:
        return self._process.exitcode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return code

    def kill(self) -> None:
        self._process.kill()

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)


def fork_rank(settings: dict, heartbeat_fd: int, env: Optional[dict] = None) -> ForkedRank:
    """Start a rank (`settings`: rank_main's JSON, without the heartbeat fd and parent pid) in
    a child of the fork server; `heartbeat_fd` is the write end of its heartbeat pipe (the
    caller closes its copy). The first call starts the fork server (it imports `PRELOAD`)."""
    stdin_r, stdin_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        process = _context().Process(
            target=_child, name=f"rank-{settings.get('rank')}", daemon=True,
            args=(json.dumps(settings), dict(os.environ if env is None else env),
                  _Fd(stdin_r), _Fd(stderr_w), _Fd(heartbeat_fd)))
        process.start()
    except BaseException:
        for fd in (stdin_w, stderr_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_r, stderr_w):
            os.close(fd)
    return ForkedRank(process, os.fdopen(stdin_w, "wb"), os.fdopen(stderr_r, "rb"))
