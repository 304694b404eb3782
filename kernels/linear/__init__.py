"""Fused linear layer: matmul + bias + activation [+ residual] in one Triton launch.
``triton`` holds the kernels, ``reference`` the fp32 torch contract they meet, ``configs`` the
tilings they are tuned over. The kernels load on first use."""

from kernels._common import lazy_exports
from kernels.linear import configs, reference
from kernels.linear.configs import LinearConfig
from kernels.linear.reference import ACTIVATIONS

_KERNELS = ("linear", "last_route", "last_tuned_config", "set_route", "set_tma")
__all__ = [*_KERNELS, "ACTIVATIONS", "LinearConfig", "configs", "reference"]
__getattr__ = lazy_exports(__name__, _KERNELS)
