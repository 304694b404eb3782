"""Optimizer steps: ``triton`` holds the fused multi-tensor kernels, ``reference`` the per-tensor
math (fp32 torch) that every path matches, ``configs`` the launch configs. The kernels load on
first use (importing them decorates them, which in tests must happen after TRITON_INTERPRET is
set; the reference path never needs Triton)."""

from kernels._common import lazy_exports
from kernels.optim import configs, reference
from kernels.optim.configs import StepConfig

_KERNELS = ("PARAM_DTYPES", "supports", "grad_norm", "sgd_step_", "adamw_step_", "radam_step_", "lion_step_")
__all__ = [*_KERNELS, "StepConfig", "configs", "reference"]
__getattr__ = lazy_exports(__name__, _KERNELS)
