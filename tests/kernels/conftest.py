"""Kernel tests: every Triton kernel against its plain-torch reference.

Without CUDA, Triton runs under its CPU interpreter; `TRITON_INTERPRET` must be set before anything
imports triton, so this conftest does it first. With CUDA the same tests run for real on the GPU
(the `device` fixture's "cuda" case, marked `gpu`), and the "cpu" case is skipped unless the
interpreter was requested explicitly. Keep CPU shapes small: the interpreter is slow.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

CPU = pytest.param("cpu", marks=pytest.mark.skipif(
    not INTERPRET, reason="Triton on CPU tensors needs TRITON_INTERPRET=1"))
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device")])
# Interpreter-friendly-sized cases use `device`; big shapes take `gpu_device`, which is CUDA only.
DEVICES = [CPU, CUDA]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=[CUDA])
def gpu_device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def run_without_interpreter(code: str, timeout: float = 300) -> str:
    """Run `code` in a child Python from the repository root without `TRITON_INTERPRET` (the
    ahead-of-time sm_90 builds: this process's interpreter cannot compile) and return its stdout;
    skips without Triton's NVIDIA backend, fails with the child's stderr if it fails."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def tol(dtype):
    """(atol, rtol) for comparing a kernel with its float32-computing reference."""
    return (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
