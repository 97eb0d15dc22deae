"""`Loads`: the scheduler's book of host-tier loads in flight. Plain Python.

Owns: load ids (one per admitted request whose KV comes back from the host tier), which device
blocks each load in flight fills, which requests wait for which loads, and landing them. It
never asks the device: the `Scheduler` polls (`loads_landed`) and hands the landed ids to `land`,
which returns each landed load's waiting requests so the scheduler can settle them and unpin the
host blocks. To extend (e.g. loads from a disk tier): keep one id per copy the runner tracks.
"""

from __future__ import annotations

from typing import Iterable


class Loads:
    def __init__(self):
        self._next = 0
        self.blocks: dict[int, int] = {}  # device block -> the load in flight filling it
        self.members: dict[int, list[str]] = {}  # load in flight -> requests waiting on it
        self.waits: dict[str, set[int]] = {}  # request -> loads it waits for

    def __bool__(self) -> bool:
        return bool(self.members)

    def new(self) -> int:
        load = self._next
        self._next += 1
        self.members[load] = []
        return load

    def fill(self, blocks: Iterable[int], load: int) -> None:
        """`load` writes these device blocks."""
        for block in blocks:
            self.blocks[block] = load

    def filling(self, blocks: Iterable[int]) -> set[int]:
        """The loads in flight that write any of `blocks`."""
        if not self.blocks:
            return set()
        return {self.blocks[b] for b in blocks if b in self.blocks}

    def wait(self, request_id: str, loads: set[int]) -> None:
        self.waits[request_id] = set(loads)
        for load in loads:
            self.members[load].append(request_id)

    def land(self, landed: Iterable[int]) -> list[tuple[int, list[str]]]:
        """Forget the landed loads; returns (load, requests that waited on it) for each one
        still in flight."""
        done = []
        for load in landed:
            members = self.members.pop(load, None)
            if members is None:
                continue
            done.append((load, members))
            for rid in members:
                waits = self.waits.get(rid)
                if waits is not None:
                    waits.discard(load)
                    if not waits:
                        del self.waits[rid]
        if done:
            gone = {load for load, _ in done}
            self.blocks = {b: load for b, load in self.blocks.items() if load not in gone}
        return done

    def clear(self) -> None:
        self.blocks.clear()
        self.members.clear()
        self.waits.clear()
