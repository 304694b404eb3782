"""What the op folders share, defined once: the dtypes the kernels take, the interpreter flag,
the head dims the attention-style kernels run, input checks with errors a NAS trial can report,
output buffers, and the conditions for reading through tensor descriptors (Hopper's TMA).

Tensor descriptors. The attention-style kernels and the linear kernel's TMA path build their
descriptors in-kernel (``tl.make_tensor_descriptor``), so a tile load is one bulk copy with no
per-element addresses in registers (plain pointer tiles spilled 200-2000 bytes of stack per
thread at the attention kernels' Hopper configs) and rows past the end come back as zeros with
no mask. Two conditions follow: the descriptors live in a small global scratch buffer that
Triton asks an allocator for at launch (``use_torch_allocator``), and every row must start
16-byte aligned (``ALIGN``, ``tma_ready``).

Importing this module imports torch, not Triton: the op folders' ``configs`` and ``reference``
modules use it, and the CPU training path must not pay for Triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import Tensor

from kernels import device

__all__ = [
    "ALIGN",
    "DTYPES",
    "INT32_MAX",
    "INTERPRETED",
    "Routes",
    "SUPPORTED_HEAD_DIMS",
    "as_rows",
    "check_heads",
    "check_int32",
    "check_operands",
    "check_runnable",
    "lazy_exports",
    "output_buffer",
    "padded_head_dim",
    "pdl",
    "pdl_early",
    "set_pdl",
    "sm_count",
    "tma_ready",
    "use_torch_allocator",
]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # fp32: tf32 matmuls on GPU; for interpreter tests
INT32_MAX = 2**31 - 1  # the kernels' offsets are int32 products: every tensor must index below this
ALIGN = 16  # bytes: TMA base addresses and row strides
# tl.dot needs every matmul dim ≥ 16 and tl.arange a power of two; 256 would spill the attention
# kernel's fp32 accumulator at 128-row tiles and the linear-attention kernel's [D, block_v] state
# tile. Both attention kernels (softmax and linear) run these.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)


INTERPRETED: bool  # read on first use: see _interpreted


class Routes:
    """A kernel family's per-process route override and the route its latest call took (what a
    family's ``set_route`` / ``last_route`` expose). ``forced``: the route ``set`` chose, None for
    the family's own per-shape rule."""

    def __init__(self, op: str, routes: tuple[str, ...]) -> None:
        self.op, self.routes = op, routes
        self.forced: str | None = None
        self._last: str | None = None

    def set(self, route: str | None) -> None:
        if route not in (None, *self.routes):
            raise ValueError(f"{self.op} set_route: route must be None or one of {self.routes}, got {route!r}")
        self.forced = route

    def took(self, route: str) -> str:
        self._last = route
        return route

    def last(self) -> str | None:
        return self._last


def _interpreted() -> bool:
    """``INTERPRETED``: whether Triton runs kernels under its interpreter (TRITON_INTERPRET=1, CPU
    tensors). Read once, when the first kernel module imports it just before decorating its
    kernels, as Triton reads it when it decorates: a test must set TRITON_INTERPRET before that."""
    if "INTERPRETED" not in globals():
        import triton  # noqa: PLC0415 (only kernel modules ask, and they import Triton anyway)

        globals()["INTERPRETED"] = bool(triton.knobs.runtime.interpret)
    return globals()["INTERPRETED"]


def __getattr__(name: str) -> bool:
    """``INTERPRETED`` on first use (see ``_interpreted``), so importing this module needs no Triton."""
    if name == "INTERPRETED":
        return _interpreted()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lazy_exports(package: str, names: Iterable[str]) -> Callable[[str], object]:
    """An op folder's ``__getattr__`` (PEP 562): ``names`` resolve from its ``triton`` module on
    first use. Importing the folder (its configs, its reference) so decorates no kernel: under
    test that must wait for TRITON_INTERPRET, and the CPU training path never needs one."""
    lazy = frozenset(names)

    def __getattr__(name: str) -> object:
        if name not in lazy:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.triton"), name)

    return __getattr__


