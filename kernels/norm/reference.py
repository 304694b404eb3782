"""LayerNorm and RMSNorm in fp32 torch: the contract ``kernels.norm.triton`` meets.

With a residual, ``h = x + residual`` is rounded to x's dtype (it is the stored residual
stream) and the norm is taken of that ``h``; ``y`` is returned in fp32, before its rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["EPS", "layer_norm", "rms_norm"]

EPS = 1e-5  # nn.LayerNorm's default; the model builds its nn.RMSNorm with it too (nas.models.hybrid)


def _residual_stream(x: Tensor, residual: Tensor | None) -> Tensor:
    return x if residual is None else (x.float() + residual.float()).to(x.dtype)


def layer_norm(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = EPS, *, residual: Tensor | None = None
) -> Tensor | tuple[Tensor, Tensor]:
    """``(h − mean) / √(var + eps) · weight + bias`` over the last dim, biased variance.

    x, residual: ``[*, N]``; weight, bias: ``[N]`` or None (unit scale, no shift). Returns y
    (fp32), or ``(y, h)`` with a residual.
    """
    h = _residual_stream(x, residual)
    v = h.float()
    mean = v.mean(-1, keepdim=True)
    var = (v - mean).pow(2).mean(-1, keepdim=True)
    y = (v - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y if residual is None else (y, h)


def rms_norm(
    x: Tensor, weight: Tensor | None, eps: float = EPS, *, residual: Tensor | None = None
) -> Tensor | tuple[Tensor, Tensor]:
    """``h / √(mean(h²) + eps) · weight`` over the last dim.

    x, residual: ``[*, N]``; weight: ``[N]`` or None (unit scale). Returns y (fp32), or ``(y, h)``
    with a residual.
    """
    h = _residual_stream(x, residual)
    v = h.float()
    y = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y if residual is None else (y, h)
