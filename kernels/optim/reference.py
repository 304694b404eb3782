"""Optimizer math, one tensor at a time, in plain torch: the contract the fused kernel must meet.

Every update runs in the *compute dtype*: fp32, or fp64 for fp64 params (so tests can compare
tightly). A bf16/fp16 param is upcast, updated, and rounded back once; optimizer state tensors
are always held in the compute dtype. Shapes: ``p``, ``g`` and every state tensor share one
shape ``[*]``; norms and clip scales are 0-dim.

The order of operations copies ``torch.optim``'s single-tensor paths (AdamW, RAdam with
``decoupled_weight_decay=True``, SGD) so results agree to rounding; Lion follows Chen et al.
2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2.

Step functions never write to ``g``; they update ``p`` and the state tensors in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "compute_dtype",
    "global_grad_norm",
    "clip_scale",
    "grad_noise_std",
    "effective_grad",
    "sgd_step_",
    "adamw_step_",
    "radam_step_",
    "lion_step_",
]

_CLIP_EPS = 1e-6  # the same guard torch.nn.utils.clip_grad_norm_ adds to the norm


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype the math and the state use for ``t``: fp64 for fp64, otherwise fp32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def global_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """L2 norm over all elements of all ``grads`` (any shapes), as a 0-dim tensor.

    Accumulates in fp32 (fp64 if any grad is fp64) on the first grad's device, without a host
    sync; NaN or inf anywhere makes the result non-finite. No grads gives a CPU zero.
    """
    if not grads:
        return torch.zeros(())
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g, dtype=dtype).to(device) for g in grads]  # each 0-dim
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_scale(total_norm: Tensor, max_norm: float) -> Tensor:
    """``min(1, max_norm / (total_norm + 1e-6))``, 0-dim, same dtype and device as ``total_norm``.

    Multiplying every grad by it is exactly what ``torch.nn.utils.clip_grad_norm_`` does; a NaN
    norm gives a NaN scale (the caller detects it from the norm, not by branching here).
    """
    return torch.clamp(max_norm / (total_norm + _CLIP_EPS), max=1.0)


def grad_noise_std(eta: float, gamma: float, step: int) -> float:
    """σ_t = sqrt(η / (1 + t)^γ) with t = ``step`` (Neelakantan et al. 2015); 0 when η = 0."""
    return math.sqrt(eta / (1 + step) ** gamma)


def effective_grad(
    grad: Tensor, *, scale: Tensor | None, noise_std: float, generator: torch.Generator | None
) -> Tensor:
    """``grad · scale + noise_std · z`` with ``z ~ N(0, 1)`` drawn from ``generator``.

    grad: ``[*]`` any float dtype, never modified. scale: 0-dim or None (no clipping).
    Returns ``[*]`` in the compute dtype; it may alias ``grad`` when there is nothing to apply,
    so callers must not write to it.
    """
    g = grad.to(compute_dtype(grad))
    if scale is not None:
        g = g * scale
    if noise_std > 0:
        z = torch.randn(g.shape, generator=generator, device=g.device, dtype=g.dtype)
        g = g.add(z, alpha=noise_std)
    return g


def _master(p: Tensor) -> Tensor:
    """``p`` itself when it is already in the compute dtype, else an upcast copy."""
    return p.detach().to(compute_dtype(p))


def _write_back(p: Tensor, master: Tensor) -> None:
    if master.dtype != p.dtype:
        p.detach().copy_(master)


def sgd_step_(
    p: Tensor,
    g: Tensor,
    momentum_buffer: Tensor | None,
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
    decoupled_weight_decay: bool,
) -> None:
    """SGD as ``torch.optim.SGD`` with dampening 0, plus optional decoupled weight decay.

    p: ``[*]`` float param. g: ``[*]`` compute dtype. momentum_buffer: ``[*]`` compute dtype,
    starting at zeros (same as torch's "clone the first grad" since 0·μ + g = g); needed only
    when ``momentum > 0``. Decoupled: ``p ← p·(1 − lr·wd)`` first; coupled: ``g ← g + wd·p``.
    """
    w = _master(p)
    if weight_decay != 0:
        if decoupled_weight_decay:
            w.mul_(1 - lr * weight_decay)
        else:
            g = g.add(w, alpha=weight_decay)
    if momentum != 0:
        assert momentum_buffer is not None, "momentum > 0 needs a momentum buffer"
        momentum_buffer.mul_(momentum).add_(g)
        g = g.add(momentum_buffer, alpha=momentum) if nesterov else momentum_buffer
    w.add_(g, alpha=-lr)
    _write_back(p, w)


def adamw_step_(
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """AdamW (Loshchilov & Hutter 2019) as ``torch.optim.AdamW``.

    p: ``[*]`` float param. g, exp_avg, exp_avg_sq: ``[*]`` compute dtype (moments start at 0).
    step: 1 on the first update of this tensor (bias correction).
    """
    w = _master(p)
    w.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    w.addcdiv_(exp_avg, denom, value=-step_size)
    _write_back(p, w)


def radam_step_(
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """RAdam (Liu et al. 2020) as ``torch.optim.RAdam(decoupled_weight_decay=True)``.

    Same tensors as :func:`adamw_step_`. While the variance is not tractable (ρ_t ≤ 5) the
    update is bias-corrected momentum SGD; afterwards it is Adam times the rectification term.
    """
    w = _master(p)
    w.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction2 = 1 - beta2**step
    update = exp_avg / (1 - beta1**step) * lr
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
    if rho_t > 5.0:
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        update = update * (bias_correction2**0.5 / exp_avg_sq.sqrt().add_(eps)) * rect
    w.sub_(update)
    _write_back(p, w)


def lion_step_(
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
) -> None:
    """Lion, Chen et al. 2023 Alg. 2: ``c = β1·m + (1−β1)·g``; ``p ← p − lr·(sign(c) + wd·p)``;
    ``m ← β2·m + (1−β2)·g``.

    p: ``[*]`` float param. g, exp_avg (m, starts at 0): ``[*]`` compute dtype.
    """
    w = _master(p)
    c = exp_avg * beta1 + g * (1 - beta1)
    w.mul_(1 - lr * weight_decay).add_(torch.sign(c), alpha=-lr)
    exp_avg.mul_(beta2).add_(g, alpha=1 - beta2)
    _write_back(p, w)
