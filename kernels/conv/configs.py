"""Tile shapes for the causal depthwise convolution (``kernels/conv/triton.py``).

The convolution is a streaming pass (2·K FLOPs per element against 2 elements moved), so a
program only needs enough independent loads in flight: a ``[BLOCK_T, BLOCK_C]`` tile of a few
thousand elements, channels innermost for 16-byte loads, and the K − 1 rows of halo it
re-reads from L1/L2 kept a small share of the tile.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConvConfig", "HOPPER", "DEFAULT", "INTERPRETER", "conv_config"]


@dataclass(frozen=True)
class ConvConfig:
    """block_t, block_c: the output tile ``[BLOCK_T, BLOCK_C]`` (powers of two); num_warps: warps per program."""

    block_t: int
    block_c: int
    num_warps: int

    def __post_init__(self) -> None:
        for name in ("block_t", "block_c"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"ConvConfig.{name} must be a power of two, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"ConvConfig.num_warps must be one of 1, 2, 4, 8, 16, 32, got {self.num_warps}")


# 64 time steps × 64 channels: 4096 elements, 32 per thread at 4 warps, 128-byte rows of bf16;
# the halo of a K = 4 filter is 3/64 ≈ 5% extra reads, served by L1/L2. Not yet swept.
HOPPER = ConvConfig(block_t=64, block_c=64, num_warps=4)
DEFAULT = HOPPER
# TRITON_INTERPRET on CPU (tests): small tiles, so odd T and C leave ragged edges and the causal
# halo crosses tile boundaries.
INTERPRETER = ConvConfig(block_t=16, block_c=32, num_warps=4)

_BY_CAPABILITY: dict[tuple[int, int], ConvConfig] = {(9, 0): HOPPER}


def conv_config(capability: tuple[int, int] | None) -> ConvConfig:
    """The tile for a CUDA GPU of this compute capability; INTERPRETER when ``capability`` is None."""
    if capability is None:
        return INTERPRETER
    return _BY_CAPABILITY.get(capability, DEFAULT)


# The decode step (``kernels/conv/decode.py``): one token, grid B × C/block_c, each program reads
# its K − 1 state rows, x, the weights and writes y and the shifted state (2·K elements per
# channel moved; launch-bound at model sizes). Decode-only (``nas.latency._measure.DECODE_ONLY``):
# kept out of ``__all__``.
STEP_BLOCK_C = 256
STEP_NUM_WARPS = 2
INTERPRETER_STEP_BLOCK_C = 32  # tests: odd C spans several programs with a ragged last one
