"""Programmatic dependent launch for Gluon kernels: the twin of `pdl_release` / `pdl_wait`
(kernels/pdl.py, where the rules are), as inline PTX.

Owns: `pdl_gluon(ENABLED, WAIT)`: with ENABLED, WAIT blocks until the previous kernel's writes are
visible (`griddepcontrol.wait`), otherwise lets the next kernel launch
(`griddepcontrol.launch_dependents`); without ENABLED, nothing.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def pdl_gluon(ENABLED: gl.constexpr, WAIT: gl.constexpr):
    if ENABLED:
        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)
