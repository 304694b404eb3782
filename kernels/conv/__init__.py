"""Short causal depthwise convolution over time (the model's conv over projected qkv):
``triton`` holds the kernel, ``reference`` the fp32 torch contract it meets, ``configs`` the tile
shapes. The kernel loads on first use."""

from kernels._common import lazy_exports
from kernels.conv import configs, reference
from kernels.conv.configs import ConvConfig

_KERNELS = ("causal_depthwise_conv",)
__all__ = [*_KERNELS, "ConvConfig", "configs", "reference"]
__getattr__ = lazy_exports(__name__, _KERNELS)
