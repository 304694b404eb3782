"""The device side of programmatic dependent launch (``kernels._common.pdl`` is the host side).

A kernel launched with ``launch_pdl=True`` may start while the kernel before it in the stream
is still running. Every such kernel calls ``enter(PDL)`` as its first statement, before any
load, store or tensor-descriptor write. With ``PDL`` ≥ 1, ``gdc_wait`` blocks until the previous
grid has finished and its writes are visible (so neither what it wrote nor memory it was still
reading, such as a scratch block the caching allocator hands on, is touched early). The chain is
transitive: a kernel that reads a tensor written two launches back is safe because the launch
between them waited for that one before it could finish. With ``PDL`` = 2,
``gdc_launch_dependents`` then lets the next kernel's programs be scheduled at once, to wait in
their own ``enter`` while this one runs: it pays on small single-wave steps, and costs on
multi-wave grids, whose last waves then share the SMs with waiting programs (the host side asks
for it only within ``pdl_early`` scopes). With ``PDL`` False or 0 (a plain launch, the
interpreter) it is nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["enter"]


@triton.jit
def enter(PDL: tl.constexpr):
    if PDL > 0:
        tl.extra.cuda.gdc_wait()
    if PDL > 1:
        tl.extra.cuda.gdc_launch_dependents()
