"""Causal linear attention: ``triton`` holds the chunked forward and the decode step,
``reference`` the fp32 torch contract (and the op's feature maps and constants), ``configs`` the
launch configs. The kernels load on first use."""

from kernels._common import lazy_exports
from kernels.linear_attention import configs, reference
from kernels.linear_attention.configs import SUPPORTED_HEAD_DIMS, ChunkConfig, StepConfig, padded_head_dim
from kernels.linear_attention.reference import FEATURE_MAPS

_KERNELS = (
    "linear_attention",
    "linear_attention_qkv",
    "linear_attention_step",
    "last_route",
    "last_tuned_config",
    "set_route",
)
__all__ = [
    *_KERNELS,
    "FEATURE_MAPS",
    "SUPPORTED_HEAD_DIMS",
    "ChunkConfig",
    "StepConfig",
    "padded_head_dim",
    "configs",
    "reference",
]
__getattr__ = lazy_exports(__name__, _KERNELS)
