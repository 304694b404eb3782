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


# ---------------------------------------------------------------------------------------------
# Decode: one query token per (batch, head) against a KV cache (``kernels/attention/decode.py``).
# Decode-only (``nas.latency._measure.DECODE_ONLY``): these names stay out of ``__all__``, which
# is forward code to the forward fingerprint; import them by name.
# ---------------------------------------------------------------------------------------------

DECODE_MAX_SPLITS = 256  # the combine kernel holds one (m, l) pair per split in registers


@dataclass(frozen=True)
class DecodeConfig:
    """The split-KV decode launch. block_n: cache rows per inner step (a ``[block_n, D]`` tile of
    k and of v); num_warps, num_stages: as in ``triton.Config``; splits: slices of the cache
    capacity walked by separate programs (grid B·H × splits), combined by a second launch (none
    when splits = 1); dot: scores and p·v as 16-row matmuls (q replicated) so Triton pipelines
    the cache loads ``num_stages`` deep, instead of CUDA-core reductions."""

    block_n: int
    num_warps: int
    num_stages: int
    splits: int = 1
    dot: bool = False

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeConfig.block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"DecodeConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if not 1 <= self.splits <= DECODE_MAX_SPLITS:
            raise ValueError(f"DecodeConfig.splits must be in 1..{DECODE_MAX_SPLITS}, got {self.splits}")


# Decode is a stream over the cache: 2·D·(bytes per element) per row read, 4·D FLOPs per row (one
# dot for the score, one axpy for the output), so 1 FLOP/byte in bf16 — memory-bound on any GPU.
# A tile of block_n·D = 8192 elements (16 KB of k and 16 KB of v in bf16 per step).
# Measured on an H200 (torch 2.11, triton 3.6, bf16, H = 8, benchmarks/results/
# decode_attention_h200.json, first run): the CUDA-core walk (dot=False) streamed at most ~3.0
# TB/s (B64 N128K: 0.63× cuDNN's SDPA at 4.6 TB/s): its loads are not pipelined across blocks.
# The matmul walk (dot=True) lets Triton pipeline them: second run (decode_attention_h200.json),
# 101-104% of an SM copy's 4.25 TB/s at B 8-64 from 16K rows, 0.95-0.98× SDPA (cuDNN, itself at
# the ceiling); B1 stays latency-bound (56-81% of the copy at 32K-128K). There 128/8w/2s dot
# was within 1% of the first tile at D = 128 (sometimes ahead, 7.66 vs 7.76 ms at B64 N128K).
# sm_90 candidates, the chooser's first.
DECODE_HOPPER: dict[int, tuple[DecodeConfig, ...]] = {
    16: (DecodeConfig(256, 4, 3, dot=True), DecodeConfig(256, 4, 2)),
    32: (DecodeConfig(256, 4, 3, dot=True), DecodeConfig(256, 4, 2)),
    64: (
        DecodeConfig(128, 4, 3, dot=True),
        DecodeConfig(64, 4, 4, dot=True),
        DecodeConfig(128, 4, 2),
        DecodeConfig(256, 8, 2),
    ),
    128: (
        DecodeConfig(64, 4, 3, dot=True),
        DecodeConfig(128, 8, 2, dot=True),
        DecodeConfig(64, 4, 2),
        DecodeConfig(128, 8, 2),
    ),
}
DECODE_DEFAULT: dict[int, tuple[DecodeConfig, ...]] = {d: (c[0],) for d, c in DECODE_HOPPER.items()}
# TRITON_INTERPRET on CPU (tests): 16-row blocks and 64-row splits, so odd test lengths span
# several blocks and several splits (later ones empty), with a ragged last block.
DECODE_INTERPRETER = (DecodeConfig(16, 4, 1), DecodeConfig(16, 4, 1, dot=True))
DECODE_INTERPRETER_SPLIT_ROWS = 64
# The split: the grid B·H × splits holds up to DECODE_PROGRAMS_PER_SM programs per SM (about one
# resident wave; the first run found twice the 4 first chosen faster at B64 and B1 N1K, e.g. B64
# N128K D128 9.75 vs 11.63 ms), in slices of split_rows(capacity) rows: a slice's partial
# (o, m, l) write and its share of the combine must pay for themselves, and how long a slice
# should be grows with the cache. The sweep of every split count (decode_attention_h200.json, B1
# H8; now decode_attention_h200_before_split_chooser.json) put the best slice at 128 rows for 1K,
# 256 for 4K, 512 from 16K (16K: 32 splits 15.7 µs vs
# 64 splits 18.6; 32K: 64 vs 128 splits 27.7 vs 28.2 µs at D64, 48.3 vs 51.6 at D128), and at 128K
# the SM bound (132 splits) ahead of 66: 4·√capacity rows, clamped to [128, 512], follows it.
# Re-measured with this chooser (decode_attention_h200.json, same day), B1 at 32K disagrees: half
# its splits (32, 1024-row slices) ran 25.6 vs 29.2 µs at D64 and 40.8 vs 47.6 at D128, while at
# 16K, 64K and 128K the chosen split was the fastest of ½×, 1×, 2×. Left as is until a GPU run can
# validate a change (a 1024-row cap at 32K only, or a sweep at 24K-48K).
# Chosen from the capacity, fixed at CUDA-graph capture: the kernel skips the splits past each
# sequence's position.
DECODE_PROGRAMS_PER_SM = 8
DECODE_SPLIT_ROWS = (128, 512)  # the shortest and longest slice split_rows picks


def _split_rows(capacity: int) -> int:
    lo, hi = DECODE_SPLIT_ROWS
    return max(lo, min(hi, round(4 * capacity**0.5)))


_DECODE_BY_CAPABILITY = {(9, 0): DECODE_HOPPER}


def _decode_splits(batch_heads: int, capacity: int, split_rows: int, sms: int) -> int:
    """Slices of ``capacity`` rows (each at least ``split_rows``) that bring ``batch_heads``
    programs up to at most DECODE_PROGRAMS_PER_SM per SM."""
    wanted = -(-DECODE_PROGRAMS_PER_SM * sms // max(1, batch_heads))
    return max(1, min(wanted, capacity // split_rows, DECODE_MAX_SPLITS))


def decode_configs(
    device: torch.device, batch_heads: int, capacity: int, head_dim: int, sms: int
) -> tuple[DecodeConfig, ...]:
    """Every launch the decode kernels may run for ``batch_heads`` = B·H heads over a cache of
    ``capacity`` rows of ``head_dim`` on ``device`` with ``sms`` SMs: the chooser's first, then
    the other tiles measured on this GPU (tests run them all; benchmarks sweep them)."""
    if not is_cuda(device):
        tiles: tuple[DecodeConfig, ...] = DECODE_INTERPRETER
        splits = max(1, min(-(-capacity // DECODE_INTERPRETER_SPLIT_ROWS), DECODE_MAX_SPLITS))
    else:
        tiles = _DECODE_BY_CAPABILITY.get(torch.cuda.get_device_capability(device), DECODE_DEFAULT)[head_dim]
        splits = _decode_splits(batch_heads, capacity, _split_rows(capacity), sms)
    return tuple(DecodeConfig(t.block_n, t.num_warps, t.num_stages, splits, t.dot) for t in tiles)


def decode_config(device: torch.device, batch_heads: int, capacity: int, head_dim: int, sms: int) -> DecodeConfig:
    """The decode launch for B·H = ``batch_heads`` over ``capacity`` cache rows of ``head_dim``:
    depends on the capacity (not the positions), so a graph-captured step launches the same way
    at every position."""
    return decode_configs(device, batch_heads, capacity, head_dim, sms)[0]
