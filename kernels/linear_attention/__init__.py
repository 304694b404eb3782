"""Causal linear attention: ``triton`` holds the chunked forward and the decode step (import it
where Triton can run), ``reference`` the fp32 torch contract, ``configs`` the launch configs."""

from kernels.linear_attention.configs import SUPPORTED_HEAD_DIMS, ChunkConfig, StepConfig, chunk_configs, step_config
from kernels.linear_attention.reference import EPS, FEATURE_MAPS, feature, linear_attention, step

__all__ = ["SUPPORTED_HEAD_DIMS", "ChunkConfig", "StepConfig", "chunk_configs", "step_config", "EPS", "FEATURE_MAPS",
           "feature", "linear_attention", "step"]
