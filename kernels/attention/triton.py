"""Flash-attention forward (Dao et al. 2022, online softmax) as one Triton launch, with optional
fused rotary embedding on q and k.

Layout. The kernel takes q, k, v as ``[B, H, T, D]`` *with any strides*, so the strided views
of the fused qkv projection — ``qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)``, exactly what
the torch model's ``_split`` makes — are read in place: no transpose copy, and each row of D
elements is still one contiguous 2·D-byte run. It writes ``[B, T, H·D]`` contiguous, the layout
the output projection consumes, so the model's ``transpose(1, 2).reshape`` copy is gone too.
``flash_attention_qkv`` takes the projection ``[B, T, 3·H·D]`` itself. (A ``[B, T, H, D]``-only
API would force the same views; a ``[B, H, T, D]``-contiguous one would force a copy.)

Loads. Each program builds tensor descriptors over its head's ``[T, D]`` rows (``kernels/_common.py``):
a tile is one bulk copy into shared memory, software-pipelined ``num_stages`` deep, with no
per-element addresses held in registers and zeros for rows past T.

Algorithm. One program per (batch·head, query block of BLOCK_M rows). Scores are kept in base 2:
log2(e)·scale is folded into q once, so each score needs one ``exp2`` and no multiply. The causal
case walks two ranges: key blocks wholly below the diagonal (no mask at all) and the BLOCK_M /
BLOCK_N blocks on it (causal mask). The non-causal case walks the full key blocks unmasked and
one masked tail block. Query blocks run heaviest-first (causal work grows with the block index)
so the last wave of the grid holds the cheap ones.

RoPE (Su et al. 2021, half-split layout of ``nas.models.mixers.apply_rope``): channel d < D/2
pairs with d + D/2. A tile is read as its two halves, rotated in fp32 with the cos/sin rows of
its positions, and interleaved back into ``[N, D]`` (join + permute + reshape), so one matmul
of depth D follows whatever D is. K is rotated per (query block, key block): the price of
needing no separate rotation launch, which is why RoPE shapes take the SDPA route on sm_90.

Route. Where torch's ``F.scaled_dot_product_attention`` (its default backend: cuDNN's flash
kernel on an H200) measured faster, ``flash_attention`` calls it instead, after ``_rope_kernel``
rotates q and k into a ``[2, B, T, H, D]`` buffer when there is RoPE (v stays a view):
``configs.prefers_sdpa`` is the rule, fixed per shape so a captured graph always launches the
same kernels and the latency model can follow it; ``set_route`` forces one route for the process.
16-bit inputs only by default (fp32 keeps the Triton kernel); an explicit config is the Triton
kernel's. The SDPA output is ``[B, H, T, D]`` over memory laid out like q (``[B, T, H, D]`` for
the qkv views), so the ``[B, T, H·D]`` result is a view there, a copy otherwise.

Cost, causal, per (batch, head): 2·T²·D matmul FLOPs (half of the non-causal 4·T²·D); bytes
read: q once, k and v ⌈T/BLOCK_M⌉/2 times on average (from L2 mostly), o written once:
2·T·D·(1 + 1 + 1) bytes at the minimum in bf16.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from kernels._autotune import autotune
from kernels._common import INTERPRETED, Routes, check_heads, output_buffer, pdl, tma_ready, use_torch_allocator
from kernels._pdl import enter
from kernels.attention import configs as _configs
from kernels.attention.configs import AttentionConfig, attention_configs

__all__ = ["flash_attention", "flash_attention_qkv", "flops", "last_route", "last_tuned_config", "set_route"]

ROUTES = ("triton", "sdpa")
_routes = Routes("flash_attention", ROUTES)  # forced None: configs.prefers_sdpa picks per shape

_LOG2E = 1.4426950408889634
# Mask modes of one key-block walk.
_FULL = tl.constexpr(0)  # every key valid for every query row: no mask
_TAIL = tl.constexpr(1)  # keys past T masked (non-causal tail block)
_DIAG = tl.constexpr(2)  # causal: key index ≤ query index (implies < T for every stored row)


@triton.jit
def _load_rotated(desc, row, cos_desc, sin_desc, ROPE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [row, row + N) of one head, ``[N, HEAD_DIM]``: one bulk copy, or with ROPE two
    half-row copies rotated in fp32 and interleaved back to (x1·cos − x2·sin, x2·cos + x1·sin)."""
    if ROPE:
        HALF: tl.constexpr = HEAD_DIM // 2
        x1 = desc.load([row, 0]).to(tl.float32)  # [N, D/2] each
        x2 = desc.load([row, HALF]).to(tl.float32)
        c = cos_desc.load([row, 0]).to(tl.float32)
        s = sin_desc.load([row, 0]).to(tl.float32)
        rotated = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)  # [N, D/2, 2]
        return tl.reshape(tl.permute(rotated, (0, 2, 1)), (rotated.shape[0], HEAD_DIM))
    else:
        return desc.load([row, 0])


