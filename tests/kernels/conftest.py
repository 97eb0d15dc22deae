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


# The ahead-of-time sm_90 build checks of the kernel test modules, registered at import
# (`sm90_check`) and run together in one child (`sm90_builds`): one torch and Triton import
# (~2.5 CPU s) for all of them instead of one per test.
SM90_CHECKS: dict[str, str] = {}

_RUN_CHECKS = """
import contextlib, io, json, sys, traceback
results = {}
for name, code in json.loads(sys.stdin.read()).items():
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), {"__name__": name})
        results[name] = {"stdout": out.getvalue()}
    except Exception:
        results[name] = {"stdout": out.getvalue(), "error": traceback.format_exc()}
print(json.dumps(results))
"""


def sm90_check(name: str, code: str) -> str:
    """Register `code` (a snippet that prints what its test reads) as the sm_90 check `name`."""
    SM90_CHECKS[name] = code
    return name


def assert_decode_outputs(got, ref, other, query_start_loc, multi_row: int, dtype) -> None:
    """A decode kernel's output `got` (filled with NaN before the call) where sequence
    `multi_row` has a multi-row query: that sequence's rows untouched, every other row written
    without NaN (the caches' NaN trap past seq_lens), and equal to the reference `ref` and to
    the kernel it stands in for (`other`) within the dtype's tolerance."""
    one = torch.ones(got.shape[0], dtype=torch.bool, device=got.device)
    one[int(query_start_loc[multi_row]):int(query_start_loc[multi_row + 1])] = False
    assert torch.isnan(got[~one]).all(), "wrote the rows of a multi-row query"
    assert not torch.isnan(got[one]).any(), "read KV past seq_lens (NaN trap) or left a row unwritten"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got[one], ref[one], atol=atol, rtol=rtol)
    torch.testing.assert_close(got[one], other[one], atol=atol, rtol=rtol)


def decode_build_check(name: str, variants: str) -> str:
    """Register the sm_90 check `name` of a Gluon decode kernel's builds (`bench.ptxas_check.
    <variants>()`), read back by `assert_decode_builds`."""
    return sm90_check(name, f"""
from bench.ptxas_gluon import {variants}
from bench.sm90_build import compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in {variants}():
    c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
    regs, spills = ptxas_info(c.asm["ptx"])
    lines = [l.strip() for l in c.asm["ptx"].splitlines()]
    waits = [i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait")]
    loads = [i for i, l in enumerate(lines) if "ld.global" in l]
    copies = [i for i, l in enumerate(lines) if l.startswith("cp.async.c")]
    scalar = [i for i in loads if "ld.global.b32 " in lines[i]]  # one 32-bit word: a step input
    partial = sum(l.startswith("cp.async.wait_group") and l.rstrip(";").split()[-1] == "1" for l in lines)
    first, last = waits[0], waits[-1]
    print(int(consts["SPLIT"]), regs, spills, c.metadata.shared,
          sum(i < first for i in loads + copies) - sum(i < first for i in scalar), partial,
          len(waits), sum(i < first for i in scalar), sum(first < i < last for i in loads),
          sum(first < i < last for i in copies))
""")


def assert_decode_builds(output: str, resident: int, early_tile: bool = False) -> None:
    """A decode kernel's sm_90 builds (`decode_build_check`), one partition and split: no spills,
    `resident` 128-thread programs fit a SM (65,536 registers, 228 KB of shared memory), and K
    and V each waited for with the other tile's copies still in flight (two `cp.async.wait_group
    1` in the loop). Before the PDL wait: nothing read; with `early_tile` (the int8 Gluon
    kernel's first tile), only single 32-bit words (the step inputs: order, query starts,
    context length, block ids) before either of its two waits, and between them the first
    tile's copies alone (q, a vector load, after both)."""
    rows = [tuple(map(int, line.split())) for line in output.splitlines()]
    assert sorted(r[0] for r in rows) == [0, 1]
    for split, regs, spills, shared, before_wait, partial_waits, waits, words, loads_between, \
            copies_between in rows:
        assert spills == 0, split
        assert regs * 128 * resident <= 65536, (split, regs)
        assert resident * (shared + 1024) <= 228 * 1024, (split, shared)
        assert before_wait == 0, split
        assert partial_waits == 2, partial_waits
        if early_tile:
            assert waits == 2 and loads_between == 0 and copies_between > 0, (split, waits)
            assert 0 < words <= 6, (split, words)
        else:
            assert waits == 1 and words == 0, (split, waits, words)


@pytest.fixture(scope="session")
def sm90_builds():
    """Every registered sm_90 check, run in one child without the interpreter: `get(name)` gives
    that check's stdout, and fails the calling test with the check's traceback if it raised."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _RUN_CHECKS], input=json.dumps(SM90_CHECKS),
                          cwd=root, env=env, capture_output=True, text=True,
                          timeout=120 + 120 * len(SM90_CHECKS))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])

    class Builds:
        @staticmethod
        def get(name: str) -> str:
            result = results[name]
            assert "error" not in result, result["error"][-2000:]
            return result["stdout"]
    return Builds()


def tol(dtype):
    """(atol, rtol) for comparing a kernel with its float32-computing reference."""
    return (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
