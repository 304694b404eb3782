"""Launch configs for the linear-attention kernels (``kernels/linear_attention/triton.py``).

The chunked forward runs one program per (batch·head, segment, block of ``block_v`` value
channels): it sums the state of the chunks before its segment (an accumulate-only matmul loop),
then walks its segment in chunks of ``chunk`` tokens, carrying its ``[D, block_v]`` fp32 slice of
the state in registers. Splitting V multiplies the programs by ``D / block_v`` (B·H alone rarely
fills 132 SMs) at the price of recomputing the ``[chunk, chunk]`` intra-chunk scores in each
program; splitting the sequence into ``split`` segments multiplies them again and divides the
serial walk (the kernel's latency) by ``split``, at the price of the prefix sums: segment s
re-reads s/split of the sequence's k and v. Longer chunks mean fewer sequential steps but
``chunk²·D`` intra-chunk work per ``chunk`` tokens.

The decode step reads and writes each head's ``D × D`` fp32 state once (memory-bound: 8·D²
bytes); a program owns ``block_v`` of its columns, so small batches still spread over the SMs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernels._common import SUPPORTED_HEAD_DIMS, padded_head_dim
from kernels.device import is_cuda

__all__ = [
    "ChunkConfig",
    "PrefixConfig",
    "StepConfig",
    "HOPPER",
    "DEFAULT",
    "INTERPRETER",
    "STEP",
    "INTERPRETER_STEP",
    "SUPPORTED_HEAD_DIMS",
    "MAX_SPLIT",
    "SPLIT_PROGRAMS_PER_SM",
    "chunk_configs",
    "padded_head_dim",
    "split_for",
    "step_config",
    "TwoPassConfig",
    "TWO_PASS_HOPPER",
    "TWO_PASS_INTERPRETER",
    "two_pass_config",
    "prefers_two_pass",
    "two_pass_group",
    "TwoPassPlan",
    "two_pass_plan",
    "TWO_PASS_ONE_GROUP_UP_TO",
    "TWO_PASS_DEEP_STAGES",
    "TWO_PASS_DEEP_UP_TO",
    "two_pass_states_stages",
    "CARRY_TILE",
    "CARRY_BLOCK_G",
    "TWO_PASS_STATE_PROGRAMS_PER_SM",
    "TWO_PASS_GROUP_BELOW",
    "PREFIX_HOPPER",
    "PREFIX_INTERPRETER",
    "prefix_config",
    "prefix_config_for",
    "prefers_prefix",
    "forward_route",
    "PREFIX_IDENTITY",
    "PREFIX_NORMALIZED",
]


def _power_of_two(owner: str, name: str, value: int) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{owner}.{name} must be a power of two >= 16, got {value}")


@dataclass(frozen=True)
class ChunkConfig:
    """chunk: tokens per sequential step; block_v: value channels per program (capped at D);
    num_warps, num_stages: as in ``triton.Config``; split: segments of the sequence walked in
    parallel (empty segments exit at once); autotuned launches take it from ``split_for`` and the
    interpreter's config instead."""

    chunk: int
    block_v: int
    num_warps: int
    num_stages: int
    split: int = 1

    def __post_init__(self) -> None:
        _power_of_two("ChunkConfig", "chunk", self.chunk)
        _power_of_two("ChunkConfig", "block_v", self.block_v)
        if self.split < 1:
            raise ValueError(f"ChunkConfig.split must be >= 1, got {self.split}")


@dataclass(frozen=True)
class StepConfig:
    """The decode step's launch: each program owns ``block_v`` columns of one head's ``D × D``
    state (the grid is B·H × D/block_v), with ``num_warps`` warps."""

    block_v: int
    num_warps: int

    def __post_init__(self) -> None:
        # no tl.dot here (unlike the chunked forward): any power of two from 4 columns is a tile
        if self.block_v < 4 or self.block_v & (self.block_v - 1):
            raise ValueError(f"StepConfig.block_v must be a power of two >= 4, got {self.block_v}")


