"""Causal depthwise convolution in fp32 torch: the contract ``kernels.conv.triton`` meets."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["causal_depthwise_conv"]


def causal_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y[b, t, c] = bias[c] + Σ_j weight[c, j] · x[b, t − (K−1) + j, c]``, zeros before t = 0, in fp32.

    x: ``[B, T, C]``; weight: ``[C, K]``; bias: ``[C]`` or None. Returns fp32 ``[B, T, C]``.
    """
    T, K = x.shape[1], weight.shape[1]
    padded = F.pad(x.float(), (0, 0, K - 1, 0))  # [B, K − 1 + T, C]: K − 1 zero steps before t = 0
    y = sum(padded[:, j : j + T] * weight[:, j].float() for j in range(K))
    return y if bias is None else y + bias.float()


def causal_conv_step_ref(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """One token of ``causal_depthwise_conv``: x ``[B, C]`` after the K − 1 inputs in ``state
    [B, K − 1, C]`` (oldest first) → fp32 ``[B, C]``; shifts ``state`` in place (drops the oldest,
    appends x)."""
    window = F.pad(state.float(), (0, 0, 0, 1))  # [B, K, C]: the last K inputs, x last
    window[:, -1] = x.float()
    y = causal_depthwise_conv(window, weight, bias)[:, -1]
    state.copy_(window[:, 1:])
    return y
