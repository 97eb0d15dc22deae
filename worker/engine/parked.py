"""`ParkedRequests`: requests whose structured-outputs grammar is still compiling.

Owns: each parked `Request` with the future of its compiled grammar (worker/structured/
compiler.py), until the engine moves it into the scheduler (compiled) or ends it (the compile
failed, or it was aborted). A parked request holds no KV blocks and is in no step, so the batch
runs on without it: the compile never holds up the other requests. Plain Python.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Optional

from infer_cluster.worker.sched.request import Request


class ParkedRequests:
    def __init__(self):
        self._by_id: dict[str, tuple[Request, Future]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> Optional[Request]:
        entry = self._by_id.get(request_id)
        return entry[0] if entry is not None else None

    def park(self, req: Request, compiled: Future) -> None:
        self._by_id[req.request_id] = (req, compiled)

    def pop(self, request_id: str) -> Optional[Request]:
        entry = self._by_id.pop(request_id, None)
        return entry[0] if entry is not None else None

    def ready(self) -> list[tuple[Request, object]]:
        """The requests whose compile ended, taken out: (request, compiled grammar or the
        exception the compile raised), in the order they were parked."""
        done = [(rid, req, fut) for rid, (req, fut) in self._by_id.items() if fut.done()]
        out = []
        for rid, req, fut in done:
            del self._by_id[rid]
            exc = fut.exception()
            out.append((req, exc if exc is not None else fut.result()))
        return out

    def wait(self, timeout: float) -> None:
        """Block until a compile ends or `timeout` seconds pass (the engine has nothing else)."""
        if self._by_id:
            wait([fut for _, fut in self._by_id.values()], timeout, FIRST_COMPLETED)
