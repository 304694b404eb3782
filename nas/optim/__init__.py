"""The library's optimizers: SGD, AdamW, RAdam and Lion with global-norm clipping, decoupled
weight decay and annealed Gaussian gradient noise, built from a TrainSpec by ``make_optimizer``.

The per-tensor math is ``kernels.optim.reference``; on CUDA each param group is updated by one
launch of the fused Triton kernel in ``kernels.optim.triton`` (``fused=False`` or
``NAS_OPTIM_FUSED=0`` keeps the reference path; see ``_base``).
"""

from nas.optim._adam import AdamW, RAdam
from nas.optim._base import GradOptions, OptimizerBase
from nas.optim._factory import make_optimizer
from nas.optim._lion import Lion
from nas.optim._sgd import SGD

__all__ = [
    "OptimizerBase",
    "GradOptions",
    "SGD",
    "AdamW",
    "RAdam",
    "Lion",
    "make_optimizer",
]
