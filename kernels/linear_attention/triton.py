"""Causal linear attention (Katharopoulos et al. 2020): the chunked forward (one fused launch, two
passes, or one prefix launch, by shape) and the recurrent single-token step for decoding.

Math, as ``reference`` and ``nas.models.mixers.LinearAttention``: φ is the feature map; with S_t =
Σ_{s≤t} φ(k_s)v_sᵀ and z_t = Σ_{s≤t} φ(k_s), o_t = φ(q_t)·S_t / (φ(q_t)·z_t + EPS) for the positive
maps (elu+1, relu); the identity map is unnormalized with q scaled by D^-1/2: o_t = D^-1/2·q_t·S_t.

Layout: as ``kernels.attention``: q, k, v ``[B, H, T, D]`` with any strides, so views of the
fused ``[B, T, 3, H, D]`` projection are read in place through per-head tensor descriptors
(``kernels/_common.py``); out ``[B, T, H·D]``. The raw projections go in: φ (and the
identity map's scale) is applied in-kernel.

The fused kernel: one launch. A program owns one (batch, head), one segment of the sequence and BLOCK_V of its
D value channels. It first sums the state of the chunks before its segment (S = Σ φ(k)ᵀv, z =
Σ φ(k): accumulate-only matmuls, no outputs), then walks its segment's T/CHUNK chunks in order,
carrying its fp32 state slice S[:, block] ``[D, BLOCK_V]`` and z ``[D]`` in registers: per chunk
it reads q, k ``[CHUNK, D]`` and v ``[CHUNK, BLOCK_V]``, writes o ``[CHUNK, BLOCK_V]``, and does
three matmuls — intra-chunk scores φq·φkᵀ (2·C²·D FLOPs), their masked product with v (2·C²·BV)
and the inter-chunk φq·S (2·C·D·BV) — plus the state update φkᵀ·v (2·C·D·BV). No state ever goes
to memory. The alternative (fla's chunk kernels: states per chunk to memory, then a parallel
output pass) buys parallelism over T with two launches and 2·D²·T/C state bytes; here the V split
and, when B·H·D/BV programs leave SMs idle, the sequence split (``configs.split_for``) supply it.

The sequence split pays only while the unsplit grid leaves SMs idle, and a fully occupied grid stays unsplit
(``configs.split_for``). How each route compares with fla-core's ``chunk_linear_attn`` is in the linear-attention
rows of docs/benchmarks.md.

On sm_90 (bf16) the forward takes one of three routes per shape and feature map
(``configs.forward_route``). The two passes: pass 1 writes the state (and z for the normalized
maps) before every chunk, walking the chunks in groups in parallel when the state blocks alone
leave SMs idle (a small scan then carries each group's total to the next), and pass 2 computes
every chunk's outputs at once. Both read with plain masked loads: a program there handles one or a
few chunks, too few to amortise building tensor descriptors on the device. The prefix forward: pass 2's
grid alone, each program summing the state of the chunks before its own — one launch and no state in
memory, for short walks on small grids. The fused kernel runs everything off sm_90 and at D = 16. The
rule rests on every route forced at every shape: tests/kernels/data/linear_attention_routes_h200.json.

Precision: φq·φkᵀ, scores·v and φkᵀ·v take input-dtype operands with fp32 accumulation (the
tensor-core path). The fused kernel keeps S in fp32 for φq·S (tf32 operands on GPU); the two
passes and the prefix forward round S once to bf16 for bf16 inputs, as fla-core stores its
states (fp32 for fp16 and fp32 inputs: fp16 sums of T products can overflow); z is always fp32.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._autotune import autotune
from kernels._common import (
    INTERPRETED,
    Routes,
    check_heads,
    output_buffer,
    pdl,
    sm_count,
    tma_ready,
    use_torch_allocator,
)
from kernels._pdl import enter
from kernels.device import is_cuda
from kernels.linear_attention.configs import (
    CARRY_BLOCK_G,
    CARRY_TILE,
    ChunkConfig,
    PrefixConfig,
    StepConfig,
    TwoPassConfig,
    TwoPassPlan,
    chunk_configs,
    forward_route,
    prefix_config,
    split_for,
    step_config,
    two_pass_config,
)
from kernels.linear_attention.configs import two_pass_plan as configs_two_pass_plan
from kernels.linear_attention.reference import CHUNK, EPS, FEATURE_MAPS, normalizes

__all__ = [
    "linear_attention",
    "linear_attention_qkv",
    "linear_attention_step",
    "last_route",
    "last_tuned_config",
    "set_route",
    "two_pass_plan",
    "TwoPassPlan",
]

_EPS = tl.constexpr(EPS)


@triton.jit
def _feature(x, FEATURE: tl.constexpr):
    """φ(x) in fp32."""
    if FEATURE == "elu+1":
        return tl.where(x > 0, x + 1.0, tl.exp(x))  # elu(x) + 1 = exp(x) for x ≤ 0
    elif FEATURE == "relu":
        return tl.maximum(x, 0.0)
    else:
        return x


@triton.jit
def _chunk(
    S,
    Z,
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    t0,
    o_col,
    T,
    q_scale,
    MASKED: tl.constexpr,
    FEATURE: tl.constexpr,
    NORMALIZE: tl.constexpr,
    SUM_Z: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One chunk of CHUNK tokens from t0: writes its outputs and returns the state after it.

    The normalizer rides on the tensor cores too: Z ``[D, 16]`` holds z in column 0 (zeros
    elsewhere, the smallest matmul width), so φq·z and the score row sums are two thin matmuls
    against a one-hot column instead of reductions over register tiles in a second layout.
    """
    q = q_desc.load([t0, 0])  # [CHUNK, D]
    k = k_desc.load([t0, 0])
    v = v_desc.load([t0, 0])  # [CHUNK, BLOCK_V]; rows past T arrive as zeros
    qf = _feature(q.to(tl.float32), FEATURE) * q_scale
    kf = _feature(k.to(tl.float32), FEATURE)
    rows = t0 + tl.arange(0, CHUNK)
    if MASKED:
        kf = tl.where(rows[:, None] < T, kf, 0.0)  # φ(0) = 1 for elu+1: padded keys must not reach z
    qc = qf.to(v.dtype)
    kc = kf.to(v.dtype)
    first = (tl.arange(0, 16) == 0)[None, :]
    ones = tl.where(first, 1.0, 0.0).to(v.dtype) + tl.zeros([CHUNK, 16], v.dtype)  # [CHUNK, 16] one-hot column

    scores = tl.dot(qc, tl.trans(kc))  # [CHUNK, CHUNK] fp32
    scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0).to(v.dtype)
    o = tl.dot(scores, v)  # intra-chunk [CHUNK, BLOCK_V]
    o = tl.dot(qf, S, o)  # + inter-chunk, the state before this chunk, fp32 operands
    if NORMALIZE:
        denom = tl.dot(qf, Z, tl.dot(scores, ones))  # column 0: Σ_s≤t in chunk q·k + φq·z
        o = o / (tl.sum(denom, 1) + _EPS)[:, None]
    if SUM_Z:
        Z = tl.dot(tl.trans(kc), ones, Z)  # z += Σ φ(k)
    S = tl.dot(tl.trans(kc), v, S)  # S += φ(k)ᵀ·v
    o_desc.store([t0, o_col], o.to(v.dtype))  # o has v's dtype; rows past T are dropped
    return S, Z


