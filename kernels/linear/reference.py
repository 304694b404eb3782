"""The fused linear layer in fp32 torch: the contract ``kernels.linear.triton.linear`` meets.

With ``norm``, x's rows are first normalised without an affine (RMSNorm: x/rms(x); LayerNorm:
(x − mean)/std, biased variance), the norm the kernel folds into its main loop; the norm's own
scale γ and shift β go into the weight and bias once, by ``fold_norm``:
norm(x)·γ·Wᵀ + β·Wᵀ + b = norm₁(x)·(W·diag γ)ᵀ + (b + W·β), norm₁ the unit-affine norm.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kernels.norm import reference as norm_ref

__all__ = ["ACTIVATIONS", "NORMS", "fold_norm", "linear", "weight_sums"]

_ACTIVATION_FNS = {None: lambda v: v, "gelu": F.gelu, "relu": F.relu, "silu": F.silu}  # gelu: erf form
ACTIVATIONS = tuple(_ACTIVATION_FNS)  # None: no activation
NORMS = (None, "rmsnorm", "layernorm")  # the row norm a linear may run on its input (unit affine)


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    norm: str | None = None,
    norm_eps: float = norm_ref.EPS,
) -> Tensor:
    """``act(norm₁(x) Wᵀ + bias) + residual`` computed in fp32 and returned in fp32 (before any rounding).

    x: ``[*, K]``; weight: ``[N, K]``; bias: ``[N]`` or None; residual: ``[*, N]`` or None; norm:
    one of ``NORMS`` (unit affine, over K, fp32, ``norm_eps`` inside the square root).
    """
    v = x.float()
    if norm == "rmsnorm":
        v = norm_ref.rms_norm(v, None, norm_eps)
    elif norm == "layernorm":
        v = norm_ref.layer_norm(v, None, None, norm_eps)
    y = F.linear(v, weight.float(), None if bias is None else bias.float())
    y = _ACTIVATION_FNS[activation](y)
    return y if residual is None else y + residual.float()


def fold_norm(gamma: Tensor, beta: Tensor | None, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The norm's scale ``gamma`` ``[K]`` and shift ``beta`` ``[K]`` (or None) moved into the
    linear after it (``weight`` ``[N, K]``, ``bias`` ``[N]`` or None), in fp32: (W·diag γ,
    b + W·β). A bias appears where there was none only if there is a shift."""
    w = weight.float()
    folded = w * gamma.float()[None, :]
    if beta is None:
        return folded, None if bias is None else bias.float()
    shift = w @ beta.float()
    return folded, shift if bias is None else bias.float() + shift


def weight_sums(weight: Tensor) -> Tensor:
    """Σₖ W[n, k] in fp32 over the weight as stored: the LayerNorm prologue subtracts
    mean(x)·Σₖ W[n, k] from x·Wᵀ, so the sums must be of the rounded weight the matmul reads."""
    return weight.float().sum(1)
