"""Shared fixtures-as-functions: random multi-group problems and a lock-step trajectory runner."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

SHAPES = [(7, 3), (13,), (5, 1, 3), (1,), (2, 9)]  # odd sizes; a scalar-like (1,) param too
SKIPPED = 2  # this param has no grad on every third step (optimizers must leave it alone)
STEPS = 50


def lr_lambda(t: int) -> float:
    """Linear warmup over 5 steps, then cosine to 10%: the lr changes every step."""
    return min(1.0, (t + 1) / 5) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t / STEPS)))


def make_params(dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() for s in SHAPES]


def clone_params(params: list[Tensor]) -> list[Tensor]:
    return [p.detach().clone().requires_grad_() for p in params]


def groups(params: list[Tensor], lr: float, weight_decay: float) -> list[dict]:
    """Two groups with different lr and weight decay; ``decay`` mirrors weight_decay for hooks."""
    return [
        {"params": params[:3], "lr": lr, "weight_decay": weight_decay, "decay": weight_decay},
        {"params": params[3:], "lr": lr * 0.5, "weight_decay": weight_decay * 2, "decay": weight_decay * 2},
    ]


def set_grads(param_sets: list[list[Tensor]], step: int, gen: torch.Generator, scale: float = 1.0) -> None:
    """Give every set the same random grads (``[*]`` like each param); SKIPPED gets None on some steps."""
    first = param_sets[0]
    for i, p in enumerate(first):
        grad = None if (i == SKIPPED and step % 3 == 1) else torch.randn(p.shape, generator=gen) * scale
        for params in param_sets:
            params[i].grad = None if grad is None else grad.to(params[i].dtype)


Hook = Callable[[torch.optim.Optimizer, list[Tensor]], None]


def run_pair(
    make_a: Callable[[list[dict]], torch.optim.Optimizer],
    make_b: Callable[[list[dict]], torch.optim.Optimizer],
    *,
    dtype: torch.dtype,
    lr: float,
    weight_decay: float,
    before_b: Hook | None = None,
    grad_scale: float = 1.0,
    steps: int = STEPS,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Step optimizers ``a`` and ``b`` in lock step on the same grads under a LambdaLR schedule.

    ``before_b(opt_b, params_b)`` runs before each of b's steps (clip, manual decay, ...).
    Returns (initial, params_a, params_b).
    """
    params_a = make_params(dtype)
    params_b = clone_params(params_a)
    initial = clone_params(params_a)
    opt_a = make_a(groups(params_a, lr, weight_decay))
    opt_b = make_b(groups(params_b, lr, weight_decay))
    sched_a = torch.optim.lr_scheduler.LambdaLR(opt_a, lr_lambda)
    sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b, lr_lambda)
    gen = torch.Generator().manual_seed(1)
    for t in range(steps):
        set_grads([params_a, params_b], t, gen, grad_scale)
        opt_a.step()
        if before_b is not None:
            before_b(opt_b, params_b)
        opt_b.step()
        sched_a.step()
        sched_b.step()
    return initial, params_a, params_b


def assert_moved(initial: list[Tensor], params: list[Tensor]) -> None:
    """Guard against vacuous agreement: every param must have changed."""
    for p0, p in zip(initial, params, strict=True):
        assert not torch.equal(p0, p), "a parameter never moved"
