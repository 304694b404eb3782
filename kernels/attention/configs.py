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
    "prefers_sdpa",
    "ROPE_BLOCK_ELEMENTS",
    "ROPE_INTERPRETER_ROWS",
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


# sm_90, per head dim: the tilings the tuner picked over L = 1024-4096 (docs/benchmarks.md, earlier experiments);
# with RoPE at D = 128 the 128×128 tile needs 256 KB of shared memory and is skipped, so 128/64/8w/3s is there too.
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
# The rotary pass of the SDPA route: a program rotates this many elements of one head's q or k
# ([rows, D/2] pairs, 8 per thread at 4 warps); under the interpreter, 16-row blocks so odd test
# lengths end in a ragged block.
ROPE_BLOCK_ELEMENTS = 2048
ROPE_INTERPRETER_ROWS = 16

_BY_CAPABILITY = {(9, 0): HOPPER}


def attention_configs(device: torch.device, head_dim: int) -> tuple[AttentionConfig, ...]:
    """Autotune candidates on ``device`` for ``head_dim`` (one of SUPPORTED_HEAD_DIMS)."""
    if not is_cuda(device):
        return (INTERPRETER,)
    return _BY_CAPABILITY.get(torch.cuda.get_device_capability(device), DEFAULT)[head_dim]


# Route: torch's ``F.scaled_dot_product_attention`` (default backend: cuDNN's wgmma flash kernel on sm_90) is faster
# except where its grid leaves SMs idle, few heads over long rows, and there only without RoPE (rotating K in-kernel
# costs more than SDPA's rotary pass): tests/kernels/data/default_peers_h200_attention_triton_only.json.
SDPA_TRITON_MAX_HEADS = 4  # B·H at most this many ...
SDPA_TRITON_MIN_LENGTH = 8192  # ... over at least this many rows: the Triton kernel without RoPE


def prefers_sdpa(capability: tuple[int, int], batch_heads: int, length: int, rope: bool) -> bool:
    """Whether the 16-bit causal forward at ``B·H = batch_heads`` rows of ``length`` goes to torch's
    SDPA (default backend; with ``rope``, after the rotary pass) rather than the Triton kernel: a
    fixed rule per shape, measured on sm_90 (above), so a captured graph always launches the same
    kernels. Other GPUs keep the Triton kernel until measured."""
    if capability != (9, 0):
        return False
    if rope:
        return True
    return not (batch_heads <= SDPA_TRITON_MAX_HEADS and length >= SDPA_TRITON_MIN_LENGTH)


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
    capacity walked by separate programs (grid B·H × splits), combined (none when splits = 1) by
    the last program of each head to finish (fused, one launch) or by a second launch; dot: scores
    and p·v as 16-row matmuls (q replicated) so Triton pipelines the cache loads ``num_stages``
    deep, instead of CUDA-core reductions."""

    block_n: int
    num_warps: int
    num_stages: int
    splits: int = 1
    dot: bool = False
    fused: bool = True

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeConfig.block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"DecodeConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if not 1 <= self.splits <= DECODE_MAX_SPLITS:
            raise ValueError(f"DecodeConfig.splits must be in 1..{DECODE_MAX_SPLITS}, got {self.splits}")


# Decode is a stream over the cache: 2·D·(bytes per element) per row read, 4·D FLOPs per row (one dot for the
# score, one axpy for the output), so 1 FLOP/byte in bf16 — memory-bound on any GPU. The matmul walk (dot=True)
# lets Triton pipeline the loads across blocks, which the CUDA-core walk cannot, and so keeps up with cuDNN's SDPA.
# The launches (their rows against SDPA: benchmarks/results/decode_h200.json, part attention):
# - D = 64: 128-row tiles, 3 stages (96 KB of shared memory: two programs fit an SM) at two programs per SM;
# - D = 128: 64-row tiles for slices under DECODE_LONG_SLICE rows, else 128-row tiles with 4 warps (192 KB: one
#   program per SM), at one program per SM;
# - more heads than SMs (DECODE_MANY_HEADS, several waves): 2-stage tiles (64 KB: three fit an SM) hide the tails.
# sm_90, per head dim: (the tile for slices shorter than DECODE_LONG_SLICE rows, the tile for
# longer ones, the tile when the heads alone fill the SMs (DECODE_MANY_HEADS), then the other
# tiles the tests run and the benchmark sweeps).
DECODE_HOPPER: dict[int, tuple[DecodeConfig, ...]] = {
    16: (*(DecodeConfig(256, 4, 3, dot=True),) * 3, DecodeConfig(256, 4, 2)),
    32: (*(DecodeConfig(256, 4, 3, dot=True),) * 3, DecodeConfig(256, 4, 2)),
    64: (
        DecodeConfig(128, 4, 3, dot=True),
        DecodeConfig(128, 4, 3, dot=True),
        DecodeConfig(128, 4, 2, dot=True),
        DecodeConfig(256, 4, 3, dot=True),
        DecodeConfig(128, 4, 3, dot=True, fused=False),
        DecodeConfig(64, 4, 4, dot=True),
        DecodeConfig(128, 4, 2),
    ),
    128: (
        DecodeConfig(64, 4, 3, dot=True),
        DecodeConfig(128, 4, 3, dot=True),
        DecodeConfig(64, 4, 2, dot=True),
        DecodeConfig(128, 8, 3, dot=True),
        DecodeConfig(64, 4, 3, dot=True, fused=False),
        DecodeConfig(64, 4, 4, dot=True),
        DecodeConfig(64, 4, 2),
    ),
}
DECODE_DEFAULT: dict[int, tuple[DecodeConfig, ...]] = {d: (c[0],) for d, c in DECODE_HOPPER.items()}
# TRITON_INTERPRET on CPU (tests): 16-row blocks and 64-row splits, so odd test lengths span
# several blocks and several splits (later ones empty), with a ragged last block; both combines.
DECODE_INTERPRETER = (
    DecodeConfig(16, 4, 1),
    DecodeConfig(16, 4, 1, dot=True),
    DecodeConfig(16, 4, 1, dot=True, fused=False),
)
DECODE_INTERPRETER_SPLIT_ROWS = 64
# The split: B·H × splits programs, at most DECODE_PROGRAMS_PER_SM[D] per SM (one resident wave of equal slices,
# each program streaming one long slice), in slices of at least DECODE_MIN_SLICE rows (a shorter slice's partial
# write and share of the combine do not pay for themselves). Chosen from the capacity, fixed at CUDA-graph
# capture: the kernel skips the splits past each sequence's position.
DECODE_PROGRAMS_PER_SM: dict[int, int] = {16: 1, 32: 1, 64: 2, 128: 1}
DECODE_MIN_SLICE = 128
DECODE_LONG_SLICE = 1024
DECODE_MANY_HEADS = 1  # B·H at least this many per SM: the table's third tile (one slice per head)
# A tile's shared memory, block_n·D·(bytes per element)·2 (k and v)·num_stages, is kept under
# this (sm_90 allows 227 KB a block; Triton adds its own scratch): an fp32 cache halves block_n.
DECODE_MAX_SHARED = 200 * 1024

_DECODE_BY_CAPABILITY = {(9, 0): DECODE_HOPPER}


def decode_shared_budget(device: torch.device) -> int:
    """Shared memory a decode tile may take on ``device``: DECODE_MAX_SHARED, less on a GPU whose
    blocks may opt in to less (A100: 163 KB, sm_86/89: 99 KB), keeping 16 KB for Triton's own."""
    if not is_cuda(device):
        return DECODE_MAX_SHARED
    optin = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    return min(DECODE_MAX_SHARED, optin - 16 * 1024) if optin else DECODE_MAX_SHARED


