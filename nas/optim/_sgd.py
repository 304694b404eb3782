"""SGD with momentum / Nesterov and coupled or decoupled weight decay."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from kernels.optim.reference import compute_dtype, sgd_step_
from nas.optim._base import GradOptions, GradTransform, OptimizerBase, check, fused_kernels

__all__ = ["SGD"]


class SGD(OptimizerBase):
    """``torch.optim.SGD`` (dampening 0) with the shared gradient pipeline.

    ``decoupled_weight_decay=True`` (default) shrinks ``p ← p·(1 − lr·wd)`` before the step;
    False adds ``wd·p`` to the gradient exactly as ``torch.optim.SGD(weight_decay=wd)``.
    State per param: ``momentum_buffer`` (compute dtype, only when momentum > 0).
    fused: as for AdamW.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.0,
        *,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = True,
        grad_options: GradOptions = GradOptions(),
        fused: bool | None = None,
    ) -> None:
        check(momentum >= 0, f"momentum must be >= 0, got {momentum}")
        check(not nesterov or momentum > 0, "nesterov=True needs momentum > 0")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults, grad_options, fused)

    def _update_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        transform: GradTransform,
    ) -> None:
        momentum = group["momentum"]
        self._init_states(params, states, momentum)
        if transform.fused:
            fused_kernels().sgd_step_(
                params,
                grads,
                [state["momentum_buffer"] for state in states] if momentum != 0 else None,
                lr=group["lr"],
                momentum=momentum,
                nesterov=group["nesterov"],
                weight_decay=group["weight_decay"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
                **transform.kernel_args(),
            )
            return
        for p, grad, state in zip(params, grads, states, strict=True):
            sgd_step_(
                p,
                transform.apply(grad),
                state.get("momentum_buffer"),
                lr=group["lr"],
                momentum=momentum,
                nesterov=group["nesterov"],
                weight_decay=group["weight_decay"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
            )

    @staticmethod
    def _init_states(params: list[Tensor], states: list[dict[str, Any]], momentum: float) -> None:
        for p, state in zip(params, states, strict=True):
            if momentum != 0 and "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=compute_dtype(p))

    def _row(
        self, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]], noise_std: float, seed: int
    ) -> list[int]:
        self._init_states(params, states, group["momentum"])
        return fused_kernels().step_row(
            "sgd",
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            noise_std=noise_std,
            seed=seed,
        )
