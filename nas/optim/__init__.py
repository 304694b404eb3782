"""The library's optimizers: SGD, AdamW, RAdam and Lion with global-norm clipping, decoupled
weight decay and annealed Gaussian gradient noise, built from a TrainSpec by ``make_optimizer``.

The per-tensor math is ``kernels.optim.reference``; see ``_base`` for the per-group seam a
fused CUDA kernel replaces.
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
