"""The linear-attention decoding step with its recurrent state stored in bf16 (``state_dtype: bf16``).

``triton.linear_attention_step``'s step, the state ``S [B, H, D, D]`` and normalizer ``z [B, H, D]``
kept in bf16 between tokens: each sum is taken in fp32 from the stored value and rounded to bf16
(nearest even) when stored, S_t = bf16(S_{t-1} + φ(k_t)v_tᵀ), z_t = bf16(z_{t-1} + φ(k_t)), and
the output reads them as stored: o_t = φ(q_t)·S_t [/ (φ(q_t)·z_t + EPS)]
(``nas.models.precision.linear_attention_stored_state``'s math, which scores such a candidate).
The step is memory-bound on the state (read and written once): 4·D² bytes per head instead of
fp32's 8·D². Same grid, tiles and per-head tickets as the fp32 step (``configs.step_config``).

The forward, and every latency measured or calibrated so far, never runs this file
(``nas.latency`` leaves it out of the kernel fingerprints).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import check_heads, pdl, sm_count
from kernels._pdl import enter
from kernels.device import is_cuda
from kernels.linear_attention.configs import StepConfig, step_config
from kernels.linear_attention.triton import _EPS, _feature, _feature_args, _step_tickets

__all__ = ["STATE_DTYPE", "linear_attention_step_bf16"]

STATE_DTYPE = torch.bfloat16


@triton.jit
def _to_bf16(x):
    """fp32 ``x`` rounded to bf16, nearest even, by its bits (add 0x7FFF plus the kept part's last
    bit, clear the low half) and then cast, which re-encodes an exact value: a GPU's cast rounds
    so too, but Triton's interpreter truncates. For finite values (a state's)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536: 0xFFFF0000 as int32
    return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)


@triton.jit
def _step_bf16_kernel(
    Q,
    K,
    V,
    S,
    Z,
    OUT,  # q, k, v [B, H, D] strided; S [B, H, D, D], Z [B, H, D] bf16 in place; o [B, H·D]
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
    # Program (head, j): columns j·BLOCK_V.. of the head's state, 4·D·BLOCK_V state bytes read and
    # written, plus 2·D + BLOCK_V inputs and BLOCK_V outputs (the fp32 step's program otherwise).
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
    s_prev = tl.load(s_ptrs).to(tl.float32)
    if HAS_Z:  # loaded before the state is stored: one memory round trip, not two
        z_ptrs = Z + bh.to(tl.int64) * HEAD_DIM + d
        z = _to_bf16(tl.load(z_ptrs).to(tl.float32) + kf)  # z_t, as stored
    s = _to_bf16(s_prev + kf[:, None] * v[None, :])  # S_t, as stored
    tl.store(s_ptrs, s)
    o = tl.sum(qf[:, None] * s.to(tl.float32), 0)  # φ(q_t)·S_t  [BLOCK_V]
    if NORMALIZE:
        o = o / (tl.sum(qf * z.to(tl.float32), 0) + _EPS)
    tl.store(OUT + b * H * HEAD_DIM + h * HEAD_DIM + dv, o.to(OUT.dtype.element_ty))
    if HAS_Z:
        if HEAD_DIM // BLOCK_V == 1:
            tl.store(z_ptrs, z)
        else:
            # as in the fp32 step: the last of the head's programs to read z_{t-1} writes z_t
            tl.debug_barrier()
            ticket = tl.atomic_add(TICKETS + bh, 1, sem="acq_rel")
            if ticket == HEAD_DIM // BLOCK_V - 1:
                tl.store(z_ptrs, z)
                tl.atomic_xchg(TICKETS + bh, 0, sem="relaxed")


def linear_attention_step_bf16(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: Tensor,
    z: Tensor | None,
    *,
    feature_map: str,
    config: StepConfig | None = None,
) -> Tensor:
    """One decoding step over a bf16 state (the module's rounding), in place: q, k, v
    ``[B, H, D]`` one token (any strides); state ``[B, H, D, D]`` and z ``[B, H, D]`` bf16
    contiguous (z required for the normalized maps, else may be None). Returns o ``[B, H·D]`` in
    q's dtype; one launch, capturable in a CUDA graph (``triton.linear_attention_step``'s grid)."""
    check_heads("linear_attention_step_bf16", q, k, v, layout="BHD")
    normalize, q_scale = _feature_args(feature_map, q.shape[-1])
    B, H, D = q.shape
    if state.shape != (B, H, D, D) or state.dtype != STATE_DTYPE or not state.is_contiguous():
        raise ValueError(
            f"state must be contiguous bf16 [B, H, D, D] = {[B, H, D, D]}, got {state.dtype} {tuple(state.shape)}"
        )
    if z is None and normalize:
        raise ValueError(f"feature_map {feature_map!r} is normalized: z [B, H, D] is required")
    if z is not None and (z.shape != (B, H, D) or z.dtype != STATE_DTYPE or not z.is_contiguous()):
        raise ValueError(f"z must be contiguous bf16 [B, H, D] = {[B, H, D]}, got {z.dtype} {tuple(z.shape)}")
    for name, t in (("state", state), ("z", z)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = torch.empty(B, H * D, device=q.device, dtype=q.dtype)
    sms = sm_count(q.device) if is_cuda(q.device) else 1
    cfg = config or step_config(q.device, B * H, D, sms)
    if D % cfg.block_v:
        raise ValueError(f"config.block_v {cfg.block_v} must divide the head dim {D}")
    _step_bf16_kernel[(B * H, D // cfg.block_v)](
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
