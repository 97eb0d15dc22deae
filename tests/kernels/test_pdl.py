"""Programmatic dependent launch (kernels/pdl.py): when it is on, and what the sm_90 build of the
small-batch GEMV does with it. The build check runs without a GPU (ahead-of-time compile in a
child process: the interpreter this test directory turns on cannot compile) and reads the PTX:
the kernel releases its dependents first, and on the CUDA-core path it issues its first weight
load before it waits for the previous kernel, while every load of an activation comes after the
wait. GPU runs with PDL on are the kernel and parity tests (it is the default on sm_90)."""

import torch

from infer_cluster.kernels.pdl import pdl_enabled, pdl_launch
from tests.kernels.conftest import sm90_check


def test_off_without_cuda_and_with_the_switch(monkeypatch):
    t = torch.zeros(2)
    assert not pdl_enabled(t)
    monkeypatch.setenv("INFER_CLUSTER_PDL", "0")
    assert not pdl_enabled(t)


def test_launch_option_only_when_on():
    assert pdl_launch(False) == {}  # the interpreter never sees an option it does not know
    assert pdl_launch(True) == {"launch_pdl": True}


PTX_ORDER = sm90_check("pdl_gemv_order", """
from bench.ptxas_check import gemv_variants
from bench.sm90_build import compile_sm90
for name, kernel, ptrs, ints, consts, opts, dns in gemv_variants():
    if "norm" not in name or "fma" not in name:
        continue
    lines = [l.strip() for l in compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"].splitlines()]
    def first(key):
        return next(i for i, l in enumerate(lines) if l.startswith(key))
    loads = [i for i, l in enumerate(lines) if l.startswith("ld.global")]
    print(name.replace(" ", "_"), first("griddepcontrol.launch_dependents"), first("griddepcontrol.wait"),
          loads[0], loads[-1])
""")


def test_sm90_gemv_loads_weights_before_the_wait(sm90_builds):
    rows = [line.split() for line in sm90_builds.get(PTX_ORDER).splitlines()]
    assert rows, "no fused-norm CUDA-core GEMV variant was built"
    for name, release, wait, first_load, last_load in rows:
        assert int(release) < int(wait), name
        # The weight tile's loads come first; the norm pre-pass reads x and the residual after.
        assert int(first_load) < int(wait) < int(last_load), name


DECODE_ORDER = sm90_check("pdl_decode_order", """
from bench.ptxas_check import _decode_row
from bench.sm90_build import compile_sm90
from infer_cluster.kernels.attention_decode_triton import DECODE_TUNED as c
for pre in (False, True):
    for split in (False, True):
        _, kernel, ptrs, ints, consts, opts, dns = _decode_row("", False, split, c["block_n"],
                                                               c["num_warps"], c["num_stages"],
                                                               dict(PRELOAD=pre))
        lines = [l.strip() for l in compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"].splitlines()]
        wait = next(i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait"))
        loads = [i for i, l in enumerate(lines) if "ld.global" in l or "cp.async.c" in l]
        print(int(pre), int(split), sum(i < wait for i in loads), sum(i > wait for i in loads))
""")


def test_sm90_decode_reads_nothing_before_the_wait_unless_it_preloads(sm90_builds):
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(DECODE_ORDER).splitlines()]
    assert len(rows) == 4
    for pre, split, before, after in rows:
        assert after > 0
        # Without the preload nothing is read before the wait; with it, the step inputs, the
        # block table and the first K/V tile are (16 KB each for K and V: many vector loads).
        assert (before > 8) if pre else (before == 0), (pre, split, before)


PREP_ORDER = sm90_check("pdl_qkv_prep_order", """
from bench.ptxas_check import _qkv_prep_variants
from bench.sm90_build import compile_sm90
for name, kernel, ptrs, ints, consts, opts, dns in _qkv_prep_variants():
    lines = [l.strip() for l in compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"].splitlines()]
    wait = next(i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait"))
    loads = [i for i, l in enumerate(lines) if "ld.global" in l]
    print(int(consts["HAS_NORM"]), sum(i < wait for i in loads), sum(i > wait for i in loads))
""")


def test_sm90_qkv_prep_loads_its_step_inputs_and_constants_before_the_wait(sm90_builds):
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(PREP_ORDER).splitlines()]
    assert len(rows) == 3
    for norm, before, after in rows:
        # position, slot, cos and sin (and both norm weights) before; the qkv row after
        assert before >= (6 if norm else 4) and after > 0, (norm, before, after)
