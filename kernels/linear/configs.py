"""Tile configs for the fused linear kernel (``kernels/linear/triton.py``), Hopper first.

Autotuning is kept cheap because NAS calls the kernel at many shapes: the tuner's key is
(M bucket, N, K) with M rounded up to a power of two, and ``candidates`` hands it at most
three or four configs — one list for short K and one for long K per architecture, a single
fixed config when M is small (nothing to choose: one row of tiles), and only configs whose
tile height fits the M bucket and whose pipelined operand tiles fit in shared memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "LinearConfig",
    "HOPPER",
    "HOPPER_SHORT_K",
    "HOPPER_TMA",
    "DEFAULT",
    "SMALL_M",
    "INTERPRETER",
    "INTERPRETER_TMA",
    "ALL",
    "SWEEP",
    "SHORT_K_MAX",
    "SMALL_M_MAX",
    "m_bucket",
    "candidates",
    "prefers_tma",
    "CUBLAS_MIN_N",
    "CUBLAS_GELU_MIN_OUTPUT",
    "NORM_FUSED_MAX_X",
    "NORM_FUSED_MAX_K",
    "fuses_norm",
    "prefers_cublas",
    "norm_in_kernel",
    "FEATURE_ALIGN",
    "padded_features",
]


@dataclass(frozen=True)
class LinearConfig:
    """One tiling. block_m/n/k: the output tile ``[BLOCK_M, BLOCK_N]`` and the K step (powers of
    two ≥ 16, the smallest ``tl.dot`` operand). group_m: tile rows walked together so the x rows
    and weight columns of neighbouring programs are reused from L2. num_warps, num_stages: warps
    per program and software-pipelining depth (operand tiles in flight). tma: run the persistent
    tensor-descriptor kernel instead of the pointer kernel (see ``HOPPER_TMA``)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    tma: bool = False  # the persistent kernel reading tiles through tensor descriptors (Hopper TMA)
    flatten: bool = False  # tma only: Triton flattens the tile and K loops into one pipelined loop
    warp_specialize: bool = False  # tma only: Triton splits loads and math into warp groups
    persistent: bool = True  # tma only: ≤ one program per SM walking the tiles; False: one program per tile

    def __post_init__(self) -> None:
        if (self.flatten or self.warp_specialize or not self.persistent) and not self.tma:
            raise ValueError(
                "LinearConfig.flatten, warp_specialize and persistent apply to the TMA kernel only (tma=True)"
            )
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"LinearConfig.{name} must be a power of two >= 16, got {value}")
        if self.group_m < 1:
            raise ValueError(f"LinearConfig.group_m must be >= 1, got {self.group_m}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"LinearConfig.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"LinearConfig.num_stages must be >= 1, got {self.num_stages}")

    def smem_bytes(self, element_size: int) -> int:
        """Shared memory held by the pipelined x and weight tiles, (BM + BN)·BK·size·stages; the
        TMA kernel adds its output staging tile (BM·BN·size) and, flattened, a residual tile too.
        Against Triton's sm_90 compile of the TMA kernel with a residual epilogue (bf16) this is
        within 40 bytes for every ``SWEEP`` tiling without warp specialization, which adds up to
        16 KB; test_linear.py checks it for ``HOPPER_TMA`` with the installed Triton."""
        pipeline = (self.block_m + self.block_n) * self.block_k * element_size * self.num_stages
        if not self.tma:
            return pipeline
        return pipeline + self.block_m * self.block_n * element_size * (2 if self.flatten else 1)


