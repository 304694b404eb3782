"""LayerNorm and RMSNorm over the last dim, with an optional fused residual add.

With ``residual`` the kernel computes the pre-norm block's two outputs in one pass:
``h = x + residual`` (the updated residual stream, stored in x's dtype) and ``y = norm(h)``.
The statistics are taken from ``h`` as stored, so ``y`` equals the plain norm of the returned
``h`` exactly as an unfused ``norm(x + residual)`` would compute it. Unfused that is one add
kernel (reads 2·M·N, writes M·N) and one norm kernel (reads M·N, writes M·N); fused, reads
2·M·N and writes 2·M·N elements: 4/5 of the traffic and one launch.

Statistics are fp32: mean and variance (biased, as ``nn.LayerNorm``) from the row held in
registers, two-pass over registers for the variance; RMSNorm uses mean(h²) as ``nn.RMSNorm``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from kernels._common import INTERPRETED, as_rows, check_int32, check_operands, check_runnable, output_buffer, pdl
from kernels._pdl import enter
from kernels.norm.configs import INTERPRETER, MAX_N, NormConfig, norm_config
from kernels.norm.reference import EPS

__all__ = ["layer_norm", "rms_norm"]


@triton.jit
def _norm_kernel(
    x,
    r,
    w,
    b,
    y,
    h,  # x, r, y, h [M, N]; w, b [N]
    M,
    N,
    eps,
    stride_xm,
    stride_rm,
    stride_ym,
    stride_hm,
    RMS: tl.constexpr,  # RMSNorm (no centring, no bias) instead of LayerNorm
    HAS_WEIGHT: tl.constexpr,  # False: unit scale (a linear after the norm holds the scale in its weight)
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Per row: read N (x) [+ N (r)], write N (y) [+ N (h)] elements; w and b (N each) stay in L2.
    # FLOPs ≈ 7·N (LayerNorm) / 4·N (RMSNorm): memory-bound by two orders of magnitude.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    col_ok = cols < N
    mask = (rows < M)[:, None] & col_ok[None, :]  # [ROWS, BLOCK_N]
    v = tl.load(x + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        v += tl.load(r + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        v_stored = v.to(h.dtype.element_ty)
        tl.store(h + rows[:, None] * stride_hm + cols[None, :], v_stored, mask=mask)
        v = v_stored.to(tl.float32)  # normalize h as stored: y == norm(h) exactly

    if RMS:
        rstd = tl.rsqrt(tl.sum(v * v, axis=1) / N + eps)  # [ROWS]
        v = v * rstd[:, None]
    else:
        mean = tl.sum(v, axis=1) / N  # [ROWS]; masked columns loaded as 0
        d = tl.where(col_ok[None, :], v - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)
        v = d * rstd[:, None]
    if HAS_WEIGHT:
        v = v * tl.load(w + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        v += tl.load(b + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y + rows[:, None] * stride_ym + cols[None, :], v.to(y.dtype.element_ty), mask=mask)


def _norm(
    op: str,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    residual: Tensor | None,
    out: Tensor | None,
    residual_out: Tensor | None,
    config: NormConfig | None,
) -> Tensor | tuple[Tensor, Tensor]:
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [*, N], got a 0-dim tensor")
    N = x.shape[-1]
    if not 1 <= N <= MAX_N:
        raise ValueError(f"{op}: the normalized dim must be in [1, {MAX_N}], got N = {N}")
    check_runnable(op, x)
    check_int32(op, "x", x)
    check_operands(
        op, x.device, ("x", x, x.shape), ("weight", weight, (N,)), ("bias", bias, (N,)), ("residual", residual, x.shape)
    )
    if residual is not None and residual.dtype != x.dtype:
        raise ValueError(f"{op}: residual.dtype must equal x.dtype ({x.dtype}), got {residual.dtype}")
    if residual is None and residual_out is not None:
        raise ValueError(f"{op}: residual_out is written only when residual is given")

    y = output_buffer(op, out, x.shape, x)
    h = output_buffer(op, residual_out, x.shape, x, "residual_out") if residual is not None else None
    x2 = as_rows(x, N)
    M = x2.shape[0]
    if M:
        r2 = None if residual is None else as_rows(residual, N)
        y2, h2 = y.view(M, N), None if h is None else h.view(M, N)
        if config is None:
            config = INTERPRETER if INTERPRETED else norm_config(N)
        _norm_kernel[(triton.cdiv(M, config.rows),)](
            x2,
            r2,
            None if weight is None else weight.contiguous(),
            None if bias is None else bias.contiguous(),
            y2,
            h2,
            M,
            N,
            float(eps),
            x2.stride(0),
            0 if r2 is None else r2.stride(0),
            y2.stride(0),
            0 if h2 is None else h2.stride(0),
            RMS=op == "rms_norm",
            HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None,
            HAS_RESIDUAL=r2 is not None,
            ROWS=config.rows,
            BLOCK_N=triton.next_power_of_2(N),
            num_warps=config.num_warps,
            **pdl(x),
        )
    return y if h is None else (y, h)


def layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float = EPS,
    *,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    residual_out: Tensor | None = None,
    config: NormConfig | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``nn.LayerNorm`` over the last dim, fp32 statistics; with ``residual``, of ``h = x + residual``.

    x: ``[*, N]`` bf16 / fp16 / fp32. weight, bias: ``[N]`` (any of those dtypes; either may be
    None: unit scale, no shift). residual: ``[*, N]`` in x's dtype, or None. out / residual_out: contiguous buffers
    like x to write y / h into, or None. Returns y ``[*, N]`` in x's dtype, or ``(y, h)`` when
    ``residual`` is given.
    """
    return _norm("layer_norm", x, weight, bias, eps, residual, out, residual_out, config)


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    eps: float = EPS,
    *,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    residual_out: Tensor | None = None,
    config: NormConfig | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``nn.RMSNorm(N, eps)`` over the last dim, fp32 statistics; with ``residual``, of ``h = x + residual``.

    x: ``[*, N]`` bf16 / fp16 / fp32. weight: ``[N]``, or None (unit scale). residual, out, residual_out: as
    ``layer_norm``. Returns y ``[*, N]`` in x's dtype, or ``(y, h)`` when ``residual`` is given.
    """
    return _norm("rms_norm", x, weight, None, eps, residual, out, residual_out, config)