def padded_head_dim(head_dim: int) -> int | None:
    """The head dim the attention kernels (softmax and linear) run ``head_dim`` as: the smallest
    of SUPPORTED_HEAD_DIMS at least as large (a model's smaller heads are zero-padded up to it,
    exactly); None when no kernel runs it: an odd head dim, or one above the largest."""
    if head_dim % 2:
        return None
    return next((s for s in SUPPORTED_HEAD_DIMS if s >= head_dim), None)


def check_runnable(op: str, x: Tensor) -> None:
    """ValueError unless ``x`` is where the kernels run: on CUDA, or anywhere under the interpreter."""
    if not (x.is_cuda or _interpreted()):
        raise ValueError(f"{op}: x is on {x.device}; the kernel needs CUDA tensors (or TRITON_INTERPRET=1)")


def check_operands(op: str, device: torch.device, *operands: tuple[str, Tensor | None, tuple[int, ...]]) -> None:
    """ValueError unless each ``(name, tensor, shape)`` (a None tensor is skipped) has that shape,
    a dtype in DTYPES and ``device``."""
    for name, t, shape in operands:
        if t is None:
            continue
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{op}: {name} must have shape {list(shape)}, got {list(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{op}: {name}.dtype must be one of {DTYPES}, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device}, x on {device}")


def check_int32(op: str, name: str, t: Tensor) -> None:
    """ValueError when ``t`` has more elements than int32 offsets can index."""
    if t.numel() > INT32_MAX:
        raise ValueError(f"{op}: {name} has {t.numel()} elements; the kernel indexes with int32 (< 2**31)")


def check_heads(op: str, q: Tensor, k: Tensor, v: Tensor, *, layout: str) -> None:
    """ValueError unless q, k, v share one shape of ``len(layout)`` dims (``layout`` names them,
    e.g. ``"BHTD"``), a dtype in DTYPES and a device, with a head dim (last) in SUPPORTED_HEAD_DIMS."""
    shape = f"[{', '.join(layout)}]"
    if q.dim() != len(layout) or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"{op}: q, k, v must share one {shape} shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"{op}: head dim D={q.shape[-1]} is not supported by the Triton kernel; "
            f"allowed: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}"
        )
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{op}: q, k, v dtype must be one of {DTYPES} and equal, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"{op}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def output_buffer(op: str, out: Tensor | None, shape: tuple[int, ...], like: Tensor, name: str = "out") -> Tensor:
    """``out`` after checking it is a contiguous ``shape`` buffer of ``like``'s dtype and device,
    or a new one (``name`` is the argument's, for the error)."""
    if out is None:
        return torch.empty(shape, device=like.device, dtype=like.dtype)
    if (
        tuple(out.shape) != tuple(shape)
        or out.dtype != like.dtype
        or out.device != like.device
        or not out.is_contiguous()
    ):
        raise ValueError(
            f"{op}: {name} must be a contiguous {like.dtype} tensor of shape {list(shape)} on "
            f"{like.device}, got {out.dtype} {list(out.shape)} on {out.device}"
        )
    return out


def as_rows(t: Tensor, n: int) -> Tensor:
    """``t`` as ``[rows, n]`` with unit stride along n (a view when it already is)."""
    t = t.reshape(-1, n)
    return t if t.stride(1) == 1 else t.contiguous()


sm_count = functools.cache(device.sm_count)  # per launch (persistent and split grids): asked once per GPU


_PDL_FORCED: list[bool | str | None] = [None]  # set_pdl's choice; None: the launch scope's
_PDL_EARLY: contextvars.ContextVar[bool] = contextvars.ContextVar("pdl_early", default=False)


def set_pdl(use: bool | str | None) -> None:
    """Programmatic dependent launch for the process, wherever the GPU and Triton have it (see
    ``pdl``): None or True (the default) as ``pdl_early`` scopes say, False never, "wait" or
    "early" everywhere in that form."""
    if use not in (None, True, False, "wait", "early"):
        raise ValueError(f"set_pdl: use must be None, True, False, 'wait' or 'early', got {use!r}")
    _PDL_FORCED[0] = use


