"""Row norms: LayerNorm and RMSNorm over the last dim, with an optional fused residual add.

``layer_norm`` / ``rms_norm`` are the kernels (``triton.py``); ``reference`` holds the fp32
torch contract they meet; ``configs`` the launch shapes.
"""

from kernels.norm.configs import NormConfig
from kernels.norm.triton import DTYPES, layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm", "NormConfig", "DTYPES"]
