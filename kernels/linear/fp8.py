"""The fp8 route of a linear layer (``weight_dtype: fp8``): both operands in fp8 e4m3, as Hopper's
and Ada's fp8 tensor cores take them.

    y = act((x_q · s_x) (W_q · s_w)ᵀ + b) + r

- ``quantize_weight``: the weight ``[N, K]`` stored once (K padded with zeros to a multiple of 16,
  ``K_ALIGN``, as the activations are) with one fp32 scale per output channel
  (``kernels._fp8``'s rule: amax over the channel's K inputs / 448);
- ``quantize_rows``: the activations ``[M, K]`` quantized on the fly with one scale per row
  (token), the same rule (a "dynamic" per-token scale); one launch, a program per block of rows:
  a pass for the rows' amax, a pass that writes the rounded values;
- ``linear_fp8``: the matmul of the two on the tensor cores (fp8 products, sums promoted to fp32
  every BLOCK_K products), the scales
  applied to each output tile once (s_x per row times s_w per column), then the bias, the
  activation and the residual in fp32, one rounding to the output dtype.

What a candidate with fp8 weights is scored with (``nas.models.precision.StoredLinear``) rounds
the same two operands by the same rule, so the search's accuracy and this kernel's output differ
only by summation order. The forward, and every latency measured or calibrated so far, never runs
this file (``nas.latency`` leaves it out of the kernel fingerprints).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import DTYPES, check_runnable, pdl
from kernels._fp8 import FP8_DTYPE, scaled, to_e4m3
from kernels._pdl import enter
from kernels.device import is_cuda
from kernels.linear.reference import ACTIVATIONS
from kernels.linear.triton import _activate

__all__ = ["K_ALIGN", "Fp8Config", "fp8_config", "linear_fp8", "padded_k", "quantize_rows", "quantize_weight"]


@dataclass(frozen=True)
class Fp8Config:
    """One launch of ``linear_fp8``: output tile BLOCK_M × BLOCK_N, K step BLOCK_K, GROUP_M rows
    of tiles walked together (L2 reuse of W), warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


FP8_HOPPER = Fp8Config(128, 128, 128, 8, 8, 3)  # a starting tile, not yet tuned on a GPU
# A decode step's few rows (M <= ROWS_MAX_M): the weights dominate, so narrow tiles give one program per
# 16 output channels, enough programs to stream W from every SM (128 x 128 tiles would leave a 1024-wide
# layer to 8 of them); the tensor cores' M of 16 is the smallest fp8 MMA. Not yet tuned on a GPU.
FP8_HOPPER_ROWS = Fp8Config(16, 16, 256, 1, 4, 3)
ROWS_MAX_M = 16
FP8_INTERPRETER = Fp8Config(16, 16, 32, 2, 4, 1)  # small odd shapes cross tiles and K steps


def fp8_config(device: torch.device, m: int | None = None) -> Fp8Config:
    """The launch on ``device`` for ``m`` rows: on a GPU the rows tile for a decode step's few rows
    (``m <= ROWS_MAX_M``), else the Hopper tile; the interpreter's small one elsewhere."""
    if not is_cuda(device):
        return FP8_INTERPRETER
    return FP8_HOPPER_ROWS if m is not None and m <= ROWS_MAX_M else FP8_HOPPER


# fp8 operands hold K rounded up to a multiple of 16 (zeros past K, which add nothing to a dot
# product): every row then starts 16-byte aligned and K divides by 16, which Triton's
# specialization needs to load K with vector copies (cp.async) instead of single bytes
K_ALIGN = 16


