"""Decoding over an fp8 KV cache: ``decode_attention`` and ``rope_append`` with the cache stored in
fp8 e4m3 and one fp32 scale per sequence and head for k and one for v.

Storage rule (``nas.models.precision.fp8_per_head``'s): a head's rows are stored as
``fp8(x / scale)`` and read back as that times ``scale``, where ``scale = amax / 448`` over the
rows a prefill wrote (``fp8_cache``), or 1 for a head that is all zeros. The scales are fixed
once written: a token appended later (``rope_append_fp8``) is stored with them, saturated at
±448 (what a static-scale cache does with a value past the prefill's range).

``decode_attention_fp8`` is ``decode.decode_attention``'s split-KV walk on the fp8 rows, converted
as they are loaded to fp16 for a bf16 or fp16 query (exact: every e4m3 value is an fp16 value; q and
the softmax weights scaled into fp16's range, ``_walk_dot_fp8``) or to fp32 for an fp32 one, at its own launch
(``decode_config_fp8``: twice the programs per SM, as each row is half the bytes). The scales
cost nothing per row: k's is folded into the query (q·(s_k·k) = (s_k·q)·k) and v's into each
slice's output (Σ p·s_v·v = s_v·Σ p·v), so the cache bytes read per row halve against bf16 and
nothing else changes (the combine of the slices is ``decode``'s own).

The forward, and every latency measured or calibrated at bf16 or fp32, never runs this file
(``nas.latency`` leaves it out of the kernel fingerprints).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import DTYPES, SUPPORTED_HEAD_DIMS, check_runnable, output_buffer, pdl, sm_count
from kernels._fp8 import FP8_DTYPE, FP8_MAX, to_e4m3
from kernels._pdl import enter
from kernels.attention import configs
from kernels.attention.configs import DecodeConfig, decode_shared_budget, fit_decode_shared
from kernels.attention.decode import (
    _LOG2E,
    _combine,
    _counts,
    _decode_combine_kernel,
    _next_power_of_two,
    _tile,
    _walk,
)
from kernels.device import is_cuda

__all__ = [
    "DECODE_FP8_HOPPER",
    "FP8_DTYPE",
    "FP8_MAX",
    "decode_attention_fp8",
    "decode_config_fp8",
    "fp8_cache",
    "rope_append_fp8",
]

# The launch over an fp8 cache (``configs.decode_config``'s for bf16; kept here, out of the latency
# fingerprints): a row is half a bf16 row's bytes, so a program streams half as many bytes per tile
# and twice the programs per SM keep as many in flight, in 128-row tiles (3 stages of fp8 rows).
# Swept on the H100 at D 64 and 128 only (21 tiles x splits, six shapes from 32K rows; decode_h100.json,
# part attention_fp8_sweep); other head dims keep the bf16 launch until measured.
DECODE_FP8_HOPPER: dict[int, DecodeConfig] = {
    64: DecodeConfig(128, 4, 3, dot=True),
    128: DecodeConfig(128, 4, 3, dot=True),
}
DECODE_FP8_PROGRAMS_PER_SM: dict[int, int] = {d: 2 * configs.DECODE_PROGRAMS_PER_SM[d] for d in DECODE_FP8_HOPPER}


def decode_config_fp8(device: torch.device, batch_heads: int, capacity: int, head_dim: int, sms: int) -> DecodeConfig:
    """``configs.decode_config`` for an fp8 cache: on sm_90 at a measured head dim,
    ``DECODE_FP8_HOPPER``'s tile at twice the programs per SM; elsewhere the bf16 launch."""
    tile = DECODE_FP8_HOPPER.get(head_dim)
    if tile is not None and is_cuda(device) and torch.cuda.get_device_capability(device) == (9, 0):
        splits = configs._decode_splits(batch_heads, capacity, sms, DECODE_FP8_PROGRAMS_PER_SM[head_dim])
        return DecodeConfig(tile.block_n, tile.num_warps, tile.num_stages, splits, tile.dot, tile.fused)
    return configs.decode_config(device, batch_heads, capacity, head_dim, sms)