# sm_90, per head dim: 64-token chunks as fla's chunk kernels use; V split 2-4 ways so B·H = 64 gives 128-256
# programs; 8 warps at D = 128, where 4 spill (the fp32 φq and state tiles). The single-stage tilings fit one more
# program per SM (ptxas -v); they are offered to the autotuner but not yet timed on a GPU.
HOPPER: dict[int, tuple[ChunkConfig, ...]] = {
    16: (ChunkConfig(64, 16, 4, 2), ChunkConfig(32, 16, 4, 2)),
    32: (ChunkConfig(64, 32, 4, 2), ChunkConfig(64, 16, 4, 2), ChunkConfig(64, 32, 4, 1)),
    64: (
        ChunkConfig(64, 32, 4, 2),
        ChunkConfig(64, 16, 4, 2),
        ChunkConfig(64, 64, 8, 2),
        ChunkConfig(64, 32, 4, 1),
        ChunkConfig(64, 16, 4, 1),
    ),
    128: (ChunkConfig(64, 32, 8, 2), ChunkConfig(64, 16, 8, 2), ChunkConfig(64, 64, 8, 2)),
}
# Sequence split: split s costs the prefix sums (segment i re-reads i/s of k and v) and pays only when the unsplit
# grid leaves SMs idle (docs/benchmarks.md, earlier experiments); hence the largest power of two that keeps the
# grid within SPLIT_PROGRAMS_PER_SM programs per SM.
SPLIT_PROGRAMS_PER_SM = 2
MAX_SPLIT = 16


def split_for(programs: int, chunks: int, sms: int) -> int:
    """Segments for a grid of ``programs`` (batch·heads·value blocks) over ``chunks`` chunks on
    ``sms`` SMs: doubled while the grid stays within SPLIT_PROGRAMS_PER_SM per SM and every
    segment keeps at least one chunk."""
    split = 1
    while split * 2 <= min(chunks, MAX_SPLIT) and programs * split * 2 <= SPLIT_PROGRAMS_PER_SM * sms:
        split *= 2
    return split


# Other CUDA GPUs until measured (block_v is capped at D).
DEFAULT = (ChunkConfig(64, 32, 4, 2),)
# TRITON_INTERPRET on CPU (tests): 16-token chunks so odd lengths cross several chunks and a
# masked tail; 16 value channels so D = 32 splits across two programs; two segments so the second
# starts from a prefix sum (and is empty at one chunk).
INTERPRETER = (ChunkConfig(16, 16, 4, 1, split=2),)
# The decode step is memory-bound (8·D² state bytes per head); at small batch B·H programs leave most SMs idle, so
# the state's columns are split until the grid has STEP_PROGRAMS_PER_SM programs per SM, the widest block first,
# down to 8 columns, which beat 16 on grids short of that (docs/benchmarks.md, earlier experiments).
STEP_BLOCK_V = (64, 32, 16, 8)
STEP_PROGRAMS_PER_SM = 2
STEP = StepConfig(block_v=64, num_warps=4)  # a full grid at D = 64: whole 64-column tiles (8 warps at D = 128)
# TRITON_INTERPRET: 16 columns, so D = 32 has two programs per head (the shared-z path)
INTERPRETER_STEP = StepConfig(block_v=16, num_warps=4)


@dataclass(frozen=True)
class TwoPassConfig:
    """The two-pass forward of the identity map (``triton.linear_attention`` with route
    "two_pass"): pass 1 walks the chunks of one (batch·head, ``block_k`` rows, ``block_v``
    columns) block of the state and stores the state before every chunk; pass 2 computes each
    chunk's ``block_v`` output columns from its stored state and its own tokens, all chunks in
    parallel. chunk: tokens per chunk (both passes); num_warps, num_stages: pass 2's, as in
    ``triton.Config``; states_warps, states_stages: pass 1's (its chunk walk is sequential, so
    fewer warps and deeper prefetch can pay), None: pass 2's warps and ``two_pass_states_stages``'s
    depth for the plan's grid; group: chunks per pass-1 program
    (the sequence is walked in groups in parallel, their totals carried over by a small scan
    between the passes), None: ``two_pass_group`` per shape."""

    chunk: int
    block_k: int
    block_v: int
    num_warps: int
    num_stages: int
    states_warps: int | None = None
    states_stages: int | None = None
    group: int | None = None

    def __post_init__(self) -> None:
        for name in ("chunk", "block_k", "block_v"):
            _power_of_two("TwoPassConfig", name, getattr(self, name))
        if self.group is not None and self.group < 1:
            raise ValueError(f"TwoPassConfig.group must be >= 1 or None, got {self.group}")