# H100/H200 (sm_90): tl.dot lowers to wgmma, one 64-row instruction per warpgroup (4 warps). The three fastest of
# SWEEP per K range (docs/benchmarks.md, earlier experiments). K ≥ 512: big tiles, most FLOPs per byte loaded;
# 128×128 with 3 stages (98 KB) lets two programs share an SM, so one's GELU epilogue overlaps the other's main loop.
HOPPER = (
    LinearConfig(128, 256, 64, 8, 8, 3),
    LinearConfig(256, 128, 64, 8, 8, 3),
    LinearConfig(128, 128, 64, 8, 4, 3),
)
# K ≤ SHORT_K_MAX: two to four K steps, so the epilogue (erf per output) dominates: small tiles
# with shallow pipelines (32-74 KB) keep 3-6 programs per SM to hide it.
SHORT_K_MAX = 256
HOPPER_SHORT_K = (
    LinearConfig(64, 64, 64, 8, 4, 2),
    LinearConfig(64, 128, 64, 8, 4, 2),
    LinearConfig(128, 64, 64, 8, 4, 3),
)
# Other CUDA GPUs (Ampere/Ada mma.sync, ≤ 164 KB shared memory): the Triton tutorial's shapes.
DEFAULT = (
    LinearConfig(128, 128, 32, 8, 4, 4),
    LinearConfig(128, 64, 32, 8, 4, 4),
    LinearConfig(64, 128, 32, 8, 4, 4),
    LinearConfig(64, 64, 32, 8, 4, 4),
)
# M ≤ SMALL_M_MAX (a "last token" head, a tiny batch): one row of tiles; narrow tiles along N
# spread the weight read, which is all the work, over more SMs.
SMALL_M_MAX = 64
SMALL_M = LinearConfig(64, 64, 64, 1, 4, 4)
# TRITON_INTERPRET on CPU (tests): the smallest tiles, so odd test shapes span several tiles
# with ragged edges in M, N and K, and a group of 2 exercises the grouped tile order.
INTERPRETER = LinearConfig(16, 16, 16, 2, 4, 1)
# The persistent TMA kernel (one program per SM walks the output tiles; x and W tiles arrive by bulk tensor copies,
# no per-element addresses) pays at long K only: at short K two K steps leave nothing to pipeline (``prefers_tma``).
# No 128×256 flattened: with a residual epilogue it needs more than sm_90's 227 KB of shared memory.
HOPPER_TMA = (
    LinearConfig(128, 128, 64, 8, 8, 4, tma=True, flatten=True),
    LinearConfig(128, 256, 64, 8, 8, 3, tma=True),
    LinearConfig(64, 128, 64, 8, 4, 4, tma=True, flatten=True),
)
# One program per tile through descriptors, for short K, where the pointer kernel's per-element addresses take
# enough registers to spill and leave few programs per SM; these compile to far fewer (ptxas -v, sm_90a), so one's
# epilogue can overlap another's loads. In SWEEP until a GPU sweep says whether they win.
_TMA_PER_TILE = (
    LinearConfig(64, 64, 64, 1, 4, 2, tma=True, persistent=False),
    LinearConfig(64, 128, 64, 8, 4, 2, tma=True, persistent=False),
    LinearConfig(128, 64, 64, 8, 4, 3, tma=True, persistent=False),
)
_TMA_SWEEP = (
    LinearConfig(128, 256, 64, 8, 8, 3, tma=True),
    LinearConfig(128, 128, 64, 8, 8, 4, tma=True),
    LinearConfig(128, 128, 64, 8, 4, 4, tma=True),
    LinearConfig(64, 128, 64, 8, 4, 4, tma=True),
)
INTERPRETER_TMA = LinearConfig(16, 16, 16, 2, 4, 1, tma=True)
ALL = tuple(
    dict.fromkeys((*HOPPER, *HOPPER_SHORT_K, *DEFAULT, SMALL_M, *HOPPER_TMA))
)  # everything the tuners may be handed
# Candidates for a tile sweep on the GPU at hand (docs/benchmarks.md): the Hopper list
# plus shallower pipelines whose smaller shared-memory footprint lets 2-4 programs share an SM
# (one program's epilogue overlapping another's main loop), and taller/wider tiles.
SWEEP = tuple(
    dict.fromkeys(
        (
            *HOPPER,
            *HOPPER_SHORT_K,
            LinearConfig(128, 128, 64, 8, 8, 4),
            LinearConfig(128, 128, 64, 8, 4, 4),
            LinearConfig(64, 128, 64, 8, 4, 4),
            LinearConfig(128, 128, 64, 8, 8, 3),
            LinearConfig(128, 128, 64, 8, 4, 2),
            LinearConfig(64, 256, 64, 8, 4, 3),
            *HOPPER_TMA,
            *_TMA_SWEEP,
            *(dataclasses.replace(c, flatten=True) for c in _TMA_SWEEP if c.block_n < 256),
            *(dataclasses.replace(c, warp_specialize=True) for c in _TMA_SWEEP),
            *_TMA_PER_TILE,
        )
    )
)

# Per compute capability: (candidates for K ≤ SHORT_K_MAX, candidates for longer K).
_BY_CAPABILITY: dict[tuple[int, int], tuple[tuple[LinearConfig, ...], tuple[LinearConfig, ...]]] = {
    (9, 0): (HOPPER_SHORT_K, HOPPER),
}
_SMEM_BUDGET = 200 * 1024  # bytes: below every sm_80+ opt-in limit (163-227 KB) with epilogue room
_TMA_SMEM_BUDGET = 227 * 1024  # sm_90's opt-in limit: the TMA estimate already counts the epilogue tiles


def m_bucket(m: int) -> int:
    """M rounded up to a power of two (≥ 16): the tuner's key, so one tuning serves a range of M."""
    return max(16, 1 << max(0, m - 1).bit_length())


def prefers_tma(capability: tuple[int, int], m_bucket_: int, k: int) -> bool:
    """Whether the tuner should be handed the TMA kernel's tilings rather than the pointer
    kernel's: sm_90 (where they were measured; later GPUs have other shared-memory limits), a
    long K loop to pipeline, and more rows than the small-M tile."""
    return capability == (9, 0) and k > SHORT_K_MAX and m_bucket_ > SMALL_M_MAX


