"""Launch shapes for the row-norm kernel (``kernels/norm/triton.py``).

A norm is a streaming pass: each program holds whole rows (``BLOCK_N`` = N rounded up to a
power of two) and several of them when rows are short, so that a program moves a few
thousand elements (several 16-byte loads per thread in flight) whatever d_model is.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

__all__ = ["NormConfig", "MAX_N", "ELEMENTS_PER_PROGRAM", "INTERPRETER", "norm_config"]

MAX_N = 16384  # one fp32 row of BLOCK_N in registers across the program: 64 KB at most
ELEMENTS_PER_PROGRAM = 4096  # rows × BLOCK_N: 16 elements per thread at 8 warps


@dataclass(frozen=True)
class NormConfig:
    """rows: rows per program (a power of two). num_warps: warps per program."""

    rows: int
    num_warps: int

    def __post_init__(self) -> None:
        if self.rows < 1 or self.rows & (self.rows - 1):
            raise ValueError(f"NormConfig.rows must be a power of two >= 1, got {self.rows}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"NormConfig.num_warps must be one of 1, 2, 4, 8, 16, 32, got {self.num_warps}")


# TRITON_INTERPRET on CPU (tests): a few rows per program, so odd M leaves a ragged last program.
INTERPRETER = NormConfig(rows=4, num_warps=4)


def norm_config(n: int) -> NormConfig:
    """Rows and warps for rows of ``n`` elements (same on every CUDA GPU until measured otherwise):
    ELEMENTS_PER_PROGRAM per program (one row when rows are longer), 8 warps, 16 for rows ≥ 8192
    so each thread still holds at most 16 fp32 values per row."""
    block_n = triton.next_power_of_2(n)
    return NormConfig(rows=max(1, ELEMENTS_PER_PROGRAM // block_n), num_warps=16 if block_n >= 8192 else 8)
