"""Row norms: LayerNorm and RMSNorm over the last dim, with an optional fused residual add.
``triton`` holds the kernels, ``reference`` the fp32 torch contract they meet, ``configs`` the
launch shapes. The kernels load on first use."""

from kernels._common import lazy_exports
from kernels.norm import configs, reference
from kernels.norm.configs import NormConfig
from kernels.norm.reference import EPS

_KERNELS = ("layer_norm", "rms_norm")
__all__ = [*_KERNELS, "EPS", "NormConfig", "configs", "reference"]
__getattr__ = lazy_exports(__name__, _KERNELS)
