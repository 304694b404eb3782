"""Softmax attention forward: ``triton`` holds the fused kernel (import it where Triton can run),
``reference`` the fp32 torch contract, ``configs`` the launch configs per GPU."""

from kernels.attention.configs import SUPPORTED_HEAD_DIMS, AttentionConfig, attention_configs
from kernels.attention.reference import attention, rope

__all__ = ["SUPPORTED_HEAD_DIMS", "AttentionConfig", "attention_configs", "attention", "rope"]