@dataclass(frozen=True)
class PrefixConfig:
    """The one-launch prefix forward of the identity map (``triton.linear_attention`` with route
    "prefix"): one program per (batch·head, chunk, ``block_v`` value columns), all at once; each
    sums the state of the chunks before its own (S = Σ kᵀv, accumulate-only matmuls over full
    chunks) and then computes its chunk's outputs, as pass 2 of the two-pass forward does from a
    stored state. No state goes to memory and there is one launch, at the price of re-reading the
    prefix: c·(chunk·D + chunk·block_v) elements for chunk c, so it is for short walks. chunk:
    tokens per chunk; num_warps, num_stages: as in ``triton.Config`` (the prefix loop pipelines
    like a GEMM's K loop)."""

    chunk: int
    block_v: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        _power_of_two("PrefixConfig", "chunk", self.chunk)
        _power_of_two("PrefixConfig", "block_v", self.block_v)


# sm_90: the first is the route's launch (64-token chunks, whole 64-wide state blocks, 4 warps in both passes;
# docs/benchmarks.md, earlier experiments); the rest are tested beside it. Pass 1's depth is left to
# ``two_pass_states_stages``; value blocks narrower than min(64, D) are refused on the GPU.
TWO_PASS_HOPPER: dict[int, tuple[TwoPassConfig, ...]] = {
    16: (TwoPassConfig(64, 16, 16, 4, 2),),
    32: (TwoPassConfig(64, 32, 32, 4, 2), TwoPassConfig(128, 32, 32, 4, 2)),
    64: (
        TwoPassConfig(64, 64, 64, 4, 2),
        TwoPassConfig(128, 32, 64, 8, 2),
        TwoPassConfig(128, 64, 64, 8, 2, 4, 2),
    ),
    128: (
        TwoPassConfig(64, 64, 64, 4, 2),
        TwoPassConfig(128, 32, 64, 8, 2),
        TwoPassConfig(64, 64, 128, 8, 2),
    ),
}


# The identity map's route on sm_90 for bf16: the two passes at every measured head dim; with pass 1 loading k
# transposed (prefetched with v) and pipelined deep they beat the fused kernel on full grids too
# (tests/kernels/data/linear_attention_pass_variants_h200_kt.json). D = 16 was not measured and stays fused.
def prefers_two_pass(capability: tuple[int, int], head_dim: int) -> bool:
    """Whether the bf16 identity-map forward at head dim ``head_dim`` runs as two passes rather
    than the fused kernel: on sm_90 at every measured head dim, whatever the rows and length
    (every measured shape ran faster as two passes, above), so a captured graph always launches
    the same kernels. Other GPUs keep the fused kernel until measured."""
    return capability == (9, 0) and head_dim in (32, 64, 128)


# The bf16 forward's route on sm_90 per feature map: the one-launch prefix forward for walks of at most [D][0]
# chunks while its redundant prefix reads, B·H·chunks², stay within [D][1]; the two passes otherwise. The rows
# these bounds rest on (each route forced): tests/kernels/data/linear_attention_routes_h200.json.
PREFIX_IDENTITY: dict[int, tuple[int, int]] = {32: (9, 4608), 64: (32, 8192), 128: (32, 4608)}
PREFIX_NORMALIZED: dict[int, tuple[int, int]] = {32: (8, 512), 64: (8, 512)}