@triton.jit
def _attend(
    acc,
    l_i,
    m_i,
    q,
    offs_m,
    k_desc,
    v_desc,
    cos_desc,
    sin_desc,
    T,
    lo,
    hi,
    MODE: tl.constexpr,
    ROPE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi): per block reads k, v ``[BLOCK_N, D]`` and does
    2·BLOCK_M·BLOCK_N·D FLOPs twice (q·kᵀ and p·v) on the tensor cores."""
    for start_n in range(lo, hi, BLOCK_N):
        k = _load_rotated(k_desc, start_n, cos_desc, sin_desc, ROPE, HEAD_DIM).to(q.dtype)
        v = v_desc.load([start_n, 0])  # rows past T arrive as zeros
        qk = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32, already ·scale·log2(e)
        if MODE == _DIAG:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        elif MODE == _TAIL:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            qk = tl.where(offs_n[None, :] < T, qk, float("-inf"))
        # Every row meets a valid key in its first block, so m_new is finite from then on.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    COS,
    SIN,  # q, k, v [B, H, T, D] strided; o [B, T, H·D]; cos, sin [>= T, D/2]
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_cs,
    H,
    T,
    qk_scale,  # qk_scale = scale·log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    ROPE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    bh = tl.program_id(0)
    start_m = tl.num_programs(1) - 1 - tl.program_id(1)  # heaviest query blocks first
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    # One descriptor per operand over this head's [T, D] rows; with ROPE q and k are read as halves.
    PART: tl.constexpr = HEAD_DIM // 2 if ROPE else HEAD_DIM
    q_desc = tl.make_tensor_descriptor(
        Q + b * stride_qb + h * stride_qh, [T, HEAD_DIM], [stride_qt, 1], [BLOCK_M, PART]
    )
    k_desc = tl.make_tensor_descriptor(
        K + b * stride_kb + h * stride_kh, [T, HEAD_DIM], [stride_kt, 1], [BLOCK_N, PART]
    )
    v_desc = tl.make_tensor_descriptor(
        V + b * stride_vb + h * stride_vh, [T, HEAD_DIM], [stride_vt, 1], [BLOCK_N, HEAD_DIM]
    )
    if ROPE:
        cos_q = tl.make_tensor_descriptor(COS, [T, PART], [stride_cs, 1], [BLOCK_M, PART])
        sin_q = tl.make_tensor_descriptor(SIN, [T, PART], [stride_cs, 1], [BLOCK_M, PART])
        cos_k = tl.make_tensor_descriptor(COS, [T, PART], [stride_cs, 1], [BLOCK_N, PART])
        sin_k = tl.make_tensor_descriptor(SIN, [T, PART], [stride_cs, 1], [BLOCK_N, PART])
    else:  # placeholders, never read
        cos_q = q_desc
        sin_q = q_desc
        cos_k = k_desc
        sin_k = k_desc
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)

    # Reads BLOCK_M·D of q once; the scale goes in before the cast so the scores need no multiply.
    q = _load_rotated(q_desc, start_m * BLOCK_M, cos_q, sin_q, ROPE, HEAD_DIM)
    q = (q.to(tl.float32) * qk_scale).to(K.dtype.element_ty)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        # Keys [0, start_m·BLOCK_M) precede every query of this block and all lie inside T.
        diag = start_m * BLOCK_M
        acc, l_i, m_i = _attend(
            acc, l_i, m_i, q, offs_m, k_desc, v_desc, cos_k, sin_k, T, 0, diag, _FULL, ROPE, HEAD_DIM, BLOCK_N
        )
        acc, l_i, m_i = _attend(
            acc,
            l_i,
            m_i,
            q,
            offs_m,
            k_desc,
            v_desc,
            cos_k,
            sin_k,
            T,
            diag,
            tl.minimum(diag + BLOCK_M, T),
            _DIAG,
            ROPE,
            HEAD_DIM,
            BLOCK_N,
        )
    else:
        full = (T // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attend(
            acc, l_i, m_i, q, offs_m, k_desc, v_desc, cos_k, sin_k, T, 0, full, _FULL, ROPE, HEAD_DIM, BLOCK_N
        )
        acc, l_i, m_i = _attend(
            acc, l_i, m_i, q, offs_m, k_desc, v_desc, cos_k, sin_k, T, full, T, _TAIL, ROPE, HEAD_DIM, BLOCK_N
        )

    # Writes BLOCK_M·D: row t of head h lands at o[b, t, h·D : (h+1)·D]; rows past T are dropped.
    o_desc = tl.make_tensor_descriptor(
        O + b * T * (H * HEAD_DIM), [T, H * HEAD_DIM], [H * HEAD_DIM, 1], [BLOCK_M, HEAD_DIM]
    )
    o_desc.store([start_m * BLOCK_M, (h * HEAD_DIM).to(tl.int32)], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def _rope_kernel(
    q,
    k,  # [B, H, T, D] each, any strides with unit stride along D
    out,  # [2, B, T, H, D] contiguous: rotated q, then rotated k
    cos,
    sin,  # [>= T, D/2], row stride stride_c, unit column stride
    H,
    T,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_c,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # One program: BLOCK_T rows of one head of q (axis 2 = 0) or k (= 1), channel pairs
    # (d, d + D/2) rotated in fp32 as ``reference.rope``, one rounding.
    bh = tl.program_id(1)
    which = tl.program_id(2)
    b = bh // H
    h = bh % H
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, HALF)
    mask = (rows < T)[:, None]
    if which == 0:
        src = q + b.to(tl.int64) * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_qt + cols[None, :]
    else:
        src = k + b.to(tl.int64) * stride_kb + h * stride_kh + rows[:, None].to(tl.int64) * stride_kt + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    table = rows[:, None] * stride_c + cols[None, :]
    c = tl.load(cos + table, mask=mask, other=1.0).to(tl.float32)
    s = tl.load(sin + table, mask=mask, other=0.0).to(tl.float32)
    B = tl.num_programs(1) // H
    dst = out + (((which * B + b).to(tl.int64) * T + rows[:, None]) * H + h) * (2 * HALF) + cols[None, :]
    tl.store(dst, (x1 * c - x2 * s).to(out.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * c + x1 * s).to(out.dtype.element_ty), mask=mask)


def _rotate(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """q and k ``[B, H, T, D]`` rotated (``reference.rope``) into one new ``[2, B, T, H, D]``
    buffer; returns its two halves as ``[B, H, T, D]`` views (the layout of the qkv views)."""
    B, H, T, D = q.shape
    half = D // 2
    if cos.stride(1) != 1 or sin.stride(1) != 1 or cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    rot = torch.empty(2, B, T, H, D, dtype=q.dtype, device=q.device)
    block_t = _configs.ROPE_INTERPRETER_ROWS if INTERPRETED else _configs.ROPE_BLOCK_ELEMENTS // half
    _rope_kernel[(triton.cdiv(T, block_t), B * H, 2)](
        q,
        k,
        rot,
        cos,
        sin,
        H,
        T,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        cos.stride(0),
        HALF=half,
        BLOCK_T=block_t,
        num_warps=4,
        **pdl(q),
    )
    return rot[0].permute(0, 2, 1, 3), rot[1].permute(0, 2, 1, 3)


def _sdpa_route(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    rope: tuple[Tensor, Tensor] | None,
    scale: float,
    out: Tensor | None,
) -> Tensor:
    """``flash_attention`` as [the rotary pass and] torch's SDPA with its default backend."""
    B, H, T, D = q.shape
    if rope is not None:
        q, k = _rotate(q, k, *rope)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(1, 2)  # [B, T, H, D]
    if out is None:
        return o.reshape(B, T, H * D)  # a view where SDPA wrote q's layout
    out.view(B, T, H, D).copy_(o)
    return out