# Never where a row of x or y is not 16-byte aligned (K or N not a multiple of 8 bf16/fp16 elements): cuBLAS then
# runs kernels without its fast paths, and the fused kernel's masked stores do not care. Otherwise cuBLAS's matmul
# (torch.addmm, bias in its epilogue) and then this package's in-place epilogue kernel, wherever the fused kernel's
# slower main loop costs more than the pass over the output it saves:
# - no activation and no residual: nothing to fuse;
# - ReLU after a bias, no residual: cuBLASLt fuses bias + ReLU into its own epilogue (torch._addmm_activation);
# - K not a multiple of 16: Triton specialises integer arguments divisible by 16, so such rows load without vectors
#   (this one holds with a norm to fold in too: the fused kernel's slow loop costs more than the norm's own launch);
# - K > SHORT_K_MAX on sm_90, except the persistent TMA kernel at M > 8192 with N ≥ K;
# - short K with N ≥ CUBLAS_MIN_N, or GELU over CUBLAS_GELU_MIN_OUTPUT output elements or more.
# The rows: tests/kernels/data/default_peers_h200_linear_fused_only.json (the fused kernel against cuBLAS + torch).
CUBLAS_MIN_N = 4096
CUBLAS_GELU_MIN_OUTPUT = 1 << 24
# A norm before the linear (``linear(..., norm=)``): the fused kernel sums its rows' statistics in its main loop,
# saving the norm's launch and pass over x, where that loop keeps up with cuBLAS's: K ≤ NORM_FUSED_MAX_K and
# M bucket × K < NORM_FUSED_MAX_X (docs/benchmarks.md, earlier experiments). Elsewhere the norm runs on its own.
NORM_FUSED_MAX_K = 128
NORM_FUSED_MAX_X = 1 << 20
# Except, on sm_90, a wide output with nothing else to fuse (the readout): there the fused kernel stores
# slower than cuBLAS, and its small-M loop streams a very wide weight slower than cuBLAS's GEMV, by more than
# the norm's own launch costs, at N ≥ NORM_FUSED_WIDE_N whatever M and at M bucket × N ≥ CUBLAS_GELU_MIN_OUTPUT
# (the kernel grids of benchmarks/results/predictor_rows_h100_lease6.json, cuBLAS, and _lease10.json, fused:
# M 8192, N 50272, K 16 in 316 µs against 607).
NORM_FUSED_WIDE_N = 32768


def _wide_readout(capability: tuple[int, int], m_bucket_: int, n: int, activation: str | None, residual: bool) -> bool:
    """A plain output (no activation, no residual) wide enough that on sm_90 cuBLAS after the
    norm's own launch beats the fused kernel with the norm folded in (see NORM_FUSED_WIDE_N)."""
    return (
        capability == (9, 0)
        and activation is None
        and not residual
        and n >= CUBLAS_MIN_N
        and (n >= NORM_FUSED_WIDE_N or m_bucket_ * n >= CUBLAS_GELU_MIN_OUTPUT)
    )


def fuses_norm(m_bucket_: int, k: int) -> bool:
    """Whether ``linear(..., norm=)`` runs the norm inside the fused kernel (and takes that
    kernel whatever ``prefers_cublas`` says without the norm) rather than as a launch of its own
    before the route: K ≤ NORM_FUSED_MAX_K and M bucket × K < NORM_FUSED_MAX_X (see above)."""
    return k <= NORM_FUSED_MAX_K and m_bucket_ * k < NORM_FUSED_MAX_X


def prefers_cublas(
    capability: tuple[int, int],
    m_bucket_: int,
    n: int,
    k: int,
    activation: str | None,
    residual: bool,
    bias: bool = True,
    *,
    norm: bool = False,
) -> bool:
    """Whether ``kernels.linear.linear`` should run cuBLAS's matmul and then its epilogue kernel
    rather than the fused Triton kernel, for this GPU, M bucket, N, K and epilogue (see above; a
    fixed rule, so a shape always takes the same route, and the latency model can follow it).
    Off sm_90 only the rules that hold whatever the GPU do: nothing to fuse, cuBLASLt's own
    bias + ReLU epilogue, and K rows that Triton cannot load as vectors; the rest was measured
    on sm_90 only. ``norm``: x is normalised first (``linear``'s norm), which the fused kernel
    folds in and the cuBLAS route runs as a launch of its own before the matmul."""
    if n % 8 or k % 8:  # rows of 16-bit elements not 16-byte aligned: cuBLAS's slow kernels
        return False
    if k % 16:
        return True
    if norm and fuses_norm(m_bucket_, k) and not _wide_readout(capability, m_bucket_, n, activation, residual):
        return False
    if activation is None and not residual:
        return True
    if activation == "relu" and bias and not residual:
        return True
    if capability != (9, 0):
        return False
    if k > SHORT_K_MAX:
        return not (m_bucket_ > 8192 and n >= k)
    return n >= CUBLAS_MIN_N or (activation == "gelu" and m_bucket_ * n >= CUBLAS_GELU_MIN_OUTPUT)