def prefers_prefix(batch_heads: int, length: int, head_dim: int, feature_map: str) -> bool:
    """Whether a two-pass shape on sm_90 runs as the one-launch prefix forward instead: a walk of
    at most the table's chunks whose prefix work B·H·chunks² is within its bound (above)."""
    bounds = (PREFIX_IDENTITY if feature_map == "identity" else PREFIX_NORMALIZED).get(head_dim)
    chunks = -(-length // 64)
    return bounds is not None and chunks <= bounds[0] and batch_heads * chunks * chunks <= bounds[1]


def forward_route(capability: tuple[int, int], batch_heads: int, length: int, head_dim: int, feature_map: str) -> str:
    """The bf16 forward's route on a GPU of ``capability``: "prefix", "two_pass" or "fused"; a
    fixed rule per shape and map, measured on sm_90 (above), so a captured graph always launches
    the same kernels. Other GPUs keep the fused kernel until measured."""
    if capability != (9, 0) or head_dim not in (32, 64, 128):
        return "fused"
    if feature_map == "identity" and not prefers_two_pass(capability, head_dim):
        return "fused"
    return "prefix" if prefers_prefix(batch_heads, length, head_dim, feature_map) else "two_pass"


# TRITON_INTERPRET: 16-token chunks and 16-wide state blocks, so D = 32 has 2 × 2 blocks in pass 1
# and two programs per chunk in pass 2, odd lengths end in a masked chunk, and groups of 2 chunks
# put the carry between the passes on the path from 3 chunks up.
TWO_PASS_INTERPRETER = TwoPassConfig(16, 16, 16, 4, 1, group=2)

# The prefix forward's launches (route "prefix") on sm_90, the route's first: whole min(64, D)-column value blocks
# (narrower ones are refused on the GPU), 4 warps and a 3-stage prefix loop, the fastest or close to it at every
# identity-map shape of tests/kernels/data/linear_attention_routes_h200.json; the rest are the alternatives timed there.
PREFIX_HOPPER: dict[int, tuple[PrefixConfig, ...]] = {
    16: (PrefixConfig(64, 16, 4, 2),),
    32: (PrefixConfig(64, 32, 4, 3), PrefixConfig(64, 32, 4, 2), PrefixConfig(32, 32, 4, 3)),
    64: (
        PrefixConfig(64, 64, 4, 3),
        PrefixConfig(64, 64, 4, 2),
        PrefixConfig(64, 64, 8, 2),
        PrefixConfig(32, 64, 4, 3),
    ),
    128: (PrefixConfig(64, 64, 4, 3), PrefixConfig(64, 64, 8, 2), PrefixConfig(64, 128, 8, 2)),
}
# TRITON_INTERPRET: 16-token chunks (odd lengths end in a masked chunk, the prefix loop runs from
# the second chunk on) and 16 value columns (two programs per chunk at D = 32).
PREFIX_INTERPRETER = PrefixConfig(16, 16, 4, 1)


def prefix_config_for(head_dim: int) -> PrefixConfig:
    """The prefix forward's launch at ``head_dim`` on an sm_90 GPU (block_v capped at D)."""
    c = PREFIX_HOPPER.get(head_dim, (PrefixConfig(64, 64, 4, 2),))[0]
    return replace(c, block_v=min(c.block_v, head_dim))


def prefix_config(device: torch.device, head_dim: int) -> PrefixConfig:
    """The prefix forward's launch at ``head_dim`` on ``device`` (block_v capped at D)."""
    if is_cuda(device):
        return prefix_config_for(head_dim)
    return replace(PREFIX_INTERPRETER, block_v=min(PREFIX_INTERPRETER.block_v, head_dim))


# Pass 1's groups: a program's chunk walk is bound by one SM's share of the bandwidth, so while the state blocks
# leave most SMs idle (< TWO_PASS_GROUP_BELOW per SM) the chunks are split into groups up to
# TWO_PASS_STATE_PROGRAMS_PER_SM programs per SM. Each group adds an fp32 D×D total (written, scanned, re-read by
# pass 2), which fuller grids do not earn back (tests/kernels/data/linear_attention_two_pass_h200_focus.json).
TWO_PASS_GROUP_BELOW = 0.25
# A short walk stays in one group: the carry scan's launch and the fp32 totals cost more than the few sequential
# chunks they save (docs/benchmarks.md, earlier experiments).
TWO_PASS_ONE_GROUP_UP_TO = 8
TWO_PASS_STATE_PROGRAMS_PER_SM = 2
# Pass 1's pipeline depth (a config's states_stages None): a grid of few programs per SM is bound by each program's
# chain of chunk loads, which deeper stages prefetch further ahead; a fuller one by how many programs fit an SM,
# which deeper buffers cut (tests/kernels/data/linear_attention_pass_variants_h200_kt.json).
TWO_PASS_DEEP_STAGES = 4
TWO_PASS_DEEP_UP_TO = 3  # pass-1 programs per SM
# The carry scan: TILE state entries per program, BLOCK_G groups per step (a [16, 256] fp32 tile).
CARRY_TILE = 256
CARRY_BLOCK_G = 16


def two_pass_group(blocks: int, chunks: int, sms: int) -> int:
    """Chunks per pass-1 program for ``blocks`` = B·H·(D/block_k)·(D/block_v) state blocks over
    ``chunks`` chunks on ``sms`` SMs: all of them in one group unless the blocks leave most SMs
    idle (fewer than TWO_PASS_GROUP_BELOW per SM); then the largest group that still gives the
    grid TWO_PASS_STATE_PROGRAMS_PER_SM programs per SM (one chunk per group when even that
    falls short); a walk of at most TWO_PASS_ONE_GROUP_UP_TO chunks is never split."""
    if blocks >= TWO_PASS_GROUP_BELOW * sms or chunks <= TWO_PASS_ONE_GROUP_UP_TO:
        return chunks
    want = -(-TWO_PASS_STATE_PROGRAMS_PER_SM * sms // blocks)  # groups needed
    if want <= 1:
        return chunks
    if want >= chunks:
        return 1
    return -(-chunks // (want - 1)) - 1  # the largest g with ceil(chunks / g) ≥ want


@dataclass(frozen=True)
class TwoPassPlan:
    """The launches of one two-pass forward at ``batch_heads`` rows and head dim ``head_dim``:
    ``config`` (blocks capped at D), ``chunks`` chunks, pass 1 in ``groups`` groups of ``group``
    chunks (the carry scan runs between the passes when ``groups`` > 1)."""

    config: TwoPassConfig
    states_stages: int  # pass 1's pipeline depth: the config's, else two_pass_states_stages'
    batch_heads: int
    head_dim: int
    chunks: int
    group: int
    groups: int

    @property
    def carry(self) -> bool:
        return self.groups > 1

    @property
    def states_shape(self) -> tuple[int, int, int, int]:
        """Pass 1's states before every chunk (within its group): [B·H, chunks, D, D]."""
        return (self.batch_heads, self.chunks, self.head_dim, self.head_dim)

    @property
    def totals_shape(self) -> tuple[int, int, int, int] | None:
        """The groups' fp32 totals (their inclusive prefix after the scan), None with one group."""
        return (self.batch_heads, self.groups, self.head_dim, self.head_dim) if self.carry else None

    def buffer_bytes(self, state_bytes: int) -> int:
        """Bytes of the buffers between the passes, states at ``state_bytes`` per entry."""
        total = state_bytes * self.batch_heads * self.chunks * self.head_dim**2
        return total + (4 * self.batch_heads * self.groups * self.head_dim**2 if self.carry else 0)


def two_pass_plan(batch_heads: int, length: int, head_dim: int, config: TwoPassConfig, sms: int) -> TwoPassPlan:
    """``config``'s launches at ``batch_heads`` rows of ``length`` tokens on ``sms`` SMs: its
    ``group``, else ``two_pass_group``'s."""
    cfg = replace(config, block_k=min(config.block_k, head_dim), block_v=min(config.block_v, head_dim))
    chunks = -(-length // cfg.chunk)
    group = cfg.group
    if group is None:
        blocks = batch_heads * (head_dim // cfg.block_k) * (head_dim // cfg.block_v)
        group = two_pass_group(blocks, chunks, sms)
    group = max(1, min(group, chunks))
    groups = -(-chunks // group)
    programs = batch_heads * (head_dim // cfg.block_k) * (head_dim // cfg.block_v) * groups
    stages = cfg.states_stages or two_pass_states_stages(programs, sms, cfg.num_stages)
    return TwoPassPlan(cfg, stages, batch_heads, head_dim, chunks, group, groups)


def two_pass_states_stages(programs: int, sms: int, otherwise: int) -> int:
    """Pass 1's pipeline depth for a grid of ``programs`` on ``sms`` SMs: TWO_PASS_DEEP_STAGES
    up to TWO_PASS_DEEP_UP_TO programs per SM, else ``otherwise`` (pass 2's)."""
    return TWO_PASS_DEEP_STAGES if programs <= TWO_PASS_DEEP_UP_TO * sms else otherwise


def two_pass_config(device: torch.device, head_dim: int) -> TwoPassConfig:
    """The two-pass launch at ``head_dim`` on ``device`` (blocks capped at D)."""
    if not is_cuda(device):
        c = TWO_PASS_INTERPRETER
    else:
        c = TWO_PASS_HOPPER.get(head_dim, (TwoPassConfig(64, 64, 64, 4, 2),))[0]
    return replace(c, block_k=min(c.block_k, head_dim), block_v=min(c.block_v, head_dim))


_BY_CAPABILITY = {(9, 0): HOPPER}


def chunk_configs(device: torch.device, head_dim: int) -> tuple[ChunkConfig, ...]:
    """Autotune candidates for the chunked forward on ``device`` at ``head_dim`` (block_v ≤ D
    once the caller caps it)."""
    if not is_cuda(device):
        return INTERPRETER
    by_dim = _BY_CAPABILITY.get(torch.cuda.get_device_capability(device))
    return by_dim[head_dim] if by_dim is not None else DEFAULT


def step_config(device: torch.device, heads: int, head_dim: int, sms: int) -> StepConfig:
    """The decode step's launch for ``heads`` = B·H heads of ``head_dim`` on ``device`` with
    ``sms`` SMs: the widest ``STEP_BLOCK_V`` that still gives STEP_PROGRAMS_PER_SM programs per
    SM, else the narrowest (fixed per shape: the kernel updates the state in place, so it cannot
    be autotuned by rerunning, and a graph-captured step must launch the same way every time)."""
    if not is_cuda(device):
        return StepConfig(min(INTERPRETER_STEP.block_v, head_dim), INTERPRETER_STEP.num_warps)
    widths = [b for b in STEP_BLOCK_V if b <= head_dim] or [head_dim]
    block_v = next((b for b in widths if heads * (head_dim // b) >= STEP_PROGRAMS_PER_SM * sms), widths[-1])
    return StepConfig(block_v, _step_warps(head_dim, block_v))


def _step_warps(head_dim: int, block_v: int) -> int:
    """8 warps for a 128 × 64 state tile or larger, and for 8-column tiles of D ≥ 128 (measured: the
    narrow tile's loads want the extra warps in flight); 4 otherwise."""
    return 8 if head_dim * block_v >= 8192 or (block_v <= 8 and head_dim >= 128) else 4


def step_configs(head_dim: int) -> tuple[StepConfig, ...]:
    """Every launch ``step_config`` may choose on a GPU at ``head_dim`` (the GPU tests run each)."""
    widths = [b for b in STEP_BLOCK_V if b <= head_dim] or [head_dim]
    return tuple(StepConfig(b, _step_warps(head_dim, b)) for b in widths)
