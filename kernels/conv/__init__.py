"""Short causal depthwise convolution over time (the model's conv over projected qkv).

``causal_depthwise_conv`` is the kernel (``triton.py``); ``reference`` the fp32 torch contract
it meets; ``configs`` the tile shapes.
"""

from kernels.conv.configs import ConvConfig
from kernels.conv.triton import DTYPES, causal_depthwise_conv

__all__ = ["causal_depthwise_conv", "ConvConfig", "DTYPES"]
