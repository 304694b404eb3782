"""Fused linear layer: matmul + bias + activation [+ residual] in one Triton launch.

``linear`` is the kernel (``triton.py``); ``reference.linear`` the fp32 torch contract it meets;
``configs`` the tilings it is tuned over.
"""

from kernels.linear.configs import LinearConfig
from kernels.linear.triton import ACTIVATIONS, DTYPES, last_tuned_config, linear

__all__ = ["linear", "last_tuned_config", "LinearConfig", "ACTIVATIONS", "DTYPES"]