@contextlib.contextmanager
def pdl_early(early: bool) -> Iterator[None]:
    """Within the block, kernels launched with PDL let the next launch be scheduled as soon as all
    their programs have started (``early``) or only when they end. ``TritonModel`` opens one per
    forward and decoding step, early where the step is small enough for it to pay."""
    token = _PDL_EARLY.set(bool(early))
    try:
        yield
    finally:
        _PDL_EARLY.reset(token)


@functools.cache
def _pdl_capable(index: int) -> bool:
    import triton.language as tl  # noqa: PLC0415 (see the module docstring)

    return torch.cuda.get_device_capability(index) >= (9, 0) and hasattr(tl.extra.cuda, "gdc_wait")


def pdl(t: Tensor) -> dict[str, int | bool]:
    """The launch keywords that make a kernel on ``t``'s device a programmatic dependent launch
    (PDL, sm_90+): Triton's ``launch_pdl`` and the kernel's ``PDL`` constexpr, which its first
    statement (``kernels._pdl.enter``) reads: 1, wait for the launch before it to finish; 2, also
    let the next launch be scheduled now (``pdl_early``). Empty (a plain launch) off sm_90, under
    the interpreter, or after ``set_pdl(False)``. What it buys: in a forward of ~30 small
    dependent launches (a model at 1×256), the next kernel is launched, and with 2 resident and
    waiting, when the previous one ends (docs/benchmarks.md, earlier experiments)."""
    forced = _PDL_FORCED[0]
    if forced is False or _interpreted() or not device.is_cuda(t.device):
        return {}
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _pdl_keywords() if _pdl_capable(index) else {}


def after_library(t: Tensor) -> dict[str, int | bool]:
    """The launch keywords for a kernel on ``t``'s device launched right after a library kernel
    (cuBLAS's matmul in the linear's cuBLAS route): ``pdl``'s inside a ``pdl_early`` scope (the
    early trigger), a plain launch elsewhere: after cuBLAS's kernels PDL pays only inside the scope
    (a small model's chain of launches) and costs a little outside it (docs/benchmarks.md, earlier experiments)."""
    keywords = pdl(t)
    return keywords if keywords.get("PDL") == 2 else {}


def _pdl_keywords() -> dict[str, int | bool]:
    """``pdl``'s keywords on a GPU that has PDL, as ``set_pdl`` and the ``pdl_early`` scope say."""
    forced = _PDL_FORCED[0]
    early = forced == "early" or (forced != "wait" and _PDL_EARLY.get())
    return {"PDL": 2 if early else 1, "launch_pdl": True}


def _torch_scratch(size: int, alignment: int, stream: int | None) -> Tensor:
    """Triton's launch-time scratch (the descriptors), from torch's caching allocator, so it is
    also graph-safe under CUDA-graph capture. torch's blocks are 512-B aligned ≥ ``alignment``."""
    return torch.empty(size, dtype=torch.int8, device=device.CUDA)


def use_torch_allocator() -> None:
    """Route Triton's launch-time scratch allocations through torch (idempotent; any torch-backed
    allocator another module set is equivalent)."""
    import triton  # noqa: PLC0415 (see the module docstring)

    triton.set_allocator(_torch_scratch)


def tma_ready(t: Tensor) -> Tensor:
    """``t`` itself when its base and every stride of a non-unit dim but the last are multiples of
    ALIGN bytes and the last dim is contiguous (true of the qkv-projection views for D ≥ 16);
    otherwise a contiguous copy, which is."""
    size = t.element_size()
    aligned = (
        t.data_ptr() % ALIGN == 0
        and t.stride(-1) == 1
        and all((stride * size) % ALIGN == 0 for n, stride in zip(t.shape[:-1], t.stride()[:-1], strict=True) if n > 1)
    )
    if aligned:
        return t
    copy = t.contiguous() if not t.is_contiguous() else t.clone()
    assert copy.data_ptr() % ALIGN == 0 and (copy.shape[-1] * size) % ALIGN == 0, "rows shorter than 16 B"
    return copy
