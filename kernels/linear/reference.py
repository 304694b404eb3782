"""The fused linear layer in fp32 torch: the contract ``kernels.linear.triton.linear`` meets."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["ACTIVATIONS", "linear"]

_ACTIVATION_FNS = {None: lambda v: v, "gelu": F.gelu, "relu": F.relu, "silu": F.silu}  # gelu: erf form
ACTIVATIONS = tuple(_ACTIVATION_FNS)  # None: no activation


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """``act(x Wᵀ + bias) + residual`` computed in fp32 and returned in fp32 (before any rounding).

    x: ``[*, K]``; weight: ``[N, K]``; bias: ``[N]`` or None; residual: ``[*, N]`` or None.
    """
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    y = _ACTIVATION_FNS[activation](y)
    return y if residual is None else y + residual.float()
