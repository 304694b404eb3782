"""TrainSpec → optimizer: the one place recipe fields meet optimizer arguments."""

from __future__ import annotations

import logging

from torch.optim.optimizer import ParamsT

from nas.optim._adam import AdamW, RAdam
from nas.optim._base import GradOptions, OptimizerBase
from nas.optim._lion import Lion
from nas.optim._sgd import SGD
from nas.spec import TrainSpec

__all__ = ["make_optimizer"]

logger = logging.getLogger(__name__)


def _betas(spec: TrainSpec, defaults: tuple[float, float]) -> tuple[float, float]:
    return (
        defaults[0] if spec.beta1 is None else spec.beta1,
        defaults[1] if spec.beta2 is None else spec.beta2,
    )


def make_optimizer(train_spec: TrainSpec, params: ParamsT) -> OptimizerBase:
    """Build ``train_spec.optimizer`` over ``params`` (tensors or param-group dicts).

    ``beta1``/``beta2`` None take the class's ``DEFAULT_BETAS``; ``grad_clip``, ``grad_noise``,
    ``grad_noise_gamma`` and ``seed`` become :class:`GradOptions`. SGD uses decoupled weight
    decay; ``eps`` applies to AdamW/RAdam, ``momentum``/``nesterov`` to SGD only.
    """
    spec = train_spec
    grad_options = GradOptions(
        max_norm=spec.grad_clip, noise=spec.grad_noise, noise_gamma=spec.grad_noise_gamma, seed=spec.seed
    )
    logger.debug("optimizer %s lr=%g wd=%g %s", spec.optimizer, spec.lr, spec.weight_decay, grad_options)
    if spec.optimizer == "sgd":
        return SGD(
            params,
            lr=spec.lr,
            momentum=spec.momentum,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
            grad_options=grad_options,
        )
    if spec.optimizer == "lion":
        betas = _betas(spec, Lion.DEFAULT_BETAS)
        return Lion(params, lr=spec.lr, betas=betas, weight_decay=spec.weight_decay, grad_options=grad_options)
    adam_cls = {"adamw": AdamW, "radam": RAdam}[spec.optimizer]
    return adam_cls(
        params,
        lr=spec.lr,
        betas=_betas(spec, adam_cls.DEFAULT_BETAS),
        eps=spec.eps,
        weight_decay=spec.weight_decay,
        grad_options=grad_options,
    )
