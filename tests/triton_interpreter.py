"""Make the Triton interpreter (TRITON_INTERPRET=1, how the CPU suite runs every kernel) cheaper
without changing what it computes.

The interpreter redirects `triton.language`'s builtins to numpy for each kernel launch
(`_patch_lang`, undone when the launch ends). It also calls `_patch_lang` again on every call of
a `@triton.jit` helper from inside a kernel, although the modules it patches are the ones the
launch already patched: `inspect.getmembers` over three modules per helper call, about a
quarter of the interpreter's time in our kernels. `install()` skips that repeat when the
helper's modules are among those the running launch patched (a helper whose module sees a
language module the launch did not patch is patched as upstream does). Launches behave exactly
as before: the same patches, restored at the same point. It also keeps `_get_np_dtype`'s answer
per Triton dtype (`_cache_np_dtypes`), skips the integer-overflow sanitizer where its
verdict would be dropped (`_skip_unasserted_overflow_checks`), and builds each block type's
shape once per (element type, shape) (`_share_block_shapes`).

Test infrastructure only: nothing under worker/ or kernels/ imports it. A Triton without the
private functions this relies on is left alone (the suite is then only slower).
"""

from __future__ import annotations

import inspect


class _NothingToRestore:
    def restore(self) -> None:
        pass


def install() -> bool:
    """Wrap the interpreter's `_patch_lang`; True when installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "_infer_cluster_wrapped", False):
        return False
    launches: list[frozenset] = []  # ids of the language modules each running launch patched
    seen: dict = {}  # id(module globals) -> the language modules it sees (imports do not change)

    def langs_of(fn) -> frozenset:
        key = id(fn.__globals__)
        langs = seen.get(key)
        if langs is None:
            langs = seen[key] = frozenset(id(v) for v in fn.__globals__.values()
                                          if inspect.ismodule(v) and v in (tl, tl.core))
        return langs

    def patch_lang(fn):
        langs = langs_of(fn)
        if launches and langs <= launches[-1]:
            return _NothingToRestore()  # a helper call inside a launch: already patched
        scope = original(fn)
        if launches:  # a helper that sees more: upstream patches it and never restores it
            launches[-1] = launches[-1] | langs
            return scope
        launches.append(langs)  # a launch: its scope is restored when the launch ends
        restore = scope.restore

        def restore_launch():
            launches.pop()
            restore()

        scope.restore = restore_launch
        return scope

    patch_lang._infer_cluster_wrapped = True
    interpreter._patch_lang = patch_lang
    _cache_np_dtypes(interpreter)
    _skip_unasserted_overflow_checks()
    _share_block_shapes()
    return True


def _share_block_shapes() -> None:
    """Every value an interpreted kernel makes is a `tl.tensor` of a `tl.block_type`, and both
    build their shape afresh: the block type a `tl.tuple` of ints (with a tuple type of
    constexpr types), its name by string formatting, its element count; the tensor a `tl.tuple`
    of `constexpr`s. That was ~15% of the CPU time of tests/kernels/test_attention_int8.py and
    tests/parity/test_norm_fuse.py (47.7 s against 40.4 s). These depend only on the element
    type and the shape, and nothing mutates them, so a block type of an (element type, shape)
    seen before takes the same objects, and its tensors take the same constexpr shape; a
    scalar tensor takes one shared empty shape. Shapes of anything but ints and unhashable
    keys go through upstream's code."""
    try:
        import triton.language.core as core
    except ImportError:
        return
    block_type, tensor = core.block_type, core.tensor
    if getattr(block_type.__init__, "_infer_cluster_wrapped", False):
        return
    original_block, original_tensor = block_type.__init__, tensor.__init__
    constexpr, base_init = core.constexpr, core.base_value.__init__
    shapes: dict = {}  # (element type, shape as ints) -> (shape, numel, name, constexpr shape)

    def block_init(self, element_ty, shape):
        dims = tuple([s.value if s.__class__ is constexpr else s for s in shape])
        for d in dims:
            if d.__class__ is not int:  # 2.0 would hash as 2: upstream decides
                return original_block(self, element_ty, shape)
        key = (element_ty, dims)
        try:
            seen = shapes.get(key)
        except TypeError:  # an unhashable element type: as upstream
            return original_block(self, element_ty, shape)
        if seen is None:
            original_block(self, element_ty, shape)
            seen = shapes[key] = (self.shape, self.numel, self.name,
                                  core.tuple([constexpr(s) for s in self.shape]))
        else:
            self.element_ty = element_ty
            self.shape, self.numel, self.name = seen[0], seen[1], seen[2]
        self._infer_cluster_shape = seen[3]

    no_shape = core.tuple([])  # a scalar's shape, as upstream builds it (and never changes)

    def tensor_init(self, handle, type):
        shape = getattr(type, "_infer_cluster_shape", None)
        if shape is None:
            if type.is_block():  # a block type built before the patch: as upstream
                return original_tensor(self, handle, type)
            shape, numel = no_shape, 1
        else:
            numel = type.numel
        base_init(self)
        self.handle = handle
        self.numel = constexpr(numel)
        self.type = type
        self.dtype = type.scalar
        self.shape = shape

    block_init._infer_cluster_wrapped = True
    block_type.__init__ = block_init
    tensor.__init__ = tensor_init


def _skip_unasserted_overflow_checks() -> None:
    """Every 32-bit integer add, sub and mul in an interpreted kernel runs Triton's overflow
    sanitizer (`binary_op_sanitize_overflow_impl`: casts to int64, the op again, two compares),
    then hands its verdict to `device_assert`, which does nothing unless the kernel runs with
    `debug` on. Without `debug` that work has no effect, yet it took ~30% of an interpreted
    kernel's time (tests/parity/test_norm_fuse.py, cProfile). It is skipped only then: with
    `debug` the sanitizer runs and asserts as upstream."""
    try:
        from triton.language.semantic import TritonSemantic
    except ImportError:
        return
    original = getattr(TritonSemantic, "binary_op_sanitize_overflow_impl", None)
    if original is None or getattr(original, "_infer_cluster_wrapped", False):
        return

    def sanitize(self, lhs, rhs, binary_op):
        options = self.builder.options
        if not getattr(options, "debug", True):  # device_assert would drop the verdict
            return None
        return original(self, lhs, rhs, binary_op)

    sanitize._infer_cluster_wrapped = True
    TritonSemantic.binary_op_sanitize_overflow_impl = sanitize


def _cache_np_dtypes(interpreter) -> None:
    """`_get_np_dtype(tt_dtype)` builds a table of twenty numpy dtypes (hashing twenty Triton
    dtypes) on every call, and the interpreter calls it for most values it makes: about 8% of
    an interpreted kernel's time (tests/parity/test_norm_fuse.py). Its answer depends only on
    the Triton dtype, so it is kept per dtype."""
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or getattr(original, "_infer_cluster_wrapped", False):
        return
    cache: dict = {}

    def get_np_dtype(tt_dtype):
        try:
            return cache[tt_dtype]
        except KeyError:
            result = cache[tt_dtype] = original(tt_dtype)
            return result
        except TypeError:  # an unhashable dtype: as upstream
            return original(tt_dtype)

    get_np_dtype._infer_cluster_wrapped = True
    interpreter._get_np_dtype = get_np_dtype