def norm_in_kernel(
    capability: tuple[int, int], m_bucket_: int, n: int, k: int, activation: str | None, residual: bool = False
) -> bool:
    """Whether ``linear(..., norm=)`` sums the norm's row statistics inside the fused kernel (one
    launch) rather than running the norm as a launch of its own before its route: the fused
    kernel's route and ``fuses_norm``."""
    return fuses_norm(m_bucket_, k) and not prefers_cublas(capability, m_bucket_, n, k, activation, residual, norm=True)


# A model pads each linear's own feature widths (an MLP's hidden width, the readout's outputs) to a
# multiple of FEATURE_ALIGN with zero weights, so no launch has K % 16 ≠ 0 or N % 8 ≠ 0 there: the
# fused kernel's rows then load and store as vectors, and cuBLAS's aligned kernels apply. Only the
# residual width d, shared with the norms, is left as the architecture has it.
FEATURE_ALIGN = 16


def padded_features(n: int) -> int:
    """``n`` rounded up to a multiple of FEATURE_ALIGN (0 stays 0)."""
    return -(-n // FEATURE_ALIGN) * FEATURE_ALIGN


def candidates(
    capability: tuple[int, int], m_bucket_: int, k: int, element_size: int, tma: bool = False
) -> tuple[LinearConfig, ...]:
    """The configs worth timing for this GPU, M bucket, K and operand size (bytes). Never empty.
    ``tma``: the persistent TMA kernel's tilings (Hopper and later only)."""
    if tma:
        fitting = tuple(
            c for c in HOPPER_TMA if c.block_m <= m_bucket_ and c.smem_bytes(element_size) <= _TMA_SMEM_BUDGET
        )
        return fitting or (min(HOPPER_TMA, key=lambda c: (c.block_m, c.smem_bytes(element_size))),)
    if m_bucket_ <= SMALL_M_MAX:
        return (SMALL_M,)
    short_k, long_k = _BY_CAPABILITY.get(capability, (DEFAULT, DEFAULT))
    arch = short_k if k <= SHORT_K_MAX else long_k
    fitting = tuple(c for c in arch if c.block_m <= m_bucket_ and c.smem_bytes(element_size) <= _SMEM_BUDGET)
    return fitting or (min(arch, key=lambda c: c.smem_bytes(element_size)),)


@dataclass(frozen=True)
class RowsConfig:
    """A launch of the few-rows kernel (``kernels/linear/decode.py``): tile ``[block_m, block_n]``
    (block_m ≥ 16: rows are padded into a tensor-core tile), K step block_k, the K dimension cut
    into split_k slices; num_warps, num_stages as in ``triton.Config``."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"RowsConfig.{name} must be a power of two >= 16, got {value}")
        if self.split_k < 1:
            raise ValueError(f"RowsConfig.split_k must be >= 1, got {self.split_k}")


# Decoding reads each weight once per step for a few rows: the grid (column blocks × K slices ×
# row blocks) should hold ROWS_PROGRAMS_PER_SM programs per SM so every SM streams, with K slices
# of at least ROWS_MIN_SLICE columns (a slice's partial sum costs one fp32 atomic tile).
ROWS_PROGRAMS_PER_SM = 4
ROWS_MIN_SLICE = 256
ROWS_TILE = (16, 32, 128)  # block_m, block_n, block_k: 32 columns × 128 of K = 8 KB of bf16 weights a step
INTERPRETER_ROWS = RowsConfig(16, 16, 16, split_k=1, num_warps=4, num_stages=1)


def rows_config(device: object, m: int, n: int, k: int, sms: int) -> RowsConfig:
    """The few-rows launch for ``x [m, k] · W[n, k]ᵀ`` on ``device`` with ``sms`` SMs: the column
    and row blocks of ROWS_TILE, and as many K slices as it takes to give every SM
    ROWS_PROGRAMS_PER_SM programs (none on the interpreter, where tests force splits)."""
    from kernels.device import is_cuda

    if not is_cuda(device):
        return INTERPRETER_ROWS
    block_m, block_n, block_k = ROWS_TILE
    tiles = -(-n // block_n) * -(-m // block_m)
    wanted = -(-ROWS_PROGRAMS_PER_SM * sms // max(1, tiles))
    return RowsConfig(block_m, block_n, block_k, max(1, min(wanted, k // ROWS_MIN_SLICE)), num_warps=4, num_stages=3)
