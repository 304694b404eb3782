"""Launch configs for the flash-attention forward kernel (``kernels/attention/triton.py``).

A program owns ``block_m`` query rows of one (batch, head) and walks the key/value blocks of
``block_n`` rows. Per key block it does two ``[block_m, block_n, D]`` matmuls on the tensor cores,
so larger tiles raise arithmetic intensity (K and V are re-read once per query block:
``T / block_m`` times) until registers run out: the fp32 accumulator ``[block_m, D]`` and scores
``[block_m, block_n]`` live in registers, which bounds ``block_m · (D + block_n)`` per warp count.
``num_stages`` is the software-pipelining depth of the K/V loads (shared-memory buffers).

Hopper first: these are the shapes the Triton fused-attention tutorial finds best on sm_90
(128-row query tiles, 8 warps once the tile is 128×128) plus one smaller neighbour each, so the
autotuner picks per head dim and length on the device at hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common import SUPPORTED_HEAD_DIMS, padded_head_dim
from kernels.device import is_cuda

__all__ = [
    "AttentionConfig",
    "HOPPER",
    "DEFAULT",
    "INTERPRETER",
    "SUPPORTED_HEAD_DIMS",
    "attention_configs",
    "padded_head_dim",
]


@dataclass(frozen=True)
class AttentionConfig:
    """block_m: query rows per program; block_n: key rows per inner step (block_m % block_n == 0,
    so the causal diagonal is whole key blocks); num_warps, num_stages: as in ``triton.Config``."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"AttentionConfig.{name} must be a power of two >= 16, got {value}")
        if self.block_m % self.block_n:
            raise ValueError(f"AttentionConfig.block_m ({self.block_m}) must be a multiple of block_n ({self.block_n})")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"AttentionConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")


# sm_90, per head dim. Measured on an H200 (torch 2.11, triton 3.6, causal bf16, B·L = 16384,
# benchmarks/results/kernels_attention.json): the tuner took 128/64/4w/4s at D = 64 and
# 128/128/8w/3s at D = 128 for every L in 1024-4096 (with RoPE at D = 128: 128/64/8w/3s, as the
# 128×128 tile then needs 256 KB of shared memory and is skipped); 229-399 TFLOP/s.
HOPPER: dict[int, tuple[AttentionConfig, ...]] = {
    16: (AttentionConfig(128, 64, 4, 3), AttentionConfig(64, 64, 4, 3)),
    32: (AttentionConfig(128, 64, 4, 3), AttentionConfig(128, 128, 8, 3)),
    64: (AttentionConfig(128, 128, 8, 3), AttentionConfig(128, 64, 4, 4)),
    128: (AttentionConfig(128, 128, 8, 3), AttentionConfig(128, 64, 8, 3)),
}
# Other CUDA GPUs until measured (Ampere-sized shared memory: fewer stages at D = 128).
DEFAULT: dict[int, tuple[AttentionConfig, ...]] = {
    16: (AttentionConfig(128, 64, 4, 3),),
    32: (AttentionConfig(128, 64, 4, 3),),
    64: (AttentionConfig(128, 64, 4, 3),),
    128: (AttentionConfig(128, 64, 8, 2),),
}
# TRITON_INTERPRET on CPU (tests): small tiles so odd test lengths span several query blocks,
# off-diagonal and diagonal key blocks, and a masked tail.
INTERPRETER = AttentionConfig(block_m=32, block_n=16, num_warps=4, num_stages=1)

_BY_CAPABILITY = {(9, 0): HOPPER}


def attention_configs(device: torch.device, head_dim: int) -> tuple[AttentionConfig, ...]:
    """Autotune candidates on ``device`` for ``head_dim`` (one of SUPPORTED_HEAD_DIMS)."""
    if not is_cuda(device):
        return (INTERPRETER,)
    return _BY_CAPABILITY.get(torch.cuda.get_device_capability(device), DEFAULT)[head_dim]
