"""Ahead-of-time sm_90 builds of Triton and Gluon kernels, without a GPU, and what to read off
them: the tools bench/ptxas_check.py and the kernel tests' build checks (`sm90_check` in
tests/kernels/conftest.py) share.

Owns: `compile_sm90` (a kernel specialised as the JIT would for the given pointer dtypes,
integer arguments and constexprs: strides equal to 1 become constants, multiples of 16 carry
the divisibility hint, 16-byte-aligned pointers; PDL on where the kernel has the switch),
`ptxas_report` / `ptxas_info` (registers, spill bytes and serialized warpgroup MMAs from
Triton's bundled `ptxas -v`) and `sass_counts`
(static SASS instruction counts from its bundled nvdisasm). Never runs a kernel.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile


def compile_sm90(kernel, ptrs, ints, consts, opts, dns):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(inspect.signature(kernel.fn).parameters)
    if "PDL" in names:  # the CUDA entry points launch with PDL on sm_90 (kernels/pdl.py)
        consts = {"PDL": True, **consts}
    sig, values, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in consts:
            sig[name], values[(i,)] = "constexpr", consts[name]
        elif name in ptrs:  # a pointer ("*bf16") or a TMA descriptor (`desc_sig`)
            sig[name] = ptrs[name]
            if not ptrs[name].startswith("tensordesc"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("scale_log2", "eps"):
            sig[name] = "fp32"
        elif name not in dns and ints[name] == 1:
            sig[name], values[(i,)] = "constexpr", 1
        else:
            sig[name] = "i32"
            if name not in dns and ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource
    if type(kernel).__name__ == "GluonJITFunction":  # Gluon kernels build from their own source
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(kernel, sig, values, attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def desc_sig(shape, block, dtype="bf16") -> str:
    """The signature string of a Gluon TMA descriptor argument (host `TensorDescriptor` of a
    `shape` tensor in `block` tiles, the default NVMMA shared layout), as the JIT would mangle it."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type
    tdt, gdt = {"bf16": (torch.bfloat16, gl.bfloat16), "fp16": (torch.float16, gl.float16),
                "fp32": (torch.float32, gl.float32)}[dtype]
    layout = gl.NVMMASharedLayout.get_default_for(list(block), gdt)
    return mangle_type(TensorDescriptor.from_tensor(torch.empty(*shape, dtype=tdt), list(block), layout))


def ptxas_report(ptx: str) -> dict:
    """What Triton's bundled `ptxas -v` says of an sm_90a build: registers, spill bytes, and
    whether it serialized the warpgroup MMAs (its "wgmma.mma_async instructions are serialized"
    notes, C7513 and kin: each wgmma then waits for the one before, so nothing overlaps them;
    the build still succeeds, so only this report shows it)."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        err = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o",
                              os.path.join(tmp, "k.cubin")], capture_output=True, text=True,
                             check=True).stderr
    return {"regs": int(re.search(r"Used (\d+) registers", err).group(1)),
            "spills": int(re.search(r"(\d+) bytes spill stores", err).group(1)),
            "wgmma_serialized": "wgmma.mma_async instructions are serialized" in err}


def ptxas_info(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes) of `ptxas_report`."""
    r = ptxas_report(ptx)
    return r["regs"], r["spills"]


SASS_KINDS = ("total", "LDS", "LDS.U8", "LDSM", "STS", "PRMT", "HADD2", "IMAD.MOV", "I2F", "HMMA", "IMMA")


def sass_counts(cubin: bytes) -> dict:
    """Static SASS instruction counts of a cubin (Triton's bundled nvdisasm) by opcode without
    modifiers (LDS counts every LDS.*), plus "total", "LDS.U8" (byte loads from shared memory,
    signed or not) and "IMAD.MOV" (register moves)."""
    import collections

    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([tool, "-c", path], capture_output=True, text=True,
                              check=True).stdout
    line = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)
    ops = [m.group(1) for m in line.finditer(text)]
    counts = collections.Counter(op.split(".")[0] for op in ops)
    counts["total"] = len(ops)
    counts["LDS.U8"] = sum(op in ("LDS.U8", "LDS.S8") for op in ops)
    counts["IMAD.MOV"] = sum(op.startswith("IMAD.MOV") for op in ops)
    return counts
