"""What the fp8 kernels share: the storage dtype (e4m3, finite-only: ``torch.float8_e4m3fn``, Triton's
``float8e4nv``), its largest value, and the in-kernel rounding to it.

Every fp8 value is stored as ``fp8(x / scale)`` with an fp32 scale per group (``scale = amax / 448``
over the group, 1 for an all-zero group) and read back as that times the scale (``scaled``);
``nas.models.precision`` scores a candidate at its stored precision by the same function.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["FP8_DTYPE", "FP8_MAX", "scaled", "to_e4m3"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448: e4m3's largest finite value


def scaled(x: torch.Tensor, dims: int | tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` stored in fp8 with one scale per group of the elements along ``dims`` (``-1`` of a
    weight ``[N, K]``: one per output channel, from its K inputs; of activations ``[M, K]``: one
    per token; ``(2, 3)`` of a cache ``[B, H, T, D]``: one per sequence and head): ``(values fp8,
    scales fp32)``, the scales shaped as ``x`` without ``dims``. The one place the rule is written."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    xf = x.float()
    amax = xf.abs().amax(dim=dims, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (xf / scale).to(FP8_DTYPE), scale.squeeze(dims)


@triton.jit
def to_e4m3(x, DTYPE: tl.constexpr):
    """``x`` (fp32, already divided by its scale) saturated at ±448 and rounded to the nearest e4m3
    value, ties to even, as ``DTYPE`` (fp8): the rounding done in fp32 (``(y + 1.5·2^23) − 1.5·2^23`` rounds y to
    an integer, ties to even, for |y| < 2^22), so the cast only re-encodes an exact value. The
    cast alone rounds on a GPU, but Triton's interpreter rounds ties away and loses the carry
    into the exponent (31 → 16)."""
    bits = tl.clamp(x, -448.0, 448.0).to(tl.int32, bitcast=True)
    magnitude = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    exponent = tl.maximum((bits >> 23 & 0xFF) - 127, -6)  # 2^-6: e4m3's smallest normal
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    rounded = ((magnitude / step + 12582912.0) - 12582912.0) * step
    return tl.where(bits < 0, -rounded, rounded).to(DTYPE)  # the sign kept, -0 included