@triton.jit
def _state_of(S, Z, k_desc, v_desc, t0, FEATURE: tl.constexpr, SUM_Z: tl.constexpr, CHUNK: tl.constexpr):
    """S += φ(k)ᵀ·v and z += Σ φ(k) over the full chunk at t0: the prefix loop's step, a plain
    accumulating matmul (no output, no scores), so consecutive chunks pipeline like a GEMM's K loop."""
    k = k_desc.load([t0, 0])  # [CHUNK, D]
    v = v_desc.load([t0, 0])  # [CHUNK, BLOCK_V]
    if FEATURE == "identity":
        kc = k
    else:
        kc = _feature(k.to(tl.float32), FEATURE).to(v.dtype)
    if SUM_Z:
        first = (tl.arange(0, 16) == 0)[None, :]
        ones = tl.where(first, 1.0, 0.0).to(v.dtype) + tl.zeros([CHUNK, 16], v.dtype)
        Z = tl.dot(tl.trans(kc), ones, Z)
    S = tl.dot(tl.trans(kc), v, S)
    return S, Z


@triton.jit(do_not_specialize=["BH", "SPLIT"])
def _chunked_fwd_kernel(
    Q,
    K,
    V,
    O,
    S_OUT,
    Z_OUT,  # q, k, v [B, H, T, D] strided; o [B, T, H·D]; S_OUT [B, H, D, D], Z_OUT [B, H, D] fp32
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    H,
    T,
    BH,
    q_scale,
    SPLIT,
    HEAD_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK: tl.constexpr,
    FEATURE: tl.constexpr,
    NORMALIZE: tl.constexpr,
    STORE_STATE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # One program per (batch·head, segment of the sequence, block of value channels), flattened
    # so the programs of one head are adjacent (its k, v stay in L2 for the prefix loops) and,
    # within a head, the last segment (the longest prefix) starts first.
    NV: tl.constexpr = HEAD_DIM // BLOCK_V
    pid = tl.program_id(0)
    v0 = (pid % NV) * BLOCK_V
    seg = SPLIT - 1 - (pid // NV) % SPLIT
    bh = pid // (NV * SPLIT)
    # Balanced segments: [seg·n/SPLIT, (seg+1)·n/SPLIT) chunks, so none is empty while SPLIT ≤ n
    # (split_for keeps it so) and the chunks before any segment are full (c_lo ≤ n − 1).
    n_chunks = tl.cdiv(T, CHUNK)
    c_lo = seg * n_chunks // SPLIT
    c_hi = (seg + 1) * n_chunks // SPLIT
    if c_lo >= c_hi:  # an explicit split with more segments than chunks
        return
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # Descriptors over this head's [T, D] rows (v and o: this program's BLOCK_V columns of them).
    q_desc = tl.make_tensor_descriptor(
        Q + b * stride_qb + h * stride_qh, [T, HEAD_DIM], [stride_qt, 1], [CHUNK, HEAD_DIM]
    )
    k_desc = tl.make_tensor_descriptor(
        K + b * stride_kb + h * stride_kh, [T, HEAD_DIM], [stride_kt, 1], [CHUNK, HEAD_DIM]
    )
    v_desc = tl.make_tensor_descriptor(
        V + b * stride_vb + h * stride_vh + v0, [T, HEAD_DIM - v0], [stride_vt, 1], [CHUNK, BLOCK_V]
    )
    o_desc = tl.make_tensor_descriptor(
        O + b * T * (H * HEAD_DIM), [T, H * HEAD_DIM], [H * HEAD_DIM, 1], [CHUNK, BLOCK_V]
    )
    o_col = (h * HEAD_DIM + v0).to(tl.int32)

    S = tl.zeros([HEAD_DIM, BLOCK_V], tl.float32)
    Z = tl.zeros([HEAD_DIM, 16], tl.float32)  # z in column 0
    SUM_Z: tl.constexpr = NORMALIZE or STORE_STATE  # the identity map needs z only to hand it on
    # The state at the segment's start, from the chunks before it (all full).
    for c in range(0, c_lo):
        S, Z = _state_of(S, Z, k_desc, v_desc, c * CHUNK, FEATURE, SUM_Z, CHUNK)
    # Then the segment's own chunks in order, carrying the state.
    full = tl.minimum(T // CHUNK, c_hi)
    for c in range(c_lo, full):
        S, Z = _chunk(
            S, Z, q_desc, k_desc, v_desc, o_desc, c * CHUNK, o_col, T, q_scale, False, FEATURE, NORMALIZE, SUM_Z, CHUNK
        )
    for c in range(tl.maximum(full, c_lo), c_hi):  # the partial last chunk, if any
        S, Z = _chunk(
            S, Z, q_desc, k_desc, v_desc, o_desc, c * CHUNK, o_col, T, q_scale, True, FEATURE, NORMALIZE, SUM_Z, CHUNK
        )

    if STORE_STATE:  # the last segment ends with the whole sequence's state; 4·D·BLOCK_V (+ 4·D) bytes
        if c_hi == n_chunks:  # only the last segment (never empty) ends there
            d = tl.arange(0, HEAD_DIM)
            dv = tl.arange(0, BLOCK_V)
            state = S_OUT + bh.to(tl.int64) * HEAD_DIM * HEAD_DIM + v0
            tl.store(state + d[:, None] * HEAD_DIM + dv[None, :], S)
            if v0 == 0:  # every V block computed the same z; one writes it
                tl.store(Z_OUT + bh.to(tl.int64) * HEAD_DIM + d, tl.sum(Z, 1))


@triton.jit
def _step_kernel(
    Q,
    K,
    V,
    S,
    Z,
    O,  # q, k, v [B, H, D] strided; S [B, H, D, D], Z [B, H, D] fp32 in place; o [B, H·D]
    TICKETS,  # int32 [B·H], zero between launches: how many of a head's programs have read z
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    H,
    q_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FEATURE: tl.constexpr,
    NORMALIZE: tl.constexpr,
    HAS_Z: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program (head, j) updates and reads columns j·BLOCK_V.. of the head's state: 8·D·BLOCK_V
    # state bytes, plus 2·D + BLOCK_V inputs and BLOCK_V outputs.
    bh = tl.program_id(0)
    col = tl.program_id(1) * BLOCK_V
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    dv = col + tl.arange(0, BLOCK_V)
    qf = _feature(tl.load(Q + b * stride_qb + h * stride_qh + d).to(tl.float32), FEATURE) * q_scale
    kf = _feature(tl.load(K + b * stride_kb + h * stride_kh + d).to(tl.float32), FEATURE)
    v = tl.load(V + b * stride_vb + h * stride_vh + dv).to(tl.float32)
    s_ptrs = S + bh.to(tl.int64) * HEAD_DIM * HEAD_DIM + d[:, None] * HEAD_DIM + dv[None, :]
    s_prev = tl.load(s_ptrs)
    if HAS_Z:  # always when NORMALIZE. Loaded before the state is stored: one memory round trip, not two
        z_ptrs = Z + bh.to(tl.int64) * HEAD_DIM + d
        z = tl.load(z_ptrs) + kf  # z_t from z_{t-1}: every program of the head needs it
    s = s_prev + kf[:, None] * v[None, :]  # S_t = S_{t-1} + φ(k_t)v_tᵀ, this block of columns
    tl.store(s_ptrs, s)
    o = tl.sum(qf[:, None] * s, 0)  # φ(q_t)·S_t  [BLOCK_V]
    if NORMALIZE:
        o = o / (tl.sum(qf * z, 0) + _EPS)
    tl.store(O + b * H * HEAD_DIM + h * HEAD_DIM + dv, o.to(O.dtype.element_ty))  # before the ticket's round trip
    if HAS_Z:
        if HEAD_DIM // BLOCK_V == 1:
            tl.store(z_ptrs, z)
        else:
            # The last of the head's programs to read z_{t-1} writes z_t: each read is ordered
            # before its acq_rel ticket, so no program can read a z already advanced. It re-arms
            # the ticket for the next launch.
            tl.debug_barrier()  # every thread's read of z_{t-1} precedes the ticket that releases them
            ticket = tl.atomic_add(TICKETS + bh, 1, sem="acq_rel")
            if ticket == HEAD_DIM // BLOCK_V - 1:
                tl.store(z_ptrs, z)
                tl.atomic_xchg(TICKETS + bh, 0, sem="relaxed")


@triton.jit(do_not_specialize=["NC", "GROUP"])
def _two_pass_states_kernel(
    K,
    V,
    HS,
    ZS,
    TOTALS,  # k, v [B, H, T, D] strided; HS [B·H, NC, D, D] in HS's dtype; ZS [B·H, NC, D], TOTALS [B·H, NG, ROW] fp32
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    H,
    T,
    NC,
    GROUP,
    HEAD_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK: tl.constexpr,
    CARRY: tl.constexpr,
    ROW: tl.constexpr,
    FEATURE: tl.constexpr = "identity",
    NORMALIZE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Pass 1, one program per (batch·head, group of GROUP chunks, block of state rows, block of
    # state columns): the state S = Σ φ(k)ᵀv is a plain sum, separable by rows and columns and
    # by chunks, so each program walks only its group's chunks from zero, storing the state
    # before each chunk *within the group*; with several groups (CARRY) it also stores its
    # group's total, whose prefix over the groups (``_two_pass_carry_kernel``) pass 2 adds.
    # NORMALIZE: also z = Σ φ(k) before each chunk (ZS) and in the totals (entries D·D onward of
    # a ROW), stored by the programs of the first column block.
    NG = tl.cdiv(NC, GROUP)
    pid = tl.program_id(0)
    bh = pid // NG
    g = pid % NG
    k0 = tl.program_id(1) * BLOCK_K
    v0 = tl.program_id(2) * BLOCK_V
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # Plain masked loads, not tensor descriptors: a program here walks a group of a few chunks,
    # too short to amortise building descriptors on the device.
    # k is loaded transposed, [BLOCK_K, CHUNK] (key columns down, tokens across), so it goes to
    # the matmul as it came, through shared memory; a [CHUNK, BLOCK_K] load transposed in
    # registers cost a layout conversion and its barriers in every step of this sequential walk.
    # A step's addresses: the chunk's first row as one scalar (64-bit), plus offsets within the
    # chunk fixed before the walk (32-bit: CHUNK rows of a stride the host checked), so no
    # element's address is multiplied out in the loop.
    t = tl.arange(0, CHUNK)
    k_in = (k0 + tl.arange(0, BLOCK_K))[:, None] + t[None, :] * stride_kt  # [BLOCK_K, CHUNK]
    v_in = t[:, None] * stride_vt + (v0 + tl.arange(0, BLOCK_V))[None, :]  # [CHUNK, BLOCK_V]
    k_head = K + b * stride_kb + h * stride_kh
    v_head = V + b * stride_vb + h * stride_vh
    tile = (k0 + tl.arange(0, BLOCK_K))[:, None] * HEAD_DIM + (v0 + tl.arange(0, BLOCK_V))[None, :]
    states = HS + bh.to(tl.int64) * NC * HEAD_DIM * HEAD_DIM + tile
    z_rows = ZS + bh.to(tl.int64) * NC * HEAD_DIM + k0 + tl.arange(0, BLOCK_K)
    S = tl.zeros([BLOCK_K, BLOCK_V], tl.float32)
    z = tl.zeros([BLOCK_K], tl.float32)
    c_lo = g * GROUP
    for c in range(c_lo, tl.minimum(c_lo + GROUP, NC)):
        c64 = tl.cast(c, tl.int64)
        tl.store(states + c64 * HEAD_DIM * HEAD_DIM, S.to(HS.dtype.element_ty))
        t0 = c64 * CHUNK
        live = t < T - t0  # tokens of this chunk before T
        kt = tl.load(k_head + t0 * stride_kt + k_in, mask=live[None, :], other=0.0)  # [BLOCK_K, CHUNK]; zeros past T
        v = tl.load(v_head + t0 * stride_vt + v_in, mask=live[:, None], other=0.0)  # [CHUNK, BLOCK_V]
        if FEATURE != "identity":  # φ(0) = 1 for elu+1: keys past T must not reach z
            kf = tl.where(live[None, :], _feature(kt.to(tl.float32), FEATURE), 0.0)
            kt = kf.to(v.dtype)
            if NORMALIZE:
                if v0 == 0:
                    tl.store(z_rows + c64 * HEAD_DIM, z)
                z += tl.sum(kf, 1)
        S = tl.dot(kt, v, S)
    if CARRY:
        total = TOTALS + (bh.to(tl.int64) * NG + g) * ROW
        tl.store(total + tile, S)
        if NORMALIZE:
            if v0 == 0:
                tl.store(total + HEAD_DIM * HEAD_DIM + k0 + tl.arange(0, BLOCK_K), z)


@triton.jit(do_not_specialize=["NG"])
def _two_pass_carry_kernel(
    TOTALS, NG, DD: tl.constexpr, TILE: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Between the passes when pass 1 ran in several groups: TOTALS [B·H, NG, DD] fp32 in place
    # from each group's own sum to the sum of it and the groups before it (an inclusive prefix
    # over g; pass 2 of group g reads entry g - 1), one program per (batch·head, TILE entries of
    # a row: the state's D·D, then z's tile for the normalized maps), BLOCK_G groups per step.
    # Inclusive, not exclusive as ``prefix - x``: a group whose sum dwarfs the prefix before it
    # would cancel that prefix's digits away.
    bh = tl.program_id(0).to(tl.int64)
    base = TOTALS + bh * NG * DD + (tl.program_id(1) * TILE + tl.arange(0, TILE))[None, :]
    carry = tl.zeros([TILE], tl.float32)
    for g0 in range(0, NG, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)[:, None]
        rows = gs.to(tl.int64) * DD
        x = tl.load(base + rows, mask=gs < NG, other=0.0)  # [BLOCK_G, TILE]
        tl.store(base + rows, carry[None, :] + tl.cumsum(x, 0), mask=gs < NG)
        carry += tl.sum(x, 0)


@triton.jit(do_not_specialize=["NC", "GROUP"])
def _two_pass_out_kernel(
    Q,
    K,
    V,
    HS,
    ZS,
    TOTALS,
    O,  # q, k, v [B, H, T, D] strided; HS [B·H, NC, D, D]; ZS [B·H, NC, D]; TOTALS [B·H, NG, ROW] fp32; o [B, T, H·D]
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    H,
    T,
    NC,
    GROUP,
    q_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK: tl.constexpr,
    CARRY: tl.constexpr,
    ROW: tl.constexpr,
    FEATURE: tl.constexpr = "identity",
    NORMALIZE: tl.constexpr = False,
    PREFIX: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Pass 2, one program per (batch·head·chunk, block of value columns), all chunks at once:
    # o = (φq·φkᵀ ⊙ causal)·v within the chunk + φq·S (the state before it: pass 1's, plus the
    # groups before this chunk's group when pass 1 ran in several); NORMALIZE divides by the
    # same form with v = 1: the scores' row sums + φq·z. PREFIX: the one-launch prefix forward
    # instead — no pass 1; each program sums its own state (and z) from the chunks before its
    # chunk (HS, ZS and TOTALS unread), the latest chunks first (they have the longest prefix).
    pid = tl.program_id(0)
    bh = pid // NC
    c = NC - 1 - pid % NC if PREFIX else pid % NC
    v0 = tl.program_id(1) * BLOCK_V
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t0 = (c * CHUNK).to(tl.int64)  # row offsets in int64 from the chunk's start, local ones in int32
    r = tl.arange(0, CHUNK)[:, None]
    live = t0 + r < T
    d = tl.arange(0, HEAD_DIM)[None, :]
    cols = v0 + tl.arange(0, BLOCK_V)
    q = tl.load(Q + b * stride_qb + h * stride_qh + t0 * stride_qt + r * stride_qt + d, mask=live, other=0.0)
    k = tl.load(K + b * stride_kb + h * stride_kh + t0 * stride_kt + r * stride_kt + d, mask=live, other=0.0)
    v = tl.load(
        V + b * stride_vb + h * stride_vh + t0 * stride_vt + r * stride_vt + cols[None, :], mask=live, other=0.0
    )
    # q [CHUNK, D], v [CHUNK, BLOCK_V]; zeros past T. Keys past T (φ(0) = 1 for elu+1) only meet
    # queries past T, whose rows are not stored.
    qf = _feature(q.to(tl.float32), FEATURE) * q_scale
    qc = qf.to(v.dtype)
    if FEATURE == "identity":
        kc = k
    else:
        kc = _feature(k.to(tl.float32), FEATURE).to(v.dtype)
    scores = tl.dot(qc, tl.trans(kc))  # [CHUNK, CHUNK] fp32
    scores = tl.where(r >= tl.arange(0, CHUNK)[None, :], scores, 0.0)
    o = tl.dot(scores.to(v.dtype), v)  # intra-chunk
    tile = tl.arange(0, HEAD_DIM)[:, None] * HEAD_DIM + cols[None, :]
    z = tl.zeros([HEAD_DIM], tl.float32)
    if PREFIX:  # S = Σ φ(k)ᵀv over the full chunks before this one, rounded once as pass 1 stores it
        S = tl.zeros([HEAD_DIM, BLOCK_V], tl.float32)
        # k transposed as loaded, [D, CHUNK], as in pass 1: prefetched like v (ptxas -v)
        k_cols = K + b * stride_kb + h * stride_kh + tl.trans(d) + tl.trans(r) * stride_kt
        v_rows = V + b * stride_vb + h * stride_vh + r * stride_vt + cols[None, :]
        for j in range(0, c):
            t = tl.cast(j, tl.int64) * CHUNK
            kj = tl.load(k_cols + t * stride_kt)  # [D, CHUNK]
            vj = tl.load(v_rows + t * stride_vt)
            if FEATURE != "identity":
                kjf = _feature(kj.to(tl.float32), FEATURE)
                kj = kjf.to(vj.dtype)
                if NORMALIZE:
                    z += tl.sum(kjf, 1)
            S = tl.dot(kj, vj, S)
        S = S.to(HS.dtype.element_ty)
    else:
        S = tl.load(HS + (bh.to(tl.int64) * NC + c) * HEAD_DIM * HEAD_DIM + tile)
        if NORMALIZE:
            z = tl.load(ZS + (bh.to(tl.int64) * NC + c) * HEAD_DIM + tl.arange(0, HEAD_DIM))
    if CARRY:  # the groups before this one (the scan's entry g - 1), in fp32, rounded once to the states' dtype
        g = c // GROUP
        before = TOTALS + (bh.to(tl.int64) * tl.cdiv(NC, GROUP) + tl.maximum(g - 1, 0)) * ROW
        carry = tl.where(g > 0, tl.load(before + tile), 0.0)  # group 0 has none (it reads its own total, unused)
        S = (S.to(tl.float32) + carry).to(HS.dtype.element_ty)
        if NORMALIZE:
            z += tl.where(g > 0, tl.load(before + HEAD_DIM * HEAD_DIM + tl.arange(0, HEAD_DIM)), 0.0)
    if HS.dtype.element_ty == tl.float32:
        o = tl.dot(qf, S, o)  # + inter-chunk, fp32 state (fp16 and fp32 inputs)
    else:
        o = tl.dot(qc, S, o)  # + inter-chunk, 16-bit state
    if NORMALIZE:
        o = o / (tl.sum(scores, 1) + tl.sum(qf * z[None, :], 1) + _EPS)[:, None]
    out = O + (b * T + t0) * (H * HEAD_DIM) + r * (H * HEAD_DIM) + h * HEAD_DIM + cols[None, :]
    tl.store(out, o.to(v.dtype), mask=live)


def _capped(c: TwoPassConfig, head_dim: int) -> TwoPassConfig:
    return dataclasses.replace(c, block_k=min(c.block_k, head_dim), block_v=min(c.block_v, head_dim))


def two_pass_plan(device: torch.device, batch_heads: int, T: int, head_dim: int, config: TwoPassConfig) -> TwoPassPlan:
    """``configs.two_pass_plan`` for ``device``'s SMs (the interpreter: one SM, so a config
    without a group runs one group unless the walk is split by ``group``)."""
    return configs_two_pass_plan(batch_heads, T, head_dim, config, sm_count(device) if is_cuda(device) else 1)


def _state_dtype(x: Tensor) -> torch.dtype:
    """The states between the passes: bf16 for bf16 inputs (each rounded once from fp32, as
    fla-core stores them), fp32 otherwise (fp16 sums of T products can overflow)."""
    return torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32


def _total_row(head_dim: int, normalize: bool) -> int:
    """Entries per group total: the state's D·D, then (normalized maps) one scan tile holding z."""
    return head_dim * head_dim + (min(head_dim * head_dim, CARRY_TILE) if normalize else 0)


def _walkable(x: Tensor, chunk: int) -> Tensor:
    """``x`` [B, H, T, D] as pass 1 can address it: a chunk's rows are 32-bit offsets from its
    first row, so a token stride whose ``chunk`` rows pass 2³¹ elements is made contiguous."""
    return x.contiguous() if x.stride(2) * chunk >= 2**31 else x


def _two_pass_states(k: Tensor, v: Tensor, plan: TwoPassPlan, feature_map: str) -> tuple[Tensor, Tensor, Tensor]:
    """Pass 1 (and the carry between the passes): (states before every chunk within its group,
    z before every chunk — ``states``, unread, for the identity map —, the prefix of the groups'
    totals — ``states``, unread, when there is one group)."""
    B, H, T, D = k.shape
    cfg = plan.config
    k, v = _walkable(k, cfg.chunk), _walkable(v, cfg.chunk)
    normalize = normalizes(feature_map)
    states = torch.empty(plan.states_shape, device=k.device, dtype=_state_dtype(k))
    zs = torch.empty(plan.states_shape[:3], device=k.device, dtype=torch.float32) if normalize else states
    carry = plan.carry
    row = _total_row(D, normalize)
    totals = torch.empty((B * H, plan.groups, row), device=k.device, dtype=torch.float32) if carry else states
    _two_pass_states_kernel[(B * H * plan.groups, D // cfg.block_k, D // cfg.block_v)](
        k,
        v,
        states,
        zs,
        totals,
        *k.stride()[:3],
        *v.stride()[:3],
        H,
        T,
        plan.chunks,
        plan.group,
        HEAD_DIM=D,
        BLOCK_K=cfg.block_k,
        BLOCK_V=cfg.block_v,
        CHUNK=cfg.chunk,
        CARRY=carry,
        ROW=row,
        FEATURE=feature_map,
        NORMALIZE=normalize,
        num_warps=cfg.states_warps or cfg.num_warps,
        num_stages=plan.states_stages,
        **pdl(k),
    )
    if carry:
        tile = min(D * D, CARRY_TILE)
        _two_pass_carry_kernel[(B * H, row // tile)](
            totals, plan.groups, DD=row, TILE=tile, BLOCK_G=CARRY_BLOCK_G, num_warps=4, **pdl(totals)
        )
    return states, zs, totals


def _two_pass_out(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    states: Tensor,
    zs: Tensor,
    totals: Tensor,
    o: Tensor,
    q_scale: float,
    plan: TwoPassPlan,
    feature_map: str,
    prefix: bool = False,
) -> None:
    """Pass 2: every chunk's outputs from its state (plus its group's carry) and its own tokens;
    ``prefix``: each chunk's state summed by its own program instead (``states``: a tensor of
    the states' dtype, unread; ``zs`` and ``totals`` unread)."""
    B, H, T, D = q.shape
    cfg = plan.config
    normalize = normalizes(feature_map)
    _two_pass_out_kernel[(B * H * plan.chunks, D // cfg.block_v)](
        q,
        k,
        v,
        states,
        zs,
        totals,
        o,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        H,
        T,
        plan.chunks,
        plan.group,
        q_scale,
        HEAD_DIM=D,
        BLOCK_V=cfg.block_v,
        CHUNK=cfg.chunk,
        CARRY=plan.groups > 1 and not prefix,
        ROW=_total_row(D, normalize),
        FEATURE=feature_map,
        NORMALIZE=normalize,
        PREFIX=prefix,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl(q),
    )


def _two_pass(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, q_scale: float, config: TwoPassConfig, feature_map: str
) -> None:
    """The forward as pass 1 (states before every chunk, to memory, the chunks walked in groups
    in parallel), the carry across groups, and pass 2 (outputs, every chunk in parallel). The
    states' dtype is ``_state_dtype``'s; the groups' totals and z are fp32."""
    B, H, T, D = q.shape
    plan = two_pass_plan(q.device, B * H, T, D, config)
    states, zs, totals = _two_pass_states(k, v, plan, feature_map)
    _two_pass_out(q, k, v, states, zs, totals, o, q_scale, plan, feature_map)


def _prefix(q: Tensor, k: Tensor, v: Tensor, o: Tensor, q_scale: float, config: PrefixConfig, feature_map: str) -> None:
    """The forward in one launch: pass 2's program per (chunk, value block), each summing its
    own state (and z) from the chunks before it (``PrefixConfig``); the state rounded as the
    two passes store it (``_state_dtype``)."""
    B, H, T, D = q.shape
    chunks = triton.cdiv(T, config.chunk)
    # pass 2's launch in one group of every chunk (no pass 1: its fields are unused)
    plan = TwoPassPlan(
        TwoPassConfig(config.chunk, D, config.block_v, config.num_warps, config.num_stages),
        config.num_stages,
        B * H,
        D,
        chunks,
        chunks,
        1,
    )
    dtype = _state_dtype(k)
    state_kind = k if k.dtype == dtype else torch.empty(1, device=k.device, dtype=dtype)
    _two_pass_out(q, k, v, state_kind, state_kind, state_kind, o, q_scale, plan, feature_map, prefix=True)


ROUTES = ("fused", "two_pass", "prefix")
_routes = Routes("linear_attention", ROUTES)


def set_route(route: str | None) -> None:
    """For every later ``linear_attention`` call of this process without an explicit config and
    without ``return_state``: "two_pass" runs the forward as two passes, "prefix" as the
    one-launch prefix forward, "fused" as the fused kernel; None (the default) lets
    ``configs.forward_route`` pick per shape and feature map for bf16 on a GPU (else the fused
    kernel)."""
    _routes.set(route)


def last_route() -> str | None:
    """The route ("fused", "two_pass" or "prefix") of the latest call without an explicit config."""
    return _routes.last()


def _step_tickets(device: torch.device, heads: int) -> Tensor:
    """The step kernel's per-head tickets (int32 zeros, ``heads`` at least): one buffer per device,
    kept by this function and grown when a larger batch comes; the kernel leaves it zero. It is
    made outside any CUDA graph capture (a buffer born inside one would belong to the graph)."""
    buffers = _step_tickets.__dict__.setdefault("buffers", {})
    key = str(device)
    found = buffers.get(key)
    if found is None or found.numel() < heads:
        if is_cuda(device) and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "linear_attention_step: run one step at this batch size before capturing it in a CUDA graph"
            )
        found = buffers[key] = torch.zeros(max(heads, 64), dtype=torch.int32, device=device)
    return found


def _feature_args(feature_map: str, head_dim: int) -> tuple[bool, float]:
    """(normalize, q scale) of a feature map, as ``reference``."""
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got {feature_map!r}")
    normalize = normalizes(feature_map)
    return normalize, 1.0 if normalize else head_dim**-0.5


def last_tuned_config(device: torch.device, head_dim: int) -> ChunkConfig | None:
    """The chunked kernel's config the autotuner chose at its latest tuning on ``device`` for
    ``head_dim`` (None before the first call); benchmarks report it."""
    best = getattr(_tuned(device, head_dim), "best_config", None)
    if best is None:
        return None
    return ChunkConfig(
        best.kwargs["CHUNK"],
        best.kwargs["BLOCK_V"],
        best.num_warps,
        best.num_stages,
        split=_last_split.get((device, head_dim), 1),
    )


def _launch_config(cfg: ChunkConfig, head_dim: int) -> triton.Config:
    return triton.Config(
        {"CHUNK": cfg.chunk, "BLOCK_V": min(cfg.block_v, head_dim), "SPLIT": cfg.split},
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


_last_split: dict[tuple[torch.device, int], int] = {}  # the split of the latest autotuned launch, for reports


def _split(device: torch.device, batch_heads: int, head_dim: int, T: int) -> int:
    """The sequence split of an autotuned launch: ``configs.split_for`` with CHUNK-token chunks and
    32-wide value blocks (the common tiling), or the interpreter config's split on CPU."""
    if not is_cuda(device):
        return chunk_configs(device, head_dim)[0].split
    return split_for(batch_heads * max(1, head_dim // 32), triton.cdiv(T, CHUNK), sm_count(device))


@cache
def _tuned(device: torch.device, head_dim: int) -> triton.runtime.Autotuner:
    """The chunked kernel autotuned over ``configs.chunk_configs`` (block_v capped at D), cached
    per length, batch·heads, feature map, state output and dtypes."""
    seen = dict.fromkeys(
        (c.chunk, min(c.block_v, head_dim), c.num_warps, c.num_stages) for c in chunk_configs(device, head_dim)
    )
    configs = [
        triton.Config({"CHUNK": chunk, "BLOCK_V": block_v}, num_warps=warps, num_stages=stages)
        for chunk, block_v, warps, stages in seen
    ]
    return autotune(configs, key=["T", "BH", "SPLIT", "FEATURE", "STORE_STATE"])(_chunked_fwd_kernel)


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str,
    return_state: bool = False,
    out: Tensor | None = None,
    config: ChunkConfig | TwoPassConfig | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Causal linear attention of the raw projections, feature map applied in-kernel; one launch.

    q, k, v: ``[B, H, T, D]`` bf16/fp16 (fp32: tf32 on GPU), any strides (read in place when rows
    are 16-byte aligned with unit stride on D, as views of the qkv projection are; else copied);
    D in SUPPORTED_HEAD_DIMS, else ValueError. feature_map: one of FEATURE_MAPS.
    Returns o ``[B, T, H·D]`` in q's dtype; with ``return_state`` also the state after the last
    token, S ``[B, H, D, D]`` and z ``[B, H, D]`` fp32, ready for ``linear_attention_step``.
    out: optional contiguous ``[B, T, H·D]`` buffer of q's dtype to write o into.
    config: run this launch config instead of the autotuned one (tests, benchmark sweeps); a
    ``TwoPassConfig`` runs the identity map's two-pass forward with it.
    """
    check_heads("linear_attention", q, k, v, layout="BHTD")
    normalize, q_scale = _feature_args(feature_map, q.shape[-1])
    B, H, T, D = q.shape
    o = output_buffer("linear_attention", out, (B, T, H * D), q)
    state = torch.zeros(B, H, D, D, device=q.device, dtype=torch.float32) if return_state else o  # o: never written
    z = torch.zeros(B, H, D, device=q.device, dtype=torch.float32) if return_state else o
    if T and B * H:
        q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
        use_torch_allocator()
        if isinstance(config, (TwoPassConfig, PrefixConfig)):
            kind = type(config).__name__
            if return_state:
                raise ValueError(f"a {kind} runs without return_state only (the fused kernel hands the state on)")
            if is_cuda(q.device) and min(config.block_v, D) < min(64, D):
                # 32-column blocks at D ≥ 64 gave wrong outputs (rel. err. 1.2) or an illegal
                # address on the H200 (triton 3.6), with tensor descriptors and with plain loads
                # alike (docs/benchmarks.md), while the interpreter runs
                # them right (test_two_pass_every_config): a GPU-only fault, not yet explained
                raise ValueError(f"a {kind} on a GPU needs block_v ≥ min(64, D), got {config.block_v} at D={D}")
            if isinstance(config, PrefixConfig):
                _prefix(q, k, v, o, q_scale, dataclasses.replace(config, block_v=min(config.block_v, D)), feature_map)
            else:
                _two_pass(q, k, v, o, q_scale, _capped(config, D), feature_map)
            return o
        if config is None and not return_state:
            if _routes.forced is not None:
                route = _routes.forced
            elif q.dtype == torch.bfloat16 and is_cuda(q.device) and not INTERPRETED:
                route = forward_route(torch.cuda.get_device_capability(q.device), B * H, T, D, feature_map)
            else:  # the measured rule is for bf16 on a GPU: the interpreter, fp16 and fp32 stay fused
                route = "fused"
            route = _routes.took(route)
            if route == "two_pass":
                _two_pass(q, k, v, o, q_scale, two_pass_config(q.device, D), feature_map)
                return o
            if route == "prefix":
                _prefix(q, k, v, o, q_scale, prefix_config(q.device, D), feature_map)
                return o
        elif config is None:
            _routes.took("fused")  # the state goes on: only the fused kernel keeps it

        def grid(meta: dict) -> tuple[int]:
            return (B * H * meta["SPLIT"] * (D // meta["BLOCK_V"]),)

        args = (
            q,
            k,
            v,
            o,
            state,
            z,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            H,
            T,
            B * H,
            q_scale,
        )
        meta = dict(HEAD_DIM=D, FEATURE=feature_map, NORMALIZE=normalize, STORE_STATE=return_state, **pdl(q))
        if config is None:
            split = _last_split[(q.device, D)] = _split(q.device, B * H, D, T)
            _tuned(q.device, D)[grid](*args, SPLIT=split, **meta)
        else:
            launch = _launch_config(config, D)
            _chunked_fwd_kernel[grid(launch.kwargs)](
                *args, **launch.kwargs, **meta, num_warps=launch.num_warps, num_stages=launch.num_stages
            )
    return (o, state, z) if return_state else o


def linear_attention_qkv(
    qkv: Tensor,
    heads: int,
    *,
    feature_map: str,
    out: Tensor | None = None,
    config: ChunkConfig | TwoPassConfig | None = None,
) -> Tensor:
    """``linear_attention`` on the fused projection ``qkv [B, T, 3·H·D]``, read in place → ``[B, T, H·D]``."""
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * heads):
        raise ValueError(f"qkv must be [B, T, 3·H·D] with H={heads}, got {tuple(qkv.shape)}")
    B, T, _ = qkv.shape
    q, k, v = qkv.view(B, T, 3, heads, -1).permute(2, 0, 3, 1, 4)  # each [B, H, T, D], strided
    return linear_attention(q, k, v, feature_map=feature_map, out=out, config=config)


def linear_attention_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: Tensor,
    z: Tensor | None,
    *,
    feature_map: str,
    config: StepConfig | None = None,
) -> Tensor:
    """One decoding step: S += φ(k)vᵀ, z += φ(k) in place, then o = φ(q)·S [/ (φ(q)·z + EPS)].

    q, k, v: ``[B, H, D]`` one token (any strides; ``qkv[:, t].view(B, 3, H, D).unbind(1)``
    gives them in place); state: ``[B, H, D, D]`` fp32 contiguous; z: ``[B, H, D]`` fp32
    contiguous, updated whenever given (may be None for the unnormalized identity map).
    config: a fixed launch instead of ``configs.step_config``'s. Returns o ``[B, H·D]`` in q's
    dtype. One launch; the grid splits each head's state columns over programs
    (``configs.step_config``) so that a small batch still fills the GPU.
    """
    check_heads("linear_attention_step", q, k, v, layout="BHD")
    normalize, q_scale = _feature_args(feature_map, q.shape[-1])
    B, H, D = q.shape
    if state.shape != (B, H, D, D) or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(
            f"state must be contiguous fp32 [B, H, D, D] = {[B, H, D, D]}, got {state.dtype} {tuple(state.shape)}"
        )
    if z is None and normalize:
        raise ValueError(f"feature_map {feature_map!r} is normalized: z [B, H, D] is required")
    if z is not None and (z.shape != (B, H, D) or z.dtype != torch.float32 or not z.is_contiguous()):
        raise ValueError(f"z must be contiguous fp32 [B, H, D] = {[B, H, D]}, got {z.dtype} {tuple(z.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = torch.empty(B, H * D, device=q.device, dtype=q.dtype)
    sms = sm_count(q.device) if is_cuda(q.device) else 1
    cfg = config or step_config(q.device, B * H, D, sms)
    if D % cfg.block_v:
        raise ValueError(f"config.block_v {cfg.block_v} must divide the head dim {D}")
    _step_kernel[(B * H, D // cfg.block_v)](
        q,
        k,
        v,
        state,
        z if z is not None else state,
        o,
        _step_tickets(q.device, B * H),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        H,
        q_scale,
        HEAD_DIM=D,
        BLOCK_V=cfg.block_v,
        FEATURE=feature_map,
        NORMALIZE=normalize,
        HAS_Z=z is not None,
        num_warps=cfg.num_warps,
        **pdl(q),
    )
    return o
