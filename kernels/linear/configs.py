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
        Against Triton 3.6's sm_90 compile of the TMA kernel with a residual epilogue (bf16) this
        is within 40 bytes for every ``SWEEP`` tiling without warp specialization, which adds up
        to 16 KB (e.g. 128×128×64 s4 flattened: 196608 vs 196648; 128×256×64 s3: 212992 vs
        213016; 128×256×64 s3 flattened: 278528, over the limit); test_linear.py checks it for
        ``HOPPER_TMA`` with the installed Triton."""
        pipeline = (self.block_m + self.block_n) * self.block_k * element_size * self.num_stages
        if not self.tma:
            return pipeline
        return pipeline + self.block_m * self.block_n * element_size * (2 if self.flatten else 1)


# H100/H200 (sm_90): tl.dot lowers to wgmma, one 64-row instruction per warpgroup (4 warps).
# Picked from `--sweep` on an H200 (bf16 linear + bias + GELU, d = 128-1024, tokens 2048 and
# 16384, CUDA-graph timed; the linear sweep in docs/benchmarks.md, earlier experiments): the
# three fastest of configs.SWEEP per K range; the sweep's fastest at every swept shape is among them.
# K ≥ 512: big tiles, most FLOPs per byte loaded; 128×128 with 3 stages (98 KB) lets two
# programs share an SM, so one's GELU epilogue overlaps the other's main loop.
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
# The persistent TMA kernel (one program per SM walks the output tiles; x and W tiles arrive by
# bulk tensor copies, no per-element addresses). `--sweep` on an H200 (bf16 linear + bias + GELU,
# triton 3.6): at K = 1024 the flattened 128×128 w8 s4 tiling ran 40.9 µs at M = 2048 and 307.7 µs
# at M = 16384 against 43.4 and 338.6 for the pointer kernel's best; at K = 128 every TMA tiling
# lost (the main loop is two K steps, nothing to pipeline). Hence ``prefers_tma``: long K only.
# 128×256 flattened failed to compile in the GPU tests with a residual epilogue (278 KB of shared
# memory, over the 227 KB limit: flattening keeps the epilogue tiles beside the pipeline's).
HOPPER_TMA = (
    LinearConfig(128, 128, 64, 8, 8, 4, tma=True, flatten=True),
    LinearConfig(128, 256, 64, 8, 8, 3, tma=True),
    LinearConfig(64, 128, 64, 8, 4, 4, tma=True, flatten=True),
)
# One program per tile through descriptors, for short K, where the pointer kernel's per-element
# addresses cost it 254-255 registers (spilling at 64×128 and 128×128 with 4 warps) and so 2
# programs per SM, while these tilings compile to 72-133 registers (Triton 3.6 → ptxas for sm_90a,
# GELU epilogue): several programs per SM, one's epilogue overlapping another's loads. Offline
# numbers only; in SWEEP until an H200 sweep says whether they win.
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


# Never where a row of x or y is not 16-byte aligned (K or N not a multiple of 8 bf16/fp16
# elements): cuBLAS then runs kernels without its fast paths (H200, calibration kernel grid,
# no epilogue: 16384×512→5003 took 995 µs, 8192×512→3001 313 µs, 256×512→5003 34 µs; the fused
# kernel's masked stores do not care). Otherwise, where cuBLAS's matmul (torch.addmm, bias in
# its epilogue) followed by this package's in-place epilogue kernel (activation, residual) beats
# the one fused Triton kernel. Measured on an H200 (torch 2.11, triton 3.6; the fused kernel
# alone in tests/kernels/data/default_peers_h200_linear_fused_only.json, each row against cuBLAS
# F.linear + the separate torch ops, CUDA-graph replays; the route's own rows in
# benchmarks/results/default_peers_linear_h200.json):
# - no activation and no residual: the fused kernel has nothing to fuse, and its main loop ran
#   0.36-0.70× cuBLAS's (3000×200→800: 21.1 vs 7.6 µs; 16384×256→1024: 31.6 vs 22.0);
# - K not a multiple of 16 elements: Triton specialises integer arguments divisible by 16, so
#   rows of K = 200 are loaded without vector loads: 0.42-0.70× at every M (16384×200→800 + GELU:
#   108 vs 45 µs);
# - K > SHORT_K_MAX on sm_90: 0.59-0.82× at M ≤ 3000 (777×4096→1024: 26.9 vs 15.8 µs); only the
#   persistent TMA kernel at M > 8192 with N ≥ K kept up (16384×1024→4096 + GELU 1.04×,
#   16384×384→1536 1.06×; 16384×4096→1024 0.96×);
# - short K with N ≥ CUBLAS_MIN_N (0.90-1.02× at K = 96, N = 4096) and GELU over outputs of
#   CUBLAS_GELU_MIN_OUTPUT elements or more (16384×256→1024: 0.93×; ReLU/SiLU/residual there won,
#   1.05-1.27×).
# - ReLU after a bias, no residual: cuBLASLt fuses bias + ReLU into its own epilogue
#   (torch._addmm_activation; profiled: nvjet_…_relubias), as fast as the plain matmul
#   (16384×256→1024: 22.3 µs against 31.4 fused, 38.3 cuBLAS + torch ReLU).
# Elsewhere the fused kernel won: 1.04-1.49× at K = 96-256 with GELU, SiLU or a residual. Its
# main loop never beat cuBLAS's (it was slower than the plain matmul at every measured shape):
# it wins where the pass over the output it saves costs more than that.
CUBLAS_MIN_N = 4096
CUBLAS_GELU_MIN_OUTPUT = 1 << 24
# A norm before the linear (RMSNorm / LayerNorm; ``linear(..., norm=)``): the fused kernel sums its
# rows' statistics in its main loop, saving the norm's launch and its pass over x, where its main
# loop keeps up with cuBLAS's: K up to NORM_FUSED_MAX_K and fewer than NORM_FUSED_MAX_X elements of
# x (M bucket × K). Elsewhere the norm is a launch of its own and the rules above pick the route:
# cuBLAS or the fused kernel without it. H200 (bf16, qkv N = 3K no activation / MLP up N = 4K
# GELU; fused against the better of norm + cuBLAS and the unfolded path, in the norm-fold run of
# docs/benchmarks.md, which summed the statistics from the dot's tile: a
# separate load, as the kernels now do, took 9-23 % longer, so
# the margins below shrink by about that much):
# - K = 96: fused 0.70-0.95x the time at M 256-8192 (M 8192 qkv: 6.6 vs 9.4 µs);
# - K = 256: 0.77-0.93x at M 256-1024 (M 1024 MLP up: 7.0 vs 7.6 LayerNorm), gone with the load;
# - K = 512: 1.05-1.78x at every M (M 256 qkv: 9.8 vs 5.5): the pointer kernel's long-K main loop.
# Whole models with the rule as it stands: folded against unfolded in docs/benchmarks.md.
NORM_FUSED_MAX_K = 128
NORM_FUSED_MAX_X = 1 << 20


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
    if norm and fuses_norm(m_bucket_, k):
        return False
    if activation is None and not residual:
        return True
    if activation == "relu" and bias and not residual:
        return True
    if k % 16:
        return True
    if capability != (9, 0):
        return False
    if k > SHORT_K_MAX:
        return not (m_bucket_ > 8192 and n >= k)
    return n >= CUBLAS_MIN_N or (activation == "gelu" and m_bucket_ * n >= CUBLAS_GELU_MIN_OUTPUT)


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
