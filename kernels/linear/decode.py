"""Fused linear layer for a few rows (decoding): ``y = act(x Wᵀ + b) + residual`` with split-K.

A decoding step runs every linear layer on B rows (one token per sequence), so it reads the
whole weight ``[N, K]`` to do 2·B·N·K FLOPs: B FLOP per byte, memory-bound for any B ≤ 64. The
forward's tiles (``kernels.linear.triton``) give a 1024-wide layer 8-32 programs, a few of an
H200's 132 SMs, which stream the weights far below its bandwidth (docs/benchmarks.md, decode).
Here the K dimension is split too: programs (column block, K slice, row
block) each stream a ``[BLOCK_N, K/SPLIT_K]`` slice of the weight once — reads N·K elements in
all, plus M·K of x per column block — and add their fp32 partial ``[BLOCK_M, BLOCK_N]`` into a
workspace with atomics. The last program of a column block (an acq_rel ticket, as the linear-
attention step advances z) takes the sum (and writes zeros back, so the workspace is clean for
the next launch), applies bias, activation and residual in fp32, and writes the single
rounded output: one launch, and capturable in a CUDA graph once a first call has made the
workspace. Without a split (``split_k`` 1) the program writes its tile directly.

Rows are padded to 16 inside a tile so the partial products run on the tensor cores (q
replicated as the decode attention does), which lets Triton pipeline the weight loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import as_rows, check_int32, check_operands, check_runnable, output_buffer, pdl, sm_count
from kernels._pdl import enter
from kernels.device import is_cuda
from kernels.linear.configs import RowsConfig, rows_config
from kernels.linear.reference import ACTIVATIONS
from kernels.linear.triton import _activate

__all__ = ["linear_rows"]


@triton.jit
def _rows_kernel(
    X,
    W,
    B,
    R,
    OUT,
    WS,  # fp32 [M, N] zeros between launches (split_k > 1)
    TICKETS,  # int32 [row blocks · column blocks] zeros between launches
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_om,
    K_PER_SPLIT,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # Reads BLOCK_N·BLOCK_K weights and BLOCK_M·BLOCK_K inputs per step; 2·BLOCK_M·BLOCK_N·BLOCK_K FLOPs.
    for k in range(k_lo, k_hi, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        x = tl.load(
            X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
            mask=m_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = tl.load(
            W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :],
            mask=n_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(x, tl.trans(w), acc)
    tile = offs_m[:, None] * N + offs_n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:
        tl.atomic_add(WS + tile, acc, mask=ok, sem="relaxed")
        # Every partial is ordered before its program's ticket (the barrier gathers all threads'
        # adds, the ticket releases them); the last program's ticket (acquire) sees them all. It
        # takes the sum and leaves zeros for the next launch.
        tl.debug_barrier()
        ticket = tl.atomic_add(TICKETS + pid_m * tl.num_programs(0) + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            # the sum, read at L2 through an atomic; every other partial is in, so plain zeros re-arm it
            acc = tl.atomic_add(WS + tile, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), mask=ok, sem="relaxed")
            tl.store(WS + tile, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), mask=ok)
            tl.atomic_xchg(TICKETS + pid_m * tl.num_programs(0) + pid_n, 0, sem="relaxed")
            _epilogue(acc, B, R, OUT, offs_m, offs_n, N, ok, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL, ACTIVATION)
    else:
        _epilogue(acc, B, R, OUT, offs_m, offs_n, N, ok, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL, ACTIVATION)


@triton.jit
def _epilogue(
    acc,
    B,
    R,
    OUT,
    offs_m,
    offs_n,
    N,
    ok,
    stride_rm,
    stride_om,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """bias, activation, residual on the fp32 sum; one rounding to the output's dtype."""
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, ACTIVATION)
    rows = offs_m[:, None].to(tl.int64)
    if HAS_RESIDUAL:
        acc += tl.load(R + rows * stride_rm + offs_n[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + rows * stride_om + offs_n[None, :], acc.to(OUT.dtype.element_ty), mask=ok)


def _workspace(device: torch.device, elements: int, tickets: int) -> tuple[Tensor, Tensor]:
    """The split-K workspace (fp32 zeros) and tickets (int32 zeros), at least this large: one
    pair per device, kept here and grown when a larger call comes; every launch leaves them zero.
    Made outside any CUDA-graph capture (a buffer born inside one would belong to the graph)."""
    buffers = _workspace.__dict__.setdefault("buffers", {})
    key = str(device)
    found = buffers.get(key)
    if found is None or found[0].numel() < elements or found[1].numel() < tickets:
        if is_cuda(device) and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("linear_rows: run it once at this shape before capturing it in a CUDA graph")
        old = (0, 0) if found is None else (found[0].numel(), found[1].numel())
        found = buffers[key] = (
            torch.zeros(max(elements, old[0], 1 << 16), dtype=torch.float32, device=device),
            torch.zeros(max(tickets, old[1], 1024), dtype=torch.int32, device=device),
        )
    return found


def linear_rows(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    config: RowsConfig | None = None,
) -> Tensor:
    """``act(x Wᵀ + bias) + residual`` for a few rows, one launch, fp32 accumulation (the same
    contract as ``kernels.linear.linear``, tuned for decoding: see the module docstring).

    x: ``[M, K]`` or ``[*, K]`` (unit stride on K), bf16 / fp16 / fp32 (fp32: tf32 products on a
    GPU, as the attention kernels; the forward's ``linear`` keeps fp32 exact); weight ``[N, K]`` in x's
    dtype; bias ``[N]`` or None; activation None | "gelu" | "relu" | "silu"; residual ``[*, N]``
    or None; out ``[*, N]`` contiguous or None; config: a fixed launch (tests) instead of
    ``configs.rows_config``'s. Returns ``[*, N]`` in x's dtype.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear_rows: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if x.dim() < 1 or weight.dim() != 2:
        raise ValueError(
            f"linear_rows: x must be [*, K] and weight [N, K], got {list(x.shape)} and {list(weight.shape)}"
        )
    check_runnable("linear_rows", x)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"linear_rows: x's last dim must equal weight's K = {K}, got x {list(x.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"linear_rows: weight.dtype must equal x.dtype ({x.dtype}), got {weight.dtype}")
    lead = tuple(x.shape[:-1])
    x2 = as_rows(x, K)
    M = x2.shape[0]
    operands = (("x", x2, (M, K)), ("weight", weight, (N, K)), ("bias", bias, (N,)), ("residual", residual, (*lead, N)))
    check_operands("linear_rows", x.device, *operands)
    for name, t, _ in operands:
        if t is not None:
            check_int32("linear_rows", name, t)
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    r2 = None if residual is None else as_rows(residual, N)
    o = output_buffer("linear_rows", out, (*lead, N), x).view(M, N)
    if M == 0 or N == 0:
        return o.view(*lead, N)
    sms = sm_count(x.device) if is_cuda(x.device) else 1
    cfg = config or rows_config(x.device, M, N, K, sms)
    per_split = -(-K // cfg.split_k)
    per_split = -(-per_split // cfg.block_k) * cfg.block_k  # whole BLOCK_K steps per slice
    split_k = -(-K // per_split) if K else 1
    grid = (triton.cdiv(N, cfg.block_n), split_k, triton.cdiv(M, cfg.block_m))
    ws, tickets = _workspace(x.device, M * N if split_k > 1 else 0, grid[0] * grid[2] if split_k > 1 else 0)
    _rows_kernel[grid](
        x2,
        weight,
        bias if bias is not None else weight,
        r2 if r2 is not None else o,
        o,
        ws,
        tickets,
        M,
        N,
        K,
        x2.stride(0),
        weight.stride(0),
        r2.stride(0) if r2 is not None else 0,
        o.stride(0),
        per_split,
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=r2 is not None,
        ACTIVATION=activation or "none",
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl(x2),
    )
    return o.view(*lead, N)
