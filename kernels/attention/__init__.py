"""Softmax attention forward (prefill): ``triton`` holds the fused kernel, ``reference`` the fp32
torch contract it meets, ``configs`` the launch configs per GPU. The kernels load on first use."""

from kernels._common import lazy_exports
from kernels.attention import configs, reference
from kernels.attention.configs import SUPPORTED_HEAD_DIMS, AttentionConfig, padded_head_dim

_KERNELS = ("flash_attention", "flash_attention_qkv", "flops", "last_route", "last_tuned_config", "set_route")
__all__ = [*_KERNELS, "AttentionConfig", "SUPPORTED_HEAD_DIMS", "padded_head_dim", "configs", "reference"]
__getattr__ = lazy_exports(__name__, _KERNELS)
