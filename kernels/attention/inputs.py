"""What both attention kernels (``kernels/attention``, ``kernels/linear_attention``) require of
their inputs: validation with errors a NAS trial can report, output buffers, and the conditions
for reading through tensor descriptors (Hopper's TMA copy engine).

The kernels build their descriptors in-kernel (``tl.make_tensor_descriptor``): one per (batch,
head) over ``[T, D]`` rows, so a tile load is one bulk copy with no per-element addresses in
registers (plain pointer tiles spilled 200-2000 bytes of stack per thread at the Hopper configs)
and rows past T come back as zeros with no mask. Two conditions follow: the descriptors live in
a small global scratch buffer that Triton asks an allocator for at launch, and every row must
start 16-byte aligned.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

__all__ = ["ALIGN", "DTYPES", "check_heads", "output_buffer", "tma_ready", "use_torch_allocator"]

ALIGN = 16  # bytes: TMA base addresses and row strides
DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # fp32: tf32 matmuls on GPU; for interpreter tests


def check_heads(op: str, q: Tensor, k: Tensor, v: Tensor, *, layout: str, head_dims: tuple[int, ...]) -> None:
    """ValueError unless q, k, v share one shape of ``len(layout)`` dims (``layout`` names them,
    e.g. ``"BHTD"``), a dtype in DTYPES and a device, with a head dim (last) in ``head_dims``."""
    shape = f"[{', '.join(layout)}]"
    if q.dim() != len(layout) or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"{op}: q, k, v must share one {shape} shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[-1] not in head_dims:
        raise ValueError(f"{op}: head dim D={q.shape[-1]} is not supported by the Triton kernel; "
                         f"allowed: {', '.join(map(str, head_dims))}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{op}: q, k, v dtype must be one of {DTYPES} and equal, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"{op}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def output_buffer(op: str, out: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """``out`` after checking it is a contiguous ``shape`` buffer of ``like``'s dtype and device,
    or a new one."""
    if out is None:
        return torch.empty(shape, device=like.device, dtype=like.dtype)
    if out.shape != shape or out.dtype != like.dtype or out.device != like.device or not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous {like.dtype} {list(shape)} on {like.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def _torch_scratch(size: int, alignment: int, stream: int | None) -> Tensor:
    """Triton's launch-time scratch (the descriptors), from torch's caching allocator, so it is
    also graph-safe under CUDA-graph capture. torch's blocks are 512-B aligned ≥ ``alignment``."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def use_torch_allocator() -> None:
    """Route Triton's launch-time scratch allocations through torch (idempotent; any torch-backed
    allocator another module set is equivalent)."""
    triton.set_allocator(_torch_scratch)


def tma_ready(t: Tensor) -> Tensor:
    """``t`` itself when its base and every stride of a non-unit dim but the last are multiples of
    ALIGN bytes and the last dim is contiguous (true of the qkv-projection views for D ≥ 16);
    otherwise a contiguous copy, which is."""
    size = t.element_size()
    aligned = t.data_ptr() % ALIGN == 0 and t.stride(-1) == 1 and all(
        (stride * size) % ALIGN == 0 for n, stride in zip(t.shape[:-1], t.stride()[:-1]) if n > 1)
    if aligned:
        return t
    copy = t.contiguous() if not t.is_contiguous() else t.clone()
    assert copy.data_ptr() % ALIGN == 0 and (copy.shape[-1] * size) % ALIGN == 0, "rows shorter than 16 B"
    return copy
