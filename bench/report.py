"""Shared output helpers for the benchmark scripts: every bench writes one JSON file.

Owns: `write_json(path, result)` and `run_info()`, the facts a figure needs to be read later
(UTC date, commit, device name, torch and Triton versions; bench/chart.py reads them). The commit is `BENCH_COMMIT` when
set (a copied tree's own git history can be stale: name the commit it was copied from), else
`git rev-parse --short HEAD` of this checkout, else None.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess


def write_json(path: str, result) -> None:
    """Write `result` as indented JSON to `path`, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


def _commit() -> str | None:
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _gpu_name_without_torch() -> str | None:
    """The first GPU's name from nvidia-smi (no CUDA context in this process), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return names[0].strip() if names else None


def run_info(use_torch: bool = True) -> dict:
    """UTC date, commit, device name ("cpu" without CUDA), torch and Triton versions.
    `use_torch=False` is for a process that must not import torch or open a CUDA context (a
    client beside the replicas it measures): the device name then comes from nvidia-smi and the
    versions are left out."""
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": _commit()}
    if not use_torch:
        info["device_name"] = _gpu_name_without_torch() or "cpu"
        return info
    try:
        import torch
        info["device_name"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info
