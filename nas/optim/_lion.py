"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms")."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from kernels.optim.reference import compute_dtype, lion_step_
from nas.optim._base import GradOptions, GradTransform, OptimizerBase, check_betas, fused_kernels

__all__ = ["Lion"]


class Lion(OptimizerBase):
    """Sign-of-momentum updates with decoupled weight decay, plus the shared gradient pipeline.

    Lion's steps have unit magnitude per element, so its lr is typically 3-10x smaller than
    AdamW's. State per param: ``exp_avg`` (compute dtype). fused: as for AdamW.
    """

    DEFAULT_BETAS: ClassVar[tuple[float, float]] = (0.9, 0.99)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = DEFAULT_BETAS,
        weight_decay: float = 0.0,
        *,
        grad_options: GradOptions = GradOptions(),
        fused: bool | None = None,
    ) -> None:
        check_betas(betas)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), grad_options, fused)

    def _update_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        transform: GradTransform,
    ) -> None:
        beta1, beta2 = group["betas"]
        self._init_states(params, states)
        if transform.fused:
            fused_kernels().lion_step_(
                params,
                grads,
                [state["exp_avg"] for state in states],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                **transform.kernel_args(),
            )
            return
        for p, grad, state in zip(params, grads, states, strict=True):
            lion_step_(
                p,
                transform.apply(grad),
                state["exp_avg"],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
            )

    @staticmethod
    def _init_states(params: list[Tensor], states: list[dict[str, Any]]) -> None:
        for p, state in zip(params, states, strict=True):
            if not state:
                state["exp_avg"] = torch.zeros_like(p, dtype=compute_dtype(p))

    def _row(
        self, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]], noise_std: float, seed: int
    ) -> list[int]:
        self._init_states(params, states)
        beta1, beta2 = group["betas"]
        return fused_kernels().step_row(
            "lion",
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            beta1=beta1,
            beta2=beta2,
            noise_std=noise_std,
            seed=seed,
        )