def fp8_cache(rows: Tensor, capacity: int | None = None) -> tuple[Tensor, Tensor]:
    """A prefill's keys or values ``[B, H, T, D]`` stored as an fp8 cache: ``(cache, scale)`` with
    cache ``[B, H, capacity, D]`` fp8 (rows past T zero) and scale fp32 ``[B, H]`` (the module's
    storage rule, from the amax over each head's T rows). T may be 0 (every scale 1)."""
    if rows.dim() != 4:
        raise ValueError(f"fp8_cache: rows must be [B, H, T, D], got {list(rows.shape)}")
    B, H, T, D = rows.shape
    capacity = T if capacity is None else capacity
    if capacity < max(T, 1):
        raise ValueError(f"fp8_cache: capacity {capacity} holds fewer than the {max(T, 1)} rows needed")
    # no fp32 copy of the whole prefill (at B64 H8 128K D128 one is 34 GB): the amax of the rows'
    # own dtype is exact, and each sequence is scaled and cast on its own
    amax = rows.abs().amax(dim=(2, 3)).float() if T else torch.zeros(B, H, device=rows.device)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    cache = torch.zeros(B, H, capacity, D, device=rows.device, dtype=FP8_DTYPE)
    for b in range(B if T else 0):
        cache[b, :, :T] = (rows[b].float() / scale[b, :, None, None]).to(FP8_DTYPE)
    return cache, scale


