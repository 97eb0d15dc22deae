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
per Triton dtype (`_cache_np_dtypes`), and skips the integer-overflow sanitizer where its
verdict would be dropped (`_skip_unasserted_overflow_checks`).

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
    return True


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
