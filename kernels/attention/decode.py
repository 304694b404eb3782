"""Decoding with softmax attention over a KV cache: one new token per sequence.

Two wrappers, three kernels:

``rope_append`` (one launch, grid B·H): reads the token's fused projection ``qkv [B, 3·H·D]``,
rotates q and k at the token's position (RoPE, Su et al. 2021, the half-split pairs (i, i + D/2)
of ``nas.models.mixers.apply_rope``), writes k and v into that row of the caches and returns q.
Moves 3·D elements in, 3·D out per head, plus D cos/sin values: launch-bound, one small program
per head.

``decode_attention`` (split-KV "flash-decoding", Dao et al. 2023): a single query row cannot fill
a GPU with one program per (batch, head) (B1 H8: 8 programs on 132 SMs), so the cache capacity
is cut into ``splits`` slices and the grid is B·H × splits. Each program streams its slice of
k and v in ``[BLOCK_N, D]`` tiles with an online softmax (scores in base 2, log2(e)·scale folded
into q), and writes its partial output normalised by its own sum, o_s ``[D]``, with its
log-sum-exp lse_s (base 2), in fp32, then counts itself done on a per-head atomic counter; the
last slice of a head to finish combines the slices, in slice order (so the result does not depend
on the order of arrival): o = Σ_s 2^(lse_s − max lse)·o_s / Σ_s 2^(lse_s − max lse), and resets
the counter. One launch: in a CUDA graph a second kernel costs about as much as a B1 slice's work
(``DecodeConfig.fused = False`` keeps the separate combine launch, grid B·H, for comparison).
With one split the kernel writes the output itself and nothing is combined.

Positions are read on the device (``positions [B]`` int32: the index of the newest row of each
sequence), so a CUDA graph captured once is replayed after ``positions += 1``. The split count is
fixed by the capacity (``configs.decode_config``); a program whose slice starts past its
sequence's position returns at once, and the combine reads only the slices that hold rows. Rows
past the position are never loaded (masked): a cache may hold anything there, NaN included.

Cost per (batch, head) at n = position + 1 rows: reads 2·n·D cache elements (the floor: the
kernel is memory-bound at 1 FLOP per byte in bf16: 2·D FLOPs for the score, 2·D for p·v), plus
splits·(D + 1) fp32 partials written and read back by the combine, D outputs written.
The split count and tile are chosen from the capacity (``configs.decode_config``: one or two
programs per SM by head dim, slices of at least 128 rows, a wider tile at D = 128 for slices from
1024 rows; an fp32 cache takes tiles of half the rows, ``configs.fit_decode_shared``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import DTYPES, SUPPORTED_HEAD_DIMS, check_runnable, output_buffer, pdl, sm_count
from kernels._pdl import enter
from kernels.attention.configs import DecodeConfig, decode_config, decode_shared_budget, fit_decode_shared
from kernels.device import is_cuda

__all__ = ["decode_attention", "rope_append"]

_LOG2E = 1.4426950408889634


@triton.jit
def _rope_append_kernel(
    QKV,  # [B, 3·H·D], unit stride on the last dim
    KC,
    VC,  # caches [B, H, C, D], unit stride on D
    POS,  # int32 [B]
    COS,
    SIN,  # [>= C, D/2], unit stride on the last dim
    QO,  # [B, H, D] contiguous
    stride_qkv,
    stride_kb,
    stride_kh,
    stride_kc,
    stride_vb,
    stride_vh,
    stride_vc,
    stride_cs,
    H,
    C,
    HEAD_DIM: tl.constexpr,
    ROPE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program = one (batch, head): reads q, k, v (3·D elements) and one cos/sin row (D), writes
    # one cache row of k and of v and q (3·D elements).
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    pos = tl.minimum(tl.load(POS + b), C - 1).to(tl.int64)  # clamped: never write past the cache
    HALF: tl.constexpr = HEAD_DIM // 2
    lo = tl.arange(0, HALF)
    src = QKV + b * stride_qkv + h * HEAD_DIM
    q1 = tl.load(src + lo).to(tl.float32)  # q = [q1 | q2], halves of D/2
    q2 = tl.load(src + HALF + lo).to(tl.float32)
    k1 = tl.load(src + H * HEAD_DIM + lo).to(tl.float32)
    k2 = tl.load(src + H * HEAD_DIM + HALF + lo).to(tl.float32)
    v1 = tl.load(src + 2 * H * HEAD_DIM + lo)
    v2 = tl.load(src + 2 * H * HEAD_DIM + HALF + lo)
    if ROPE:
        c = tl.load(COS + pos * stride_cs + lo).to(tl.float32)
        s = tl.load(SIN + pos * stride_cs + lo).to(tl.float32)
        q1, q2 = q1 * c - q2 * s, q2 * c + q1 * s
        k1, k2 = k1 * c - k2 * s, k2 * c + k1 * s
    k_row = KC + b * stride_kb + h * stride_kh + pos * stride_kc
    v_row = VC + b * stride_vb + h * stride_vh + pos * stride_vc
    tl.store(k_row + lo, k1.to(KC.dtype.element_ty))
    tl.store(k_row + HALF + lo, k2.to(KC.dtype.element_ty))
    tl.store(v_row + lo, v1)
    tl.store(v_row + HALF + lo, v2)
    q_out = QO + bh.to(tl.int64) * HEAD_DIM
    tl.store(q_out + lo, q1.to(QO.dtype.element_ty))
    tl.store(q_out + HALF + lo, q2.to(QO.dtype.element_ty))


@triton.jit
def _tile(head, rows, stride_c, valid, HEAD_DIM: tl.constexpr):
    """Cache rows ``rows`` of one head, ``[BLOCK_N, D]``; rows not ``valid`` are never loaded (0)."""
    d = tl.arange(0, HEAD_DIM)
    return tl.load(head + rows.to(tl.int64)[:, None] * stride_c + d[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def _walk(q, k_head, v_head, stride_kc, stride_vc, start, end, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax of ``q [D]`` (fp32, ·scale·log2(e)) over cache rows [start, end) on the CUDA
    cores: per block a row-wise dot (scores) and a column sum (p·v). Returns (acc [D], l, m)."""
    m_i = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), 0)  # scalar -inf
    l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), 0)
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    for row0 in range(start, end, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        valid = rows < end
        k = _tile(k_head, rows, stride_kc, valid, HEAD_DIM)
        v = _tile(v_head, rows, stride_vc, valid, HEAD_DIM)
        scores = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))  # [BLOCK_N], base 2
        m_new = tl.maximum(m_i, tl.max(scores, 0))  # finite: every block holds a valid row
        p = tl.exp2(scores - m_new)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _walk_dot(
    q,
    k_head,
    v_head,
    stride_kc,
    stride_vc,
    start,
    end,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``_walk`` with both products as matmuls: q replicated into 16 identical rows (the smallest
    tl.dot), scores ``[16, BLOCK_N]`` = q·kᵀ and acc ``[16, D]`` += p·v on the tensor cores. 16×
    the FLOPs of one row, still ~16 FLOP/byte, far under the ridge; in exchange the cache loads
    feed tl.dot, which Triton software-pipelines num_stages deep (async copies into shared
    memory), so the next blocks stream while this one is reduced. The rows stay identical, so
    their max is the one row's result, exactly. fp32 caches use exact fp32 products ("ieee")."""
    dtype = k_head.dtype.element_ty
    qm = tl.broadcast_to(q[None, :], (16, HEAD_DIM)).to(dtype)
    m_i = tl.full((16,), float("-inf"), tl.float32)
    l_i = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, HEAD_DIM), tl.float32)
    for row0 in range(start, end, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        valid = rows < end
        k = _tile(k_head, rows, stride_kc, valid, HEAD_DIM)
        v = _tile(v_head, rows, stride_vc, valid, HEAD_DIM)
        scores = tl.dot(qm, tl.trans(k), input_precision=PRECISION)  # [16, BLOCK_N]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return tl.max(acc, 0), tl.max(l_i, 0), tl.max(m_i, 0)


@triton.jit
def _combine(
    O_PART, LSE, OUT, bh, filled, splits, SPLITS_P2: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr
):
    """Head ``bh``'s output from its first ``filled`` slices' partials, in slice order (the same
    sums whichever program runs it). The partials are read through L2 (``.cg``): another SM wrote
    them in this launch when the combine is fused."""
    base = bh.to(tl.int64) * splits
    s_all = tl.arange(0, SPLITS_P2)
    lse = tl.load(LSE + base + s_all, mask=s_all < filled, other=float("-inf"), cache_modifier=".cg")
    m = tl.max(lse, 0)  # finite: slice 0 always holds row 0
    denom = tl.sum(tl.exp2(lse - m), 0)
    d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    for s0 in range(0, filled, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = s < filled
        w = tl.exp2(tl.load(LSE + base + s, mask=ok, other=float("-inf"), cache_modifier=".cg") - m)  # 0 when empty
        o = tl.load(
            O_PART + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg"
        )
        acc += tl.sum(w[:, None] * o, 0)
    tl.store(OUT + bh.to(tl.int64) * HEAD_DIM + d, (acc / denom).to(OUT.dtype.element_ty))


@triton.jit
def _decode_split_kernel(
    Q,  # [B, H, D] contiguous
    KC,
    VC,  # caches [B, H, C, D], unit stride on D
    POS,  # int32 [B]
    O_PART,  # fp32 [B·H, splits, D]: each slice's output, normalised by its own sum
    LSE,  # fp32 [B·H, splits]: each slice's log2-sum-exp2 of its scores
    OUT,  # [B, H·D]: written here directly when DIRECT, or by the last slice when FUSED
    COUNT,  # int32 [B·H], zero between launches: slices of each head done (FUSED)
    stride_kb,
    stride_kh,
    stride_kc,
    stride_vb,
    stride_vh,
    stride_vc,
    H,
    C,
    split_rows,  # rows per slice, a multiple of BLOCK_N
    splits,
    qk_scale,  # scale·log2(e)
    DIRECT: tl.constexpr,  # one slice: normalise and write OUT here, no partials
    FUSED: tl.constexpr,  # the last slice of a head to finish combines the partials (one launch)
    DOT: tl.constexpr,  # the products as 16-row matmuls (``_walk_dot``)
    PRECISION: tl.constexpr,  # their input precision: "ieee" for fp32 caches, else None (the default)
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS_P2: tl.constexpr,  # splits rounded up to a power of two (FUSED)
    BLOCK_S: tl.constexpr,  # slices per step of the combine's weighted sum (FUSED)
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program (head, slice): reads 2·rows·D cache elements, does 4·rows·D FLOPs, writes D + 1
    # fp32 partials (or D outputs when unsplit); when FUSED the last one also reads the head's
    # partials back and writes D outputs.
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    n = tl.minimum(tl.load(POS + b) + 1, C)  # rows 0..position inclusive
    start = split * split_rows
    if start >= n:  # a slice past this sequence's newest row: the combine skips it
        return
    end = tl.minimum(start + split_rows, n)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh.to(tl.int64) * HEAD_DIM + d).to(tl.float32) * qk_scale  # [D]
    k_head = KC + b * stride_kb + h * stride_kh
    v_head = VC + b * stride_vb + h * stride_vh
    if DOT:
        acc, l_i, m_i = _walk_dot(q, k_head, v_head, stride_kc, stride_vc, start, end, HEAD_DIM, BLOCK_N, PRECISION)
    else:
        acc, l_i, m_i = _walk(q, k_head, v_head, stride_kc, stride_vc, start, end, HEAD_DIM, BLOCK_N)
    if DIRECT:
        tl.store(OUT + bh.to(tl.int64) * HEAD_DIM + d, (acc / l_i).to(OUT.dtype.element_ty))
    else:
        part = bh.to(tl.int64) * splits + split
        tl.store(O_PART + part * HEAD_DIM + d, acc / l_i)
        tl.store(LSE + part, m_i + tl.log2(l_i))
        if FUSED:
            # Release: this slice's partials are visible before its count; acquire: the last one
            # sees every other slice's. It then resets the count for the next launch (a replayed
            # graph included); the order of arrival does not change the sums (slice order).
            filled = tl.cdiv(n, split_rows)
            done = tl.atomic_add(COUNT + bh, 1, sem="acq_rel")
            if done == filled - 1:
                _combine(O_PART, LSE, OUT, bh, filled, splits, SPLITS_P2, BLOCK_S, HEAD_DIM)
                tl.atomic_xchg(COUNT + bh, 0, sem="relaxed")


@triton.jit
def _decode_combine_kernel(
    O_PART,  # fp32 [B·H, splits, D]
    LSE,  # fp32 [B·H, splits]
    POS,  # int32 [B]
    OUT,  # [B, H·D]
    H,
    C,
    split_rows,
    splits,
    SPLITS_P2: tl.constexpr,  # splits rounded up to a power of two
    BLOCK_S: tl.constexpr,  # slices per step of the weighted sum
    HEAD_DIM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program = one head: reads its filled slices' (D + 1) fp32 partials, writes D outputs.
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    n = tl.minimum(tl.load(POS + b) + 1, C)
    filled = tl.cdiv(n, split_rows)  # slices holding rows; the rest wrote nothing
    _combine(O_PART, LSE, OUT, bh, filled, splits, SPLITS_P2, BLOCK_S, HEAD_DIM)


_COUNTS: dict[torch.device, Tensor] = {}


def _counts(device: torch.device, heads: int) -> Tensor:
    """A zeroed int32 ``[>= heads]`` buffer of per-head slice counts on ``device``, kept between
    calls: each fused launch leaves it zeroed again, so no memset is launched (nor captured).
    Allocated outside a CUDA-graph capture when a call precedes it (a capture after a warm-up call,
    as the decoder and the benchmarks do); launches on one device share it, so they must be
    ordered (one stream), as a decode step's layers are."""
    buf = _COUNTS.get(device)
    if buf is None or buf.numel() < heads:
        buf = torch.zeros(max(heads, 1024), device=device, dtype=torch.int32)
        _COUNTS[device] = buf
    return buf


def _check_cache(op: str, name: str, cache: Tensor, B: int, H: int, D: int, dtype: torch.dtype) -> None:
    if cache.dim() != 4 or tuple(cache.shape[:2]) != (B, H) or cache.shape[3] != D or cache.shape[2] < 1:
        raise ValueError(f"{op}: {name} must be [B, H, C, D] = [{B}, {H}, C >= 1, {D}], got {list(cache.shape)}")
    if cache.dtype != dtype:
        raise ValueError(f"{op}: {name}.dtype must be {dtype} (as the query's), got {cache.dtype}")
    if cache.stride(3) != 1:
        raise ValueError(f"{op}: {name} needs unit stride on D, got strides {cache.stride()}")


def _check_decode_inputs(
    op: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, positions: Tensor, heads: tuple[int, int, int]
) -> None:
    """ValueError naming the offending argument unless q (its dtype) and the caches match
    ``heads`` = (B, H, D) with D in SUPPORTED_HEAD_DIMS, and positions is int32 ``[B]``, all on
    one device where the kernels run."""
    B, H, D = heads
    check_runnable(op, q)
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{op}: head dim D={D} is not supported; allowed: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    if q.dtype not in DTYPES:
        raise ValueError(f"{op}: dtype must be one of {DTYPES}, got {q.dtype}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_cache(op, name, cache, B, H, D, q.dtype)
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{op}: k_cache and v_cache must share one shape, got {list(k_cache.shape)}, {list(v_cache.shape)}"
        )
    if positions.dtype != torch.int32 or tuple(positions.shape) != (B,):
        raise ValueError(f"{op}: positions must be int32 [B] = [{B}], got {positions.dtype} {list(positions.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("positions", positions)):
        if t.device != q.device:
            raise ValueError(f"{op}: {name} is on {t.device}, the query on {q.device}")


def rope_append(
    qkv: Tensor,
    heads: int,
    k_cache: Tensor,
    v_cache: Tensor,
    positions: Tensor,
    rope: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """One new token: rotate its q and k, write k and v into the caches at its position; one launch.

    qkv: ``[B, 3·H·D]`` (q, k, v blocks of H·D channels, head-major, as ``nn.Linear(d, 3d)``
    emits; unit stride on the last dim). heads: H. k_cache, v_cache: ``[B, H, C, D]`` of qkv's
    dtype, unit stride on D, written in place at row ``positions[b]`` only. positions: int32
    ``[B]`` on the device (read there: a replayed CUDA graph sees its updates). rope: ``(cos,
    sin)`` each ``[>= C, D/2]`` (any float dtype, unit stride on the last dim), or None for no
    rotation. Returns rotated q ``[B, H, D]`` contiguous in qkv's dtype.
    """
    if qkv.dim() != 2 or heads < 1 or qkv.shape[1] % (3 * heads):
        raise ValueError(f"rope_append: qkv must be [B, 3·H·D] with H={heads}, got {list(qkv.shape)}")
    B, D = qkv.shape[0], qkv.shape[1] // (3 * heads)
    _check_decode_inputs("rope_append", qkv, k_cache, v_cache, positions, (B, heads, D))
    if qkv.stride(1) != 1:
        raise ValueError(f"rope_append: qkv needs unit stride on its last dim, got strides {qkv.stride()}")
    C = k_cache.shape[2]
    if rope is not None:
        for name, table in zip(("cos", "sin"), rope, strict=True):
            if table.dim() != 2 or table.shape[0] < C or table.shape[1] != D // 2 or table.device != qkv.device:
                raise ValueError(
                    f"rope_append: rope {name} must be [>= C, D/2] = [>= {C}, {D // 2}] on {qkv.device}, "
                    f"got {list(table.shape)} on {table.device}"
                )
        cos, sin = rope
        if cos.stride(1) != 1 or sin.stride(1) != 1 or cos.stride(0) != sin.stride(0):
            cos, sin = cos.contiguous(), sin.contiguous()
    else:
        cos = sin = qkv  # never read without ROPE
    q_out = torch.empty(B, heads, D, device=qkv.device, dtype=qkv.dtype)
    if B == 0:
        return q_out
    _rope_append_kernel[(B * heads,)](
        qkv,
        k_cache,
        v_cache,
        positions,
        cos,
        sin,
        q_out,
        qkv.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        cos.stride(0),
        heads,
        C,
        HEAD_DIM=D,
        ROPE=rope is not None,
        num_warps=1,
        **pdl(qkv),
    )
    return q_out


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    positions: Tensor,
    *,
    scale: float | None = None,
    out: Tensor | None = None,
    config: DecodeConfig | None = None,
) -> Tensor:
    """Softmax attention of one query token per sequence over its cache rows 0..positions[b].

    q: ``[B, H, D]`` bf16/fp16/fp32 (made contiguous), D in SUPPORTED_HEAD_DIMS. k_cache,
    v_cache: ``[B, H, C, D]`` of q's dtype, unit stride on D; rows past positions[b] are never
    read. positions: int32 ``[B]`` on the device, each < C (read there; clamped to C − 1).
    scale: defaults to D^-1/2. out: optional contiguous ``[B, H·D]`` buffer of q's dtype.
    config: this launch instead of ``configs.decode_config``'s (tests, benchmark sweeps).
    Returns ``[B, H·D]`` in q's dtype. One launch (two with ``config.fused`` False and several
    splits); no host sync and no allocation that depends on device values, so it can be captured
    in a CUDA graph. Calls on one device share a counter buffer: keep them on one stream.
    """
    if q.dim() != 3:
        raise ValueError(f"decode_attention: q must be [B, H, D], got {list(q.shape)}")
    B, H, D = q.shape
    _check_decode_inputs("decode_attention", q, k_cache, v_cache, positions, (B, H, D))
    o = output_buffer("decode_attention", out, (B, H * D), q)
    if B * H == 0:
        return o
    C = k_cache.shape[2]
    if config is None:
        sms = sm_count(q.device) if is_cuda(q.device) else 1
        chosen = decode_config(q.device, B * H, C, D, sms)
        config = fit_decode_shared(chosen, D, q.element_size(), decode_shared_budget(q.device))
    split_rows = triton.cdiv(triton.cdiv(C, config.splits), config.block_n) * config.block_n
    splits = triton.cdiv(C, split_rows)  # no slice lies wholly past the capacity
    q = q.contiguous()
    # Partials: (D + 1) fp32 per slice. Scratch whose size depends on C and the config only.
    o_part = torch.empty(B * H, splits, D, device=q.device, dtype=torch.float32) if splits > 1 else o
    lse = torch.empty(B * H, splits, device=q.device, dtype=torch.float32) if splits > 1 else o
    qk_scale = (D**-0.5 if scale is None else scale) * _LOG2E
    fused = splits > 1 and config.fused
    splits_p2 = _next_power_of_two(splits)
    block_s = min(splits_p2, max(1, 4096 // D))
    _decode_split_kernel[(B * H, splits)](
        q,
        k_cache,
        v_cache,
        positions,
        o_part,
        lse,
        o,
        _counts(q.device, B * H) if fused else positions,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        H,
        C,
        split_rows,
        splits,
        qk_scale,
        DIRECT=splits == 1,
        FUSED=fused,
        DOT=config.dot,
        PRECISION="ieee" if q.dtype == torch.float32 else None,
        HEAD_DIM=D,
        BLOCK_N=config.block_n,
        SPLITS_P2=splits_p2,
        BLOCK_S=block_s,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **pdl(q),
    )
    if splits > 1 and not fused:
        _decode_combine_kernel[(B * H,)](
            o_part,
            lse,
            positions,
            o,
            H,
            C,
            split_rows,
            splits,
            SPLITS_P2=splits_p2,
            BLOCK_S=block_s,
            HEAD_DIM=D,
            num_warps=4,
            **pdl(o_part),
        )
    return o