def padded_k(k: int) -> int:
    """``k`` rounded up to a multiple of ``K_ALIGN``: the K of the fp8 operands."""
    return -(-k // K_ALIGN) * K_ALIGN


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """A linear weight ``[N, K]`` stored in fp8: ``(W_q [N, padded_k(K)] fp8, s_w [N] fp32)``, one
    scale per output channel, zeros past K (once per weight, in torch)."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_weight: weight must be [N, K], got {list(weight.shape)}")
    values, scales = scaled(weight, -1)
    N, K = values.shape
    stored = torch.zeros(N, padded_k(K), device=values.device, dtype=values.dtype)
    stored[:, :K] = values
    return stored, scales.contiguous()


@triton.jit
def _quantize_rows_kernel(
    X,  # [M, K], unit stride on K
    XQ,  # fp8 [M, KP], unit stride on K
    SX,  # fp32 [M]
    M,
    K,
    KP,  # K rounded up to K_ALIGN: columns K..KP are written as zeros
    stride_xm,
    stride_qm,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program = BLOCK_M rows: reads them twice (amax, then the values), writes K bytes a row and
    # one fp32 scale.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < M
    amax = tl.zeros((BLOCK_M,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = ok[:, None] & (ks < K)[None, :]
        x = tl.load(X + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :], mask=mask, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 1))
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)  # IEEE division: torch's scale exactly
    for k0 in range(0, KP, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mask = ok[:, None] & (ks < K)[None, :]
        x = tl.load(X + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :], mask=mask, other=0.0)
        q = to_e4m3(tl.math.div_rn(x.to(tl.float32), scale[:, None]), XQ.dtype.element_ty)  # 0 past K
        tl.store(XQ + rows.to(tl.int64)[:, None] * stride_qm + ks[None, :], q, mask=ok[:, None] & (ks < KP)[None, :])
    tl.store(SX + rows, scale, mask=ok)


@triton.jit
def _linear_fp8_kernel(
    XQ,  # fp8 [M, K], unit stride on K
    SX,  # fp32 [M]
    WQ,  # fp8 [N, K], unit stride on K
    SW,  # fp32 [N]
    BIAS,  # [N] or a dummy
    R,  # residual [M, N] (unit stride on N) or a dummy
    Y,  # [M, N], unit stride on N
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_ym,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Program = one BLOCK_M × BLOCK_N output tile: reads (BLOCK_M + BLOCK_N)·K fp8 bytes, does
    # 2·BLOCK_M·BLOCK_N·K FLOPs on the tensor cores, writes the tile once.
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    x_ptrs = XQ + rows.to(tl.int64)[:, None] * stride_xm
    w_ptrs = WQ + cols.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = (ks < K)[None, :]
        a = tl.load(x_ptrs + ks[None, :], mask=row_ok[:, None] & k_ok, other=0.0)
        b = tl.load(w_ptrs + ks[None, :], mask=col_ok[:, None] & k_ok, other=0.0)
        # fp8 × fp8 on the tensor cores, whose running sum on sm_90 keeps ~14 bits unless promoted:
        # promoted into the fp32 accumulator every BLOCK_K products (as cuBLAS's default does)
        acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
    acc = (
        acc * tl.load(SX + rows, mask=row_ok, other=0.0)[:, None] * tl.load(SW + cols, mask=col_ok, other=0.0)[None, :]
    )
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, ACTIVATION)
    mask = row_ok[:, None] & col_ok[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(R + rows.to(tl.int64)[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], acc.to(Y.dtype.element_ty), mask=mask)


def _check_fp8_matrix(op: str, name: str, t: Tensor, shape: tuple[int, int]) -> None:
    if t.dtype != FP8_DTYPE or tuple(t.shape) != shape or t.stride(1) != 1:
        raise ValueError(
            f"{op}: {name} must be {FP8_DTYPE} {list(shape)} with unit stride on K, "
            f"got {t.dtype} {list(t.shape)} strides {t.stride()}"
        )


def _check_scales(op: str, name: str, t: Tensor, n: int) -> None:
    if t.dtype != torch.float32 or tuple(t.shape) != (n,) or not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous fp32 [{n}], got {t.dtype} {list(t.shape)}")


def quantize_rows(x: Tensor, *, block_m: int | None = None) -> tuple[Tensor, Tensor]:
    """Activations ``[M, K]`` (unit stride on K) quantized per row: ``(x_q [M, padded_k(K)] fp8,
    s_x [M] fp32)``, zeros past K, as ``quantize_weight`` does a weight's channels; one launch."""
    check_runnable("quantize_rows", x)
    if x.dim() != 2 or x.stride(1) != 1 or x.dtype not in DTYPES:
        raise ValueError(
            f"quantize_rows: x must be [M, K] of {DTYPES} with unit stride on K, got {x.dtype} {list(x.shape)}"
        )
    M, K = x.shape
    xq = torch.empty(M, padded_k(K), device=x.device, dtype=FP8_DTYPE)
    sx = torch.empty(M, device=x.device, dtype=torch.float32)
    if M == 0:
        return xq, sx
    bm = block_m or (16 if not is_cuda(x.device) else 4)
    bk = min(triton.next_power_of_2(max(K, 16)), 128 if not is_cuda(x.device) else 1024)
    _quantize_rows_kernel[(triton.cdiv(M, bm),)](
        x, xq, sx, M, K, xq.shape[1], x.stride(0), xq.stride(0), BLOCK_M=bm, BLOCK_K=bk, num_warps=4, **pdl(x)
    )
    return xq, sx


def linear_fp8(
    x_q: Tensor,
    s_x: Tensor,
    w_q: Tensor,
    s_w: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    config: Fp8Config | None = None,
) -> Tensor:
    """``act((x_q·s_x)(w_q·s_w)ᵀ + bias) + residual`` → ``[M, N]`` in ``out_dtype``; one launch.

    x_q ``[M, K]`` and w_q ``[N, K]`` fp8 e4m3 with K a multiple of ``K_ALIGN`` (unit stride on K:
    ``quantize_rows``, ``quantize_weight``, which pad the layer's K with zeros), s_x ``[M]`` and
    s_w ``[N]`` fp32; bias ``[N]``, residual ``[M, N]``
    (unit stride on N) of any float dtype; activation one of ``kernels.linear.reference.ACTIVATIONS``.
    config: this launch instead of ``fp8_config``'s (tests, benchmarks)."""
    op = "linear_fp8"
    check_runnable(op, x_q)
    if x_q.dim() != 2 or w_q.dim() != 2 or x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"{op}: x_q [M, K] and w_q [N, K] must share K, got {list(x_q.shape)}, {list(w_q.shape)}")
    (M, K), N = x_q.shape, w_q.shape[0]
    if K % K_ALIGN:
        raise ValueError(f"{op}: K must be a multiple of {K_ALIGN} (quantize_rows and quantize_weight pad it), got {K}")
    _check_fp8_matrix(op, "x_q", x_q, (M, K))
    _check_fp8_matrix(op, "w_q", w_q, (N, K))
    _check_scales(op, "s_x", s_x, M)
    _check_scales(op, "s_w", s_w, N)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if out_dtype not in DTYPES:
        raise ValueError(f"{op}: out_dtype must be one of {DTYPES}, got {out_dtype}")
    if bias is not None and (tuple(bias.shape) != (N,) or not bias.is_contiguous()):
        raise ValueError(f"{op}: bias must be contiguous [{N}], got {list(bias.shape)}")
    if residual is not None and (tuple(residual.shape) != (M, N) or residual.stride(1) != 1):
        raise ValueError(f"{op}: residual must be [{M}, {N}] with unit stride on N, got {list(residual.shape)}")
    for name, t in (("s_x", s_x), ("w_q", w_q), ("s_w", s_w), ("bias", bias), ("residual", residual)):
        if t is not None and t.device != x_q.device:
            raise ValueError(f"{op}: {name} is on {t.device}, x_q on {x_q.device}")
    y = torch.empty(M, N, device=x_q.device, dtype=out_dtype)
    if M == 0 or N == 0:
        return y
    cfg = config or fp8_config(x_q.device, M)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    _linear_fp8_kernel[grid](
        x_q,
        s_x,
        w_q,
        s_w,
        bias if bias is not None else s_w,
        residual if residual is not None else y,
        y,
        M,
        N,
        K,
        x_q.stride(0),
        w_q.stride(0),
        residual.stride(0) if residual is not None else 0,
        y.stride(0),
        ACTIVATION=activation,
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl(x_q),
    )
    return y
