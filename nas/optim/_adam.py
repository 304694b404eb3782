"""AdamW and RAdam: the same moments and state, two update rules."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from kernels.optim.reference import adamw_step_, compute_dtype, radam_step_
from nas.optim._base import GradOptions, GradTransform, OptimizerBase, check, check_betas, fused_kernels

__all__ = ["AdamW", "RAdam"]


class _Adam(OptimizerBase):
    """Adam-family state per param: ``step`` (int, updates of this tensor so far), ``exp_avg``
    and ``exp_avg_sq`` (compute dtype); decoupled weight decay ``p ← p·(1 − lr·wd)``.

    fused: None runs CUDA groups through the fused kernel (unless NAS_OPTIM_FUSED=0), False
    never, True always (see ``nas.optim._base``)."""

    DEFAULT_BETAS: ClassVar[tuple[float, float]] = (0.9, 0.999)
    _step_fn = staticmethod(adamw_step_)
    _fused_step: ClassVar[str] = "adamw_step_"  # its multi-tensor twin in kernels.optim.triton

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_options: GradOptions,
        fused: bool | None,
    ) -> None:
        check(eps >= 0, f"eps must be >= 0, got {eps}")
        check_betas(betas)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, grad_options, fused)

    def _update_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        transform: GradTransform,
    ) -> None:
        beta1, beta2 = group["betas"]
        if transform.row is None:  # else ``_row`` did this
            self._advance(params, states)
        if transform.fused:
            getattr(fused_kernels(), self._fused_step)(
                params,
                grads,
                [state["exp_avg"] for state in states],
                [state["exp_avg_sq"] for state in states],
                [state["step"] for state in states],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                **transform.kernel_args(),
            )
            return
        for p, grad, state in zip(params, grads, states, strict=True):
            self._step_fn(
                p,
                transform.apply(grad),
                state["exp_avg"],
                state["exp_avg_sq"],
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                step=state["step"],
            )

    @staticmethod
    def _advance(params: list[Tensor], states: list[dict[str, Any]]) -> None:
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, dtype=compute_dtype(p))
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=compute_dtype(p))
            state["step"] += 1

    def _row(
        self, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]], noise_std: float, seed: int
    ) -> list[int]:
        self._advance(params, states)
        steps = {state["step"] for state in states}
        check(len(steps) == 1, "rows in memory need every param of a group at the same step")
        beta1, beta2 = group["betas"]
        return fused_kernels().step_row(
            self._fused_step.removesuffix("_step_"),
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            step=steps.pop(),
            noise_std=noise_std,
            seed=seed,
        )


class AdamW(_Adam):
    """``torch.optim.AdamW`` (no amsgrad) with the shared gradient pipeline."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = _Adam.DEFAULT_BETAS,
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        grad_options: GradOptions = GradOptions(),
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, grad_options, fused)


class RAdam(_Adam):
    """``torch.optim.RAdam(decoupled_weight_decay=True)`` with the shared gradient pipeline."""

    _step_fn = staticmethod(radam_step_)
    _fused_step = "radam_step_"

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = _Adam.DEFAULT_BETAS,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        grad_options: GradOptions = GradOptions(),
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, grad_options, fused)
