"""Launch configs for the fused optimizer step and grad-norm kernels (``kernels/optim/triton.py``).

Both kernels are pure streaming passes (one program per ``block`` elements of one tensor), so
the only knobs are the chunk size and the warps per program. Chunks should be large enough that
each thread issues several 16-byte loads before the first use, and small enough that a tensor's
masked tail chunk is a small share of its work. The norm reads one tensor where the step reads
four, so it wants longer chunks for the same bytes in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.device import is_cuda

__all__ = [
    "StepConfig",
    "HOPPER",
    "HOPPER_NORM",
    "DEFAULT",
    "DEFAULT_NORM",
    "INTERPRETER",
    "SWEEP",
    "NORM_SWEEP",
    "step_config",
    "norm_config",
]


@dataclass(frozen=True)
class StepConfig:
    """block: elements per program (a power of two ≥ 64, so every full chunk starts 16-B aligned
    for fp32 and bf16 alike). num_warps: warps per program."""

    block: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.block < 64 or self.block & (self.block - 1):
            raise ValueError(f"StepConfig.block must be a power of two >= 64, got {self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"StepConfig.num_warps must be one of 1, 2, 4, 8, 16, 32, got {self.num_warps}")


# sm_90: the AdamW step's best blocks tie near copy bandwidth; 1024/4 gives each thread 8 fp32 elements per tensor,
# two 16-B loads each of p, g, m, v in flight. The norm's reduction is fastest at 4096-element blocks (the sweep
# of both: benchmarks/results/optimizers_h200.json).
HOPPER = StepConfig(block=1024, num_warps=4)
HOPPER_NORM = StepConfig(block=4096, num_warps=4)
# Other CUDA GPUs until measured: the same shapes.
DEFAULT = HOPPER
DEFAULT_NORM = HOPPER_NORM
# TRITON_INTERPRET on CPU (tests): small chunks so odd-sized test tensors span several programs,
# exercising full (unmasked) and tail (masked) chunks alike.
INTERPRETER = StepConfig(block=64, num_warps=4)

# Candidates `benchmarks/optimizers.py --sweep` times on the device at hand.
SWEEP = tuple(StepConfig(block, warps) for block in (512, 1024, 2048, 4096) for warps in (2, 4, 8))
NORM_SWEEP = tuple(StepConfig(block, warps) for block in (2048, 4096, 8192, 16384) for warps in (4, 8, 16))

_STEP_BY_CAPABILITY: dict[tuple[int, int], StepConfig] = {(9, 0): HOPPER}
_NORM_BY_CAPABILITY: dict[tuple[int, int], StepConfig] = {(9, 0): HOPPER_NORM}


def step_config(device: torch.device) -> StepConfig:
    """The update kernel's config on ``device``: per compute capability on CUDA, INTERPRETER elsewhere."""
    if not is_cuda(device):
        return INTERPRETER
    return _STEP_BY_CAPABILITY.get(torch.cuda.get_device_capability(device), DEFAULT)


def norm_config(device: torch.device) -> StepConfig:
    """The grad-norm kernel's config on ``device``."""
    if not is_cuda(device):
        return INTERPRETER
    return _NORM_BY_CAPABILITY.get(torch.cuda.get_device_capability(device), DEFAULT_NORM)