@triton.jit
def _rope_append_fp8_kernel(
    QKV,  # [B, 3·H·D], unit stride on the last dim
    KC,
    VC,  # fp8 caches [B, H, C, D], unit stride on D
    KS,
    VS,  # fp32 scales [B, H] contiguous
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
    # Program = one (batch, head): ``decode._rope_append_kernel``, k and v divided by the head's
    # scales and saturated to e4m3's range before they are stored.
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    pos = tl.minimum(tl.load(POS + b), C - 1).to(tl.int64)  # clamped: never write past the cache
    HALF: tl.constexpr = HEAD_DIM // 2
    lo = tl.arange(0, HALF)
    src = QKV + b * stride_qkv + h * HEAD_DIM
    q1 = tl.load(src + lo).to(tl.float32)
    q2 = tl.load(src + HALF + lo).to(tl.float32)
    k1 = tl.load(src + H * HEAD_DIM + lo).to(tl.float32)
    k2 = tl.load(src + H * HEAD_DIM + HALF + lo).to(tl.float32)
    v1 = tl.load(src + 2 * H * HEAD_DIM + lo).to(tl.float32)
    v2 = tl.load(src + 2 * H * HEAD_DIM + HALF + lo).to(tl.float32)
    if ROPE:
        c = tl.load(COS + pos * stride_cs + lo).to(tl.float32)
        s = tl.load(SIN + pos * stride_cs + lo).to(tl.float32)
        q1, q2 = q1 * c - q2 * s, q2 * c + q1 * s
        k1, k2 = k1 * c - k2 * s, k2 * c + k1 * s
    k_inv = 1.0 / tl.load(KS + bh)
    v_inv = 1.0 / tl.load(VS + bh)
    k_row = KC + b * stride_kb + h * stride_kh + pos * stride_kc
    v_row = VC + b * stride_vb + h * stride_vh + pos * stride_vc
    tl.store(k_row + lo, to_e4m3(k1 * k_inv, KC.dtype.element_ty))
    tl.store(k_row + HALF + lo, to_e4m3(k2 * k_inv, KC.dtype.element_ty))
    tl.store(v_row + lo, to_e4m3(v1 * v_inv, VC.dtype.element_ty))
    tl.store(v_row + HALF + lo, to_e4m3(v2 * v_inv, VC.dtype.element_ty))
    q_out = QO + bh.to(tl.int64) * HEAD_DIM
    tl.store(q_out + lo, q1.to(QO.dtype.element_ty))
    tl.store(q_out + HALF + lo, q2.to(QO.dtype.element_ty))


@triton.jit
def _walk_dot_fp8(
    q,
    k_head,
    v_head,
    stride_kc,
    stride_vc,
    start,
    end,
    DTYPE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    F16: tl.constexpr,
):
    """``decode._walk_dot`` over fp8 rows, each tile converted as it is loaded: to fp16 for a
    16-bit query (F16: one instruction per pair of values on sm_89+, exact, where the conversion
    to bf16 takes several and held the walk under the bandwidth: benchmarks/results/decode_h100.json,
    part attention_fp8_sweep), with q divided by its largest magnitude so that it lies in fp16's
    range whatever it holds, and the scores multiplied back; to ``DTYPE`` (the query's, fp32)
    otherwise. Under F16 the weights p are taken 2^15 times as large (15 added to each exponent
    in base 2) before their fp16 cast, so that a weight down to 2^-39 of the largest, not 2^-24,
    still counts in p·v, as it does in l: acc and l carry the same factor, which their ratio and
    the slices' log-sum-exps (all shifted alike) cancel."""
    if F16:
        q_max = tl.maximum(tl.max(tl.abs(q), 0), 1e-30)
        qm = tl.broadcast_to((q / q_max)[None, :], (16, HEAD_DIM)).to(tl.float16)
        shift = 15.0
    else:
        qm = tl.broadcast_to(q[None, :], (16, HEAD_DIM)).to(DTYPE)
        shift = 0.0
    m_i = tl.full((16,), float("-inf"), tl.float32)
    l_i = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, HEAD_DIM), tl.float32)
    for row0 in range(start, end, BLOCK_N):
        rows = row0 + tl.arange(0, BLOCK_N)
        valid = rows < end
        k = _tile(k_head, rows, stride_kc, valid, HEAD_DIM).to(qm.dtype)
        v = _tile(v_head, rows, stride_vc, valid, HEAD_DIM).to(qm.dtype)
        scores = tl.dot(qm, tl.trans(k), input_precision=PRECISION)  # [16, BLOCK_N]
        if F16:
            scores = scores * q_max
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2((scores - m_new[:, None]) + shift)  # at most 2^shift: the difference first, exact
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(qm.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return tl.max(acc, 0), tl.max(l_i, 0), tl.max(m_i, 0)


@triton.jit
def _decode_fp8_split_kernel(
    Q,  # [B, H, D] contiguous
    KC,
    VC,  # fp8 caches [B, H, C, D], unit stride on D
    KS,
    VS,  # fp32 scales [B, H] contiguous
    POS,  # int32 [B]
    O_PART,  # fp32 [B·H, splits, D]
    LSE,  # fp32 [B·H, splits]
    OUT,  # [B, H·D]
    COUNT,  # int32 [B·H], zero between launches (FUSED)
    stride_kb,
    stride_kh,
    stride_kc,
    stride_vb,
    stride_vh,
    stride_vc,
    H,
    C,
    split_rows,
    splits,
    qk_scale,  # scale·log2(e)
    DIRECT: tl.constexpr,
    FUSED: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    BLOCK_S: tl.constexpr,
    F16: tl.constexpr,  # a 16-bit query: the products in fp16 (``_walk_dot_fp8``)
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program (head, slice): ``decode._decode_split_kernel`` reading rows·D bytes of k and of v
    # (half a bf16 cache's), with k's scale in q and v's applied to the slice's output.
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    n = tl.minimum(tl.load(POS + b) + 1, C)
    start = split * split_rows
    if start >= n:
        return
    end = tl.minimum(start + split_rows, n)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh.to(tl.int64) * HEAD_DIM + d).to(tl.float32) * (qk_scale * tl.load(KS + bh))
    k_head = KC + b * stride_kb + h * stride_kh
    v_head = VC + b * stride_vb + h * stride_vh
    if DOT:
        acc, l_i, m_i = _walk_dot_fp8(
            q,
            k_head,
            v_head,
            stride_kc,
            stride_vc,
            start,
            end,
            Q.dtype.element_ty,
            HEAD_DIM,
            BLOCK_N,
            PRECISION,
            F16,
        )
    else:
        acc, l_i, m_i = _walk(q, k_head, v_head, stride_kc, stride_vc, start, end, HEAD_DIM, BLOCK_N)
    acc = acc * tl.load(VS + bh)
    if DIRECT:
        tl.store(OUT + bh.to(tl.int64) * HEAD_DIM + d, (acc / l_i).to(OUT.dtype.element_ty))
    else:
        part = bh.to(tl.int64) * splits + split
        tl.store(O_PART + part * HEAD_DIM + d, acc / l_i)
        tl.store(LSE + part, m_i + tl.log2(l_i))
        if FUSED:
            # as in decode._decode_split_kernel: the last slice of a head combines, in slice order
            filled = tl.cdiv(n, split_rows)
            done = tl.atomic_add(COUNT + bh, 1, sem="acq_rel")
            if done == filled - 1:
                _combine(O_PART, LSE, OUT, bh, filled, splits, SPLITS_P2, BLOCK_S, HEAD_DIM)
                tl.atomic_xchg(COUNT + bh, 0, sem="relaxed")


def _check_fp8_inputs(
    op: str, q: Tensor, caches: tuple[Tensor, Tensor], scales: tuple[Tensor, Tensor], positions: Tensor, heads: tuple
) -> None:
    """ValueError naming the offending argument unless the caches are fp8 ``[B, H, C, D]`` with
    unit stride on D, the scales fp32 ``[B, H]`` contiguous, positions int32 ``[B]``, all on
    q's device (q: a float dtype of ``DTYPES``, D in SUPPORTED_HEAD_DIMS)."""
    B, H, D = heads
    check_runnable(op, q)
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{op}: head dim D={D} is not supported; allowed: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    if q.dtype not in DTYPES:
        raise ValueError(f"{op}: dtype must be one of {DTYPES}, got {q.dtype}")
    for name, cache in zip(("k_cache", "v_cache"), caches, strict=True):
        if cache.dim() != 4 or tuple(cache.shape[:2]) != (B, H) or cache.shape[3] != D or cache.shape[2] < 1:
            raise ValueError(f"{op}: {name} must be [B, H, C, D] = [{B}, {H}, C >= 1, {D}], got {list(cache.shape)}")
        if cache.dtype != FP8_DTYPE:
            raise ValueError(f"{op}: {name}.dtype must be {FP8_DTYPE}, got {cache.dtype}")
        if cache.stride(3) != 1:
            raise ValueError(f"{op}: {name} needs unit stride on D, got strides {cache.stride()}")
    if caches[0].shape != caches[1].shape:
        raise ValueError(f"{op}: k_cache and v_cache must share one shape, got {[list(c.shape) for c in caches]}")
    for name, s in zip(("k_scale", "v_scale"), scales, strict=True):
        if s.dtype != torch.float32 or tuple(s.shape) != (B, H) or not s.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous fp32 [B, H] = [{B}, {H}], got {s.dtype} {list(s.shape)}")
    if positions.dtype != torch.int32 or tuple(positions.shape) != (B,):
        raise ValueError(f"{op}: positions must be int32 [B] = [{B}], got {positions.dtype} {list(positions.shape)}")
    named = zip(("k_cache", "v_cache", "k_scale", "v_scale", "positions"), (*caches, *scales, positions), strict=True)
    for name, t in named:
        if t.device != q.device:
            raise ValueError(f"{op}: {name} is on {t.device}, the query on {q.device}")


def rope_append_fp8(
    qkv: Tensor,
    heads: int,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor,
    v_scale: Tensor,
    positions: Tensor,
    rope: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """``decode.rope_append`` into fp8 caches: k and v stored as ``fp8(clamp(x / scale, ±448))``
    with the head's fixed scales (``k_scale``, ``v_scale``: fp32 ``[B, H]``, from ``fp8_cache``).
    Returns rotated q ``[B, H, D]`` in qkv's dtype; one launch."""
    if qkv.dim() != 2 or heads < 1 or qkv.shape[1] % (3 * heads):
        raise ValueError(f"rope_append_fp8: qkv must be [B, 3·H·D] with H={heads}, got {list(qkv.shape)}")
    B, D = qkv.shape[0], qkv.shape[1] // (3 * heads)
    _check_fp8_inputs("rope_append_fp8", qkv, (k_cache, v_cache), (k_scale, v_scale), positions, (B, heads, D))
    if qkv.stride(1) != 1:
        raise ValueError(f"rope_append_fp8: qkv needs unit stride on its last dim, got strides {qkv.stride()}")
    C = k_cache.shape[2]
    if rope is not None:
        for name, table in zip(("cos", "sin"), rope, strict=True):
            if table.dim() != 2 or table.shape[0] < C or table.shape[1] != D // 2 or table.device != qkv.device:
                raise ValueError(
                    f"rope_append_fp8: rope {name} must be [>= C, D/2] = [>= {C}, {D // 2}] on {qkv.device}, "
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
    _rope_append_fp8_kernel[(B * heads,)](
        qkv,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
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


def decode_attention_fp8(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor,
    v_scale: Tensor,
    positions: Tensor,
    *,
    scale: float | None = None,
    out: Tensor | None = None,
    config: DecodeConfig | None = None,
) -> Tensor:
    """``decode.decode_attention`` over fp8 caches ``[B, H, C, D]`` whose rows read back as
    ``row · scale`` (``k_scale``, ``v_scale``: fp32 ``[B, H]``). q: ``[B, H, D]`` bf16/fp16/fp32;
    the products run in fp16 for a 16-bit q (``_walk_dot_fp8``), in fp32 for fp32. Returns
    ``[B, H·D]`` in q's dtype; one launch (two with ``config.fused`` False and several splits);
    capturable in a CUDA graph."""
    if q.dim() != 3:
        raise ValueError(f"decode_attention_fp8: q must be [B, H, D], got {list(q.shape)}")
    B, H, D = q.shape
    _check_fp8_inputs("decode_attention_fp8", q, (k_cache, v_cache), (k_scale, v_scale), positions, (B, H, D))
    o = output_buffer("decode_attention_fp8", out, (B, H * D), q)
    if B * H == 0:
        return o
    C = k_cache.shape[2]
    if config is None:
        sms = sm_count(q.device) if is_cuda(q.device) else 1
        # fitted to shared memory at q's element size: the rows may be staged there converted
        chosen = decode_config_fp8(q.device, B * H, C, D, sms)
        config = fit_decode_shared(chosen, D, q.element_size(), decode_shared_budget(q.device))
    split_rows = triton.cdiv(triton.cdiv(C, config.splits), config.block_n) * config.block_n
    splits = triton.cdiv(C, split_rows)
    q = q.contiguous()
    o_part = torch.empty(B * H, splits, D, device=q.device, dtype=torch.float32) if splits > 1 else o
    lse = torch.empty(B * H, splits, device=q.device, dtype=torch.float32) if splits > 1 else o
    qk_scale = (D**-0.5 if scale is None else scale) * _LOG2E
    fused = splits > 1 and config.fused
    splits_p2 = _next_power_of_two(splits)
    block_s = min(splits_p2, max(1, 4096 // D))
    _decode_fp8_split_kernel[(B * H, splits)](
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
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
        F16=q.dtype != torch.float32,
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
