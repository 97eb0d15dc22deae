"""Shared output helper for the benchmark scripts: every bench writes one JSON file."""

from __future__ import annotations

import json
import os


def write_json(path: str, result) -> None:
    """Write `result` as indented JSON to `path`, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
