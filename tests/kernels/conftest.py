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


def tol(dtype):
    """(atol, rtol) for comparing a kernel with its float32-computing reference."""
    return (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