def _decode_splits(batch_heads: int, capacity: int, sms: int, per_sm: int) -> int:
    """Slices of ``capacity`` rows (each at least DECODE_MIN_SLICE) that bring ``batch_heads``
    programs up to at most ``per_sm`` per SM."""
    wanted = per_sm * sms // max(1, batch_heads)
    return max(1, min(wanted, capacity // DECODE_MIN_SLICE, DECODE_MAX_SPLITS))


def decode_configs(
    device: torch.device, batch_heads: int, capacity: int, head_dim: int, sms: int
) -> tuple[DecodeConfig, ...]:
    """Every launch the decode kernels may run for ``batch_heads`` = B·H heads over a cache of
    ``capacity`` rows of ``head_dim`` on ``device`` with ``sms`` SMs: the chooser's first, then
    the other tiles measured on this GPU (tests run them all; benchmarks time them)."""
    if not is_cuda(device):
        tiles: tuple[DecodeConfig, ...] = DECODE_INTERPRETER
        splits = max(1, min(-(-capacity // DECODE_INTERPRETER_SPLIT_ROWS), DECODE_MAX_SPLITS))
    else:
        tables = _DECODE_BY_CAPABILITY.get(torch.cuda.get_device_capability(device))
        table = (tables or DECODE_DEFAULT)[head_dim]
        # two programs per SM only where the table's tiles were measured to fit and win (sm_90)
        per_sm = DECODE_PROGRAMS_PER_SM.get(head_dim, 1) if tables is not None else 1
        splits = _decode_splits(batch_heads, capacity, sms, per_sm)
        if batch_heads >= DECODE_MANY_HEADS * sms:
            chosen = table[min(2, len(table) - 1)]
        elif -(-capacity // splits) >= DECODE_LONG_SLICE:
            chosen = table[min(1, len(table) - 1)]
        else:
            chosen = table[0]
        tiles = tuple(dict.fromkeys((chosen, *table)))
    return tuple(DecodeConfig(t.block_n, t.num_warps, t.num_stages, splits, t.dot, t.fused) for t in tiles)


def fit_decode_shared(
    config: DecodeConfig, head_dim: int, element_bytes: int, budget: int = DECODE_MAX_SHARED
) -> DecodeConfig:
    """``config`` with block_n halved until its k and v stages fit ``budget`` bytes at this
    element size (the tables are sized for 2-byte caches on sm_90; an fp32 cache needs half the
    rows, a GPU with less shared memory per block may need fewer: ``decode_shared_budget``)."""
    block_n = config.block_n
    while block_n > 16 and block_n * head_dim * element_bytes * 2 * config.num_stages > budget:
        block_n //= 2
    if block_n == config.block_n:
        return config
    return DecodeConfig(block_n, config.num_warps, config.num_stages, config.splits, config.dot, config.fused)


def decode_config(device: torch.device, batch_heads: int, capacity: int, head_dim: int, sms: int) -> DecodeConfig:
    """The decode launch for B·H = ``batch_heads`` over ``capacity`` cache rows of ``head_dim``:
    depends on the capacity (not the positions), so a graph-captured step launches the same way
    at every position."""
    return decode_configs(device, batch_heads, capacity, head_dim, sms)[0]
