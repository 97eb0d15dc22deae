"""tests/triton_interpreter.py makes the CPU interpreter cheaper without changing what it
computes or checks: with the interpreter's `debug` on, the overflow sanitizer still fails a
launch whose int32 add overflows (and, as upstream, its verdict is dropped without `debug`),
the cached `_get_np_dtype` answers as the original for every dtype, and shared block shapes
are those upstream builds, with its errors."""

import dataclasses
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the patches are for TRITON_INTERPRET=1")


@triton.jit
def _add(x_ptr, y_ptr, out_ptr):
    i = tl.arange(0, 4)
    tl.store(out_ptr + i, tl.load(x_ptr + i) + tl.load(y_ptr + i))


def test_the_patches_are_installed():
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter
    assert getattr(TritonSemantic.binary_op_sanitize_overflow_impl, "_infer_cluster_wrapped", False)
    assert getattr(interpreter._get_np_dtype, "_infer_cluster_wrapped", False)
    assert getattr(tl.core.block_type.__init__, "_infer_cluster_wrapped", False)


def test_overflow_is_still_caught_with_debug_and_wraps_without(monkeypatch):
    """The interpreter's options have `debug` off (a frozen `InterpreterOptions()`, never
    replaced for a launch in Triton 3.6/3.7), so upstream drops the sanitizer's verdict and an
    overflowing add wraps. With `debug` on, the sanitizer runs and the overflow fails the
    launch, as upstream."""
    from triton.runtime import interpreter
    big = torch.full((4,), 2**31 - 1, dtype=torch.int32)
    one = torch.ones(4, dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    _add[(1,)](one, one, out)
    assert out.tolist() == [2] * 4
    _add[(1,)](big, one, out)  # no debug: wraps, as compiled code does
    assert out.tolist() == [-2**31] * 4
    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    with pytest.raises(Exception, match="overflow"):
        _add[(1,)](big, one, out)
    _add[(1,)](one, one, out)  # no overflow: no complaint
    assert out.tolist() == [2] * 4


def test_cached_np_dtypes_answer_as_the_original():
    from triton.runtime import interpreter
    original = interpreter._get_np_dtype.__closure__  # the wrapper closes over the original
    upstream = next(c.cell_contents for c in original if callable(c.cell_contents)
                    and getattr(c.cell_contents, "__name__", "") == "_get_np_dtype")
    for dtype in (tl.int1, tl.int8, tl.int16, tl.int32, tl.int64, tl.uint8, tl.uint32,
                  tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.pointer_type(tl.float32)):
        for _ in range(2):  # uncached, then cached
            assert interpreter._get_np_dtype(dtype) == upstream(dtype)
    assert isinstance(interpreter._get_np_dtype(tl.float32), np.dtype)


def _upstream(fn, name):
    return next(c.cell_contents for c in fn.__closure__ if callable(c.cell_contents)
                and getattr(c.cell_contents, "__qualname__", "").endswith(name))


def test_shared_block_shapes_are_upstreams_and_keep_its_errors():
    core = tl.core
    core.block_type(tl.float32, [2])  # shared from now on: 2.0 must still be refused below
    block_init = _upstream(core.block_type.__init__, "block_type.__init__")
    tensor_init = _upstream(core.tensor.__init__, "tensor.__init__")
    for element, shape in ((tl.float32, [4, 8]), (tl.int32, [tl.constexpr(16)]), (tl.bfloat16, [1, 2, 4])):
        want = core.block_type.__new__(core.block_type)
        block_init(want, element, shape)
        for _ in range(2):  # built, then shared
            got = core.block_type(element, shape)
            assert (list(got.shape), got.numel, got.name, str(got)) == (list(want.shape), want.numel,
                                                                         want.name, str(want))
            assert got == want and got.is_block() and got.scalar == element
            t = core.tensor(None, got)
            u = core.tensor.__new__(core.tensor)
            tensor_init(u, None, want)
            assert ([s.value for s in t.shape], t.numel.value, t.dtype, str(t)) == \
                ([s.value for s in u.shape], u.numel.value, u.dtype, str(u))
    for bad, error in (([3], ValueError), ([2.0], TypeError), ([], TypeError)):
        for _ in range(2):  # never cached
            with pytest.raises(error):
                core.block_type(tl.float32, bad)
    for scalar_type in (tl.float32, tl.int64, tl.pointer_type(tl.float16)):  # not blocks
        got = core.tensor(None, scalar_type)
        want = core.tensor.__new__(core.tensor)
        tensor_init(want, None, scalar_type)
        assert (list(got.shape), got.numel.value, got.dtype, got.type, str(got)) == \
            (list(want.shape), want.numel.value, want.dtype, want.type, str(want))
        assert isinstance(got.shape, core.tuple)