def set_route(route: str | None) -> None:
    """For every later call of this process without an explicit config: "triton" runs the Triton
    kernel, "sdpa" the rotary pass and torch's SDPA, None (the default) lets
    ``configs.prefers_sdpa`` pick per shape. Under ``TRITON_INTERPRET=1`` and for fp32 the
    default is the Triton kernel; tests force "sdpa" to check that route on the CPU (torch's
    math backend there)."""
    _routes.set(route)


def last_route() -> str | None:
    """The route ("triton" or "sdpa") of the latest call without an explicit config."""
    return _routes.last()


@cache
def _tuned(device: torch.device, head_dim: int) -> triton.runtime.Autotuner:
    """The kernel autotuned over ``configs.attention_configs`` for this device and head dim
    (one config: no tuning run). Cached per length, causal flag, RoPE flag and dtypes."""
    configs = [
        triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n}, num_warps=c.num_warps, num_stages=c.num_stages)
        for c in attention_configs(device, head_dim)
    ]
    return autotune(configs, key=["T", "CAUSAL", "ROPE"])(_flash_fwd_kernel)


def last_tuned_config(device: torch.device, head_dim: int) -> AttentionConfig | None:
    """The config the autotuner chose at its latest tuning on ``device`` for ``head_dim`` (None
    before the first call); benchmarks report it."""
    best = getattr(_tuned(device, head_dim), "best_config", None)
    if best is None:
        return None
    return AttentionConfig(best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.num_warps, best.num_stages)


def _check_rope(rope: tuple[Tensor, Tensor], q: Tensor) -> None:
    T, D = q.shape[2], q.shape[3]
    for name, table in zip(("cos", "sin"), rope, strict=True):
        if table.dim() != 2 or table.shape[0] < T or table.shape[1] != D // 2 or table.device != q.device:
            raise ValueError(
                f"flash_attention: rope {name} must be [>= T, D/2] = [>= {T}, {D // 2}] on {q.device}, "
                f"got {tuple(table.shape)} on {table.device}"
            )


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    rope: tuple[Tensor, Tensor] | None = None,
    scale: float | None = None,
    out: Tensor | None = None,
    config: AttentionConfig | None = None,
) -> Tensor:
    """Softmax attention ``softmax(q·kᵀ·scale [+ causal mask])·v``: one launch of the Triton kernel,
    or the SDPA route where ``configs.prefers_sdpa`` says so (module docstring).

    q, k, v: ``[B, H, T, D]`` bf16/fp16 (fp32: tf32 on GPU), any strides (read in place when rows
    are 16-byte aligned with unit stride on D, as views of the qkv projection are; else copied);
    D in SUPPORTED_HEAD_DIMS, else ValueError.
    rope: optional ``(cos, sin)``, each ``[>= T, D/2]`` of any float dtype (q's dtype halves their
    traffic), applied to q and k in-kernel as ``nas.models.mixers.apply_rope`` does (half-split pairs).
    scale: defaults to D^-1/2, as ``F.scaled_dot_product_attention``.
    out: optional contiguous ``[B, T, H·D]`` buffer of q's dtype to write into.
    config: run the Triton kernel with this launch config instead of the route and the autotuned
    config (tests, benchmark sweeps).
    Returns ``[B, T, H·D]`` in q's dtype, contiguous.
    """
    check_heads("flash_attention", q, k, v, layout="BHTD")
    if rope is not None:
        _check_rope(rope, q)
    B, H, T, D = q.shape
    if config is None:
        if _routes.forced is not None:
            route = _routes.forced
        elif INTERPRETED or q.dtype == torch.float32:
            route = "triton"
        else:
            capability = torch.cuda.get_device_capability(q.device)
            route = "sdpa" if _configs.prefers_sdpa(capability, B * H, T, rope is not None) else "triton"
        _routes.took(route)
        if route == "sdpa" and T > 0 and B * H > 0:
            if out is not None:
                output_buffer("flash_attention", out, (B, T, H * D), q)  # checks it
            return _sdpa_route(q, k, v, causal=causal, rope=rope, scale=D**-0.5 if scale is None else scale, out=out)
    o = output_buffer("flash_attention", out, (B, T, H * D), q)
    if T == 0 or B * H == 0:
        return o
    scale = D**-0.5 if scale is None else scale
    q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
    cos, sin = (tma_ready(t) for t in rope) if rope is not None else (q, q)  # never read without ROPE
    if cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    use_torch_allocator()

    def grid(meta: dict) -> tuple[int, int]:
        return B * H, triton.cdiv(T, meta["BLOCK_M"])

    args = (
        q,
        k,
        v,
        o,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        cos.stride(0),
        H,
        T,
        scale * _LOG2E,
    )
    meta = dict(HEAD_DIM=D, CAUSAL=causal, ROPE=rope is not None, **pdl(q))
    if config is None:
        _tuned(q.device, D)[grid](*args, **meta)
    else:
        _flash_fwd_kernel[grid({"BLOCK_M": config.block_m})](
            *args,
            **meta,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return o


def flash_attention_qkv(
    qkv: Tensor,
    heads: int,
    *,
    causal: bool,
    rope: tuple[Tensor, Tensor] | None = None,
    scale: float | None = None,
    out: Tensor | None = None,
    config: AttentionConfig | None = None,
) -> Tensor:
    """``flash_attention`` on the fused projection ``qkv [B, T, 3·H·D]`` (q, k, v blocks of H·D
    channels, head-major inside each, as ``nn.Linear(d, 3d)`` of the model emits); reads it in place.
    Returns ``[B, T, H·D]``."""
    if qkv.dim() != 3 or qkv.shape[-1] % (3 * heads):
        raise ValueError(f"qkv must be [B, T, 3·H·D] with H={heads}, got {tuple(qkv.shape)}")
    B, T, _ = qkv.shape
    q, k, v = qkv.view(B, T, 3, heads, -1).permute(2, 0, 3, 1, 4)  # each [B, H, T, D], strided
    return flash_attention(q, k, v, causal=causal, rope=rope, scale=scale, out=out, config=config)


def flops(B: int, H: int, T: int, D: int, *, causal: bool) -> float:
    """Matmul FLOPs of the forward: 4·T²·D per head, half of it causal (the mask's diagonal blocks ignored)."""
    return 4.0 * B * H * T * T * D / (2.0 if causal else 1.0)
