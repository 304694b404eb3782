"""Fused linear layer: ``y = act(x Wᵀ + b) + residual`` in one launch.

The matmul accumulates in fp32 on the tensor cores; bias, activation and residual are applied
to the fp32 accumulator before the single rounding to the output dtype, so the epilogue adds
no pass over memory: against cuBLAS ``F.linear`` followed by ``F.gelu`` it saves reading and
writing ``y`` once more (2·M·N elements) and one launch.

Tiles are autotuned per (M bucket, N, K) from ``configs.candidates`` (a handful at most, one
when M is small), so a new shape costs a few short timings, once per process. Call the kernel
once outside CUDA-graph capture before capturing it: tuning launches and synchronizes.

Two kernels compute it. ``_linear_kernel`` loads tiles through pointers, one program per output
tile. ``_linear_tma_kernel`` is persistent (≤ one program per SM) and moves tiles by tensor
descriptor (Hopper TMA), with the tile and K loops flattened into one software pipeline so a
tile's epilogue overlaps the next tile's loads. ``configs.prefers_tma`` picks between them per
call (TMA on sm_90+ for K > 256 and M > 64, where it measured faster on an H200); ``set_tma``
forces one or the other for the process (where descriptors can address the operands: the app
calls it from its settings), and an explicit config names its kernel.

Where the fused kernel loses to cuBLAS's main loop (nothing to fuse; K rows Triton cannot load
as vectors; long K and very wide outputs on sm_90, measured on an H200), ``linear`` runs
``torch.addmm`` (bias in cuBLAS's epilogue) and then an epilogue pass (activation, residual)
over the output in place: ``configs.prefers_cublas`` is the rule, fixed per shape so a captured
graph always launches the same kernels and the latency model can follow it; ``set_route``
forces one route for the process. 16-bit operands only: fp32 keeps the fused kernel's exact dot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._autotune import autotune
from kernels._common import (
    ALIGN,
    INTERPRETED,
    after_library,
    as_rows,
    check_int32,
    check_operands,
    check_runnable,
    output_buffer,
    pdl,
    sm_count,
    use_torch_allocator,
)
from kernels._pdl import enter
from kernels.linear import configs as _configs
from kernels.linear.configs import LinearConfig
from kernels.linear.reference import ACTIVATIONS, NORMS
from kernels.norm import layer_norm, rms_norm
from kernels.norm.reference import EPS as NORM_EPS

__all__ = ["linear", "last_route", "last_tuned_config", "set_route", "set_tma", "tma_programs"]

_AUTOTUNE_CALLS, _AUTOTUNE_REPLAYS = 20, 10  # per candidate: launches per graph, graph replays timed


@triton.jit
def _gelu(v):
    """x·Φ(x), the erf form of ``torch.nn.GELU()``, in about a dozen fp32 operations.

    Φ(−|x|) = erfc(|x|/√2)/2 from Abramowitz & Stegun 7.1.26 (|erf error| ≤ 1.5e-7):
    erfc(a) ≈ t·(a1 + t(a2 + t(a3 + t(a4 + t·a5))))·e^(−a²), t = 1/(1 + p·a). Forming Φ(x) as
    1 − Φ(−|x|) for x ≥ 0 and Φ(−|x|) below avoids the cancellation in 1 + erf(x) for negative x.
    Max |error| over [−10, 10] is 4e-7 (torch's own fp32 GELU: 1.2e-6, both against float64).
    It takes fewer instructions than libdevice's erff; at short K the GELU epilogue still costs more
    than its arithmetic explains, for a reason not yet found (docs/benchmarks.md).
    """
    a = tl.abs(v) * 0.7071067811865476
    t = tl.math.fdiv(1.0, 1.0 + 0.3275911 * a)  # approximate reciprocal (2 ulp): far inside the 1.5e-7
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    tail = 0.5 * poly * tl.exp(-a * a)  # Φ(−|x|)
    return v * tl.where(v >= 0, 1.0 - tail, tail)


@triton.jit
def _activate(v, ACTIVATION: tl.constexpr):
    """The activation on an fp32 tile; "gelu" is the erf form of ``torch.nn.GELU()``."""
    if ACTIVATION == "gelu":
        return _gelu(v)
    elif ACTIVATION == "relu":
        return tl.maximum(v, 0.0)
    elif ACTIVATION == "silu":
        return v * tl.sigmoid(v)
    else:
        return v


@triton.jit
def _stats_init(x, rows, stride_xm, NORM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The norm prologue's running row sums, (shift, Σ(x − shift), Σ(x − shift)²) per row, fp32.
    LayerNorm shifts by the row's first element: the variance as a difference of sums then
    loses only what |x₀ − mean| / std costs, not |mean| / std (a residual stream's mean can be
    many standard deviations); RMSNorm needs Σx² only (shift 0)."""
    zero = tl.zeros((BLOCK_M,), tl.float32)
    if NORM == "layernorm":
        return tl.load(x + rows * stride_xm).to(tl.float32), zero, zero
    return zero, zero, zero


@triton.jit
def _stats_add(shift, s1, s2, a, k_ok, NORM: tl.constexpr):
    """The running sums plus the ``[BM, BK]`` x tile ``a`` (its columns valid where ``k_ok``;
    masked columns arrive as zeros, which RMSNorm's Σx² may keep). The kernels load ``a`` for
    this alone, not reuse the tile they feed the dot: summed from that tile, some rows came out
    wrong on sm_90 (triton 3.6; docs/benchmarks.md, earlier experiments), never with a load of their own."""
    if NORM == "rmsnorm":
        v = a.to(tl.float32)
        s2 += tl.sum(v * v, 1)
    elif NORM == "layernorm":
        v = tl.where(k_ok[None, :], a.to(tl.float32) - shift[:, None], 0.0)
        s1 += tl.sum(v, 1)
        s2 += tl.sum(v * v, 1)
    return shift, s1, s2


@triton.jit
def _normalise(acc, shift, s1, s2, sums, cols, K, eps, NORM: tl.constexpr):
    """x·Wᵀ (fp32, raw rows of x) → norm₁(x)·Wᵀ: RMSNorm scales each row by 1/rms(x);
    LayerNorm by 1/std(x) after taking mean(x)·Σₖ W[n, k] (``sums`` at ``cols``) away."""
    if NORM == "rmsnorm":
        acc = acc * tl.rsqrt(s2 / K + eps)[:, None]
    elif NORM == "layernorm":
        m1 = s1 / K  # mean − shift
        rstd = tl.rsqrt(tl.maximum(s2 / K - m1 * m1, 0.0) + eps)
        w_sums = tl.load(sums + cols).to(tl.float32)
        acc = (acc - (shift + m1)[:, None] * w_sums[None, :]) * rstd[:, None]
    return acc


@triton.jit
def _linear_kernel(
    x,
    w,
    b,
    r,
    y,
    sums,  # x [M, K], w [N, K], b [N], r [M, N], y [M, N]; sums [N] fp32 (Σₖ w, LayerNorm only)
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_rm,
    stride_ym,
    M_BUCKET,  # the autotuner's key for M; unused by the code
    eps,
    ACTIVATION: tl.constexpr,  # "none" | "gelu" | "relu" | "silu"
    NORM: tl.constexpr,  # "none" | "rmsnorm" | "layernorm": x's rows normalised (unit affine) first
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" for fp32 operands (torch's default), else "tf32"
    UPCAST: tl.constexpr,  # interpreter only: its tl.dot misreads bf16 operands, so feed it fp32
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask in the K loop
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # FLOPs: 2·M·N·K. Fewest bytes: read M·K + N·K (+ N bias, + M·N residual), write M·N elements;
    # each program re-reads its K-panels of x and W (L2 absorbs most of it thanks to GROUP_M).
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M tile rows sweep the N tiles together, so the W panels they share
    # are still in L2 (Triton matmul tutorial).
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows

    # Rows/columns past M/N wrap around (% M) instead of being masked: the loads stay unmasked
    # and in bounds, and the extra results are dropped by the masked store.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # [BM]
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # [BN]
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    x_ptrs = x + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk  # [BM, BK]
    w_ptrs = w + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn  # [BK, BN]: a tile of Wᵀ

    if HAS_BIAS:
        bias = tl.load(b + offs_n).to(tl.float32)  # [BN], issued before the K loop to hide its latency
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    shift, s1, s2 = _stats_init(x, offs_m, stride_xm, NORM, BLOCK_M)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            bt = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            bt = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if NORM != "none":  # the row sums from a load of their own (see _stats_add)
            xs = tl.load(x_ptrs, mask=(k * BLOCK_K + offs_k < K)[None, :], other=0.0, cache_modifier=".cg")
            shift, s1, s2 = _stats_add(shift, s1, s2, xs, k * BLOCK_K + offs_k < K, NORM)
        if UPCAST:
            a = a.to(tl.float32)
            bt = bt.to(tl.float32)
        acc = tl.dot(a, bt, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    # Epilogue on the fp32 accumulator: the norm's row scale (and mean), + bias, activation,
    # + residual, one rounding.
    acc = _normalise(acc, shift, s1, s2, sums, offs_n, K, eps, NORM)
    if HAS_BIAS:
        acc += bias[None, :]
    acc = _activate(acc, ACTIVATION)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(r + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y + rows[:, None] * stride_ym + cols[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _linear_tma_kernel(
    x,
    w,
    b,
    r,
    y,
    sums,  # x [M, K], w [N, K], b [N], r [M, N], y [M, N]: rows unit-stride, 16-B aligned; sums [N] fp32
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_ym,
    M_BUCKET,  # the autotuner's key for M; unused by the code
    eps,
    ACTIVATION: tl.constexpr,
    NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr = False,
    WARP_SPECIALIZE: tl.constexpr = False,
    PERSISTENT: tl.constexpr = True,  # read by the launch grid only (≤ one program per SM, or one per tile)
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # The same math as _linear_kernel. Persistent: the grid is at most one program per SM, and
    # each walks output tiles tl.num_programs(0) apart in the grouped order. Every tile moves by
    # tensor descriptor: loads past M, N or K arrive as zeros and stores past M, N are dropped,
    # so neither the K loop nor the epilogue needs a mask (the bias, a pointer load, does).
    x_desc = tl.make_tensor_descriptor(x, [M, K], [stride_xm, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
    y_desc = tl.make_tensor_descriptor(y, [M, N], [stride_ym, 1], [BLOCK_M, BLOCK_N])
    if HAS_RESIDUAL:
        r_desc = tl.make_tensor_descriptor(r, [M, N], [stride_rm, 1], [BLOCK_M, BLOCK_N])
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(
        tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE
    ):
        group = tile // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % (GROUP_M * tiles_n)) % group_rows
        pid_n = (tile % (GROUP_M * tiles_n)) // group_rows
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rows = (row0 + tl.arange(0, BLOCK_M)) % M  # in bounds for the shift's pointer load
        shift, s1, s2 = _stats_init(x, rows, stride_xm, NORM, BLOCK_M)
        for k in range(k_steps):
            a = x_desc.load([row0, k * BLOCK_K])  # [BM, BK]
            wt = w_desc.load([col0, k * BLOCK_K])  # [BN, BK]: rows of W, fed to the dot transposed
            if NORM != "none":  # the row sums from a pointer load of their own (see _stats_add)
                kk = k * BLOCK_K + tl.arange(0, BLOCK_K)
                xs = tl.load(x + rows[:, None] * stride_xm + kk[None, :], mask=(kk < K)[None, :], other=0.0)
                shift, s1, s2 = _stats_add(shift, s1, s2, xs, kk < K, NORM)
            if UPCAST:
                a = a.to(tl.float32)
                wt = wt.to(tl.float32)
            acc = tl.dot(a, wt.T, acc, input_precision=PRECISION)
        cols = col0 + tl.arange(0, BLOCK_N)
        acc = _normalise(acc, shift, s1, s2, sums, cols % N, K, eps, NORM)
        if HAS_BIAS:
            acc += tl.load(b + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        acc = _activate(acc, ACTIVATION)
        if HAS_RESIDUAL:
            acc += r_desc.load([row0, col0]).to(tl.float32)
        y_desc.store([row0, col0], acc.to(y.dtype.element_ty))


@triton.jit
def _epilogue_kernel(
    y,
    r,  # y [M, N] in place (cuBLAS's x Wᵀ + b), r [M, N]; unit stride along N
    M,
    N,
    stride_ym,
    stride_rm,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # The fused kernel's epilogue as a pass of its own, after cuBLAS's matmul: activation in
    # fp32, + residual, one rounding, written back in place.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    ptrs = y + rows[:, None] * stride_ym + cols[None, :]
    v = _activate(tl.load(ptrs, mask=mask, other=0.0).to(tl.float32), ACTIVATION)
    if HAS_RESIDUAL:
        v += tl.load(r + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, v.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _epilogue_flat_kernel(
    y,
    r,  # y and r contiguous [M, N], walked as one run of M·N elements
    numel,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # The same pass where rows are contiguous: no row stride to prove aligned, so the loads are
    # vectors whatever N is (a 2-D tile over N = 200 or 800 rows loads element by element).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    v = _activate(tl.load(y + offs, mask=mask, other=0.0).to(tl.float32), ACTIVATION)
    if HAS_RESIDUAL:
        v += tl.load(r + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + offs, v.to(y.dtype.element_ty), mask=mask)


_EPILOGUE_ELEMENTS = 4096  # per program of the 2-D pass: [BLOCK_M, BLOCK_N], BLOCK_N up to 256 columns
_EPILOGUE_FLAT_BLOCK = 1024  # per program of the flat pass: 8 elements a thread at 4 warps


def _cublas_route(
    x2: Tensor, weight: Tensor, bias: Tensor | None, r2: Tensor | None, y2: Tensor, activation: str | None
) -> None:
    """``y2 = act(x2 Wᵀ + bias) + r2`` as cuBLAS's matmul (bias in its epilogue, as ``F.linear``
    does; ReLU too where there is a bias: cuBLASLt's bias + ReLU epilogue) and, for what is left
    (GELU, SiLU, a residual), an epilogue pass over y2 in place: flat over M·N elements where
    y2 and r2 are contiguous, else 2-D tiles that follow r2's row stride. Rounds once more than
    the fused kernel (before the epilogue pass), as ``F.linear`` + ``F.gelu`` does. The epilogue
    pass is launched with ``after_library``: PDL only in an early-trigger scope."""
    if activation == "relu" and bias is not None:  # cuBLASLt's bias + ReLU epilogue
        torch._addmm_activation(bias, x2, weight.t(), use_gelu=False, out=y2)
        activation = None
    elif bias is not None:
        torch.addmm(bias, x2, weight.t(), out=y2)
    else:
        torch.mm(x2, weight.t(), out=y2)
    if activation is None and r2 is None:
        return
    M, N = y2.shape
    if y2.is_contiguous() and (r2 is None or r2.is_contiguous()):
        _epilogue_flat_kernel[(triton.cdiv(M * N, _EPILOGUE_FLAT_BLOCK),)](
            y2,
            y2 if r2 is None else r2,
            M * N,
            ACTIVATION=activation or "none",
            HAS_RESIDUAL=r2 is not None,
            BLOCK=_EPILOGUE_FLAT_BLOCK,
            num_warps=4,
            **after_library(y2),  # after cuBLAS: PDL only in a pdl_early scope
        )
        return
    block_n = min(256, triton.next_power_of_2(N))
    block_m = _EPILOGUE_ELEMENTS // block_n
    _epilogue_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        y2,
        y2 if r2 is None else r2,
        M,
        N,
        y2.stride(0),
        0 if r2 is None else r2.stride(0),
        ACTIVATION=activation or "none",
        HAS_RESIDUAL=r2 is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=4,
        **after_library(y2),
    )


_even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
_fixed_kernel = _even_k(_linear_kernel)  # launched with an explicit config
_TRITON_CONFIGS = {
    c: triton.Config(
        dict(
            BLOCK_M=c.block_m,
            BLOCK_N=c.block_n,
            BLOCK_K=c.block_k,
            GROUP_M=c.group_m,
            **(dict(FLATTEN=c.flatten, WARP_SPECIALIZE=c.warp_specialize, PERSISTENT=c.persistent) if c.tma else {}),
        ),
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )
    for c in _configs.ALL
}
_POINTER_CONFIGS = [t for c, t in _TRITON_CONFIGS.items() if not c.tma]
_TMA_CONFIGS = [t for c, t in _TRITON_CONFIGS.items() if c.tma]
_USE_TMA: bool | None = None  # set_tma's choice; None: configs.prefers_tma
_ROUTE: str | None = None  # set_route's choice; None: configs.prefers_cublas
_last_route: list[str] = []  # the route of the latest call without an explicit config
_last_tuner: list = []  # the tuner of the latest autotuned call, for last_tuned_config


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The tuner's candidates for this call: ``configs.candidates`` for the device, M bucket and dtype."""
    x = named_args["x"]
    picked = _configs.candidates(
        torch.cuda.get_device_capability(x.device),
        named_args["M_BUCKET"],
        named_args["K"],
        x.element_size(),
        tma="stride_xk" not in named_args,
    )
    return [_TRITON_CONFIGS[c] for c in picked]


def _bench(fn: Callable[[], object], quantiles: Sequence[float]) -> list[float]:
    """The tuner's timing of one candidate (ms at ``quantiles``), by CUDA-graph replay.

    ``triton.testing.do_bench`` records its events around each Python launch, so host time swamps
    the few-microsecond kernels of small NAS shapes and it picks the wrong tiling. A graph of
    _AUTOTUNE_CALLS launches leaves only device time between the events.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(_AUTOTUNE_CALLS):
                fn()
        graph.replay()  # warm-up
        samples = []
        for _ in range(_AUTOTUNE_REPLAYS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / _AUTOTUNE_CALLS)
    torch.cuda.current_stream().wait_stream(stream)
    return torch.tensor(samples).quantile(torch.tensor(list(quantiles))).tolist()


_tuned_kernel = autotune(
    configs=_POINTER_CONFIGS,
    key=["M_BUCKET", "N", "K", "NORM"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_bench,
)(_fixed_kernel)
_tuned_tma_kernel = autotune(
    configs=_TMA_CONFIGS,
    key=["M_BUCKET", "N", "K", "NORM"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=_bench,
)(_linear_tma_kernel)


def set_tma(use: bool | None) -> None:
    """For every later call of this process without an explicit config: True runs the persistent
    TMA kernel, False the pointer kernel, None (the default) lets ``configs.prefers_tma`` pick per
    shape. The TMA kernel needs sm_90+ and operands a descriptor can address; otherwise the
    pointer kernel runs. The app calls it once at start (its ``NAS_LINEAR_TMA`` setting)."""
    global _USE_TMA
    _USE_TMA = use


ROUTES = ("triton", "cublas")


def set_route(route: str | None) -> None:
    """For every later call of this process without an explicit config: "triton" runs the fused
    kernel, "cublas" cuBLAS's matmul then the epilogue kernel, None (the default) lets
    ``configs.prefers_cublas`` pick per shape. Under ``TRITON_INTERPRET=1`` the default is the
    fused kernel; tests force "cublas" to check that route on the CPU (torch's matmul there)."""
    if route not in (None, *ROUTES):
        raise ValueError(f"set_route: route must be None or one of {ROUTES}, got {route!r}")
    global _ROUTE
    _ROUTE = route


def last_route() -> str | None:
    """The route ("triton" or "cublas") of the latest call without an explicit config."""
    return _last_route[-1] if _last_route else None


def _shares_memory(a: Tensor | None, b: Tensor) -> bool:
    return a is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def last_tuned_config() -> LinearConfig | None:
    """The tiling the tuner chose for the latest autotuned call (None before the first). Matched by
    content, not identity: on a disk-cache hit Triton rebuilds the chosen ``Config`` from JSON."""
    chosen = getattr(_last_tuner[-1], "best_config", None) if _last_tuner else None
    if chosen is None:
        return None
    same = (chosen.kwargs, chosen.num_warps, chosen.num_stages)
    return next((c for c, t in _TRITON_CONFIGS.items() if (t.kwargs, t.num_warps, t.num_stages) == same), None)


def _tma_addressable(*tensors: Tensor | None) -> bool:
    """Whether the TMA kernel can read/write these ``[rows, n]`` tensors: 16-B aligned bases and
    row strides, unit stride along n (tensor-descriptor rules)."""
    return all(
        t is None or (t.data_ptr() % ALIGN == 0 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % ALIGN == 0)
        for t in tensors
    )


_INTERPRETER_SMS = 10**9  # the interpreter's "SM count" for the persistent grid: one program per tile


def tma_programs(M: int, N: int, block_m: int, block_n: int, persistent: bool, sms: int) -> int:
    """The TMA kernel's grid: one program per output tile, capped at one per SM when persistent
    (each then walks tiles ``sms`` apart)."""
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    return min(sms, tiles) if persistent else tiles


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    norm: str | None = None,
    norm_eps: float = NORM_EPS,
    weight_sums: Tensor | None = None,
    out: Tensor | None = None,
    config: LinearConfig | None = None,
) -> Tensor:
    """``act(norm₁(x) Wᵀ + bias) + residual`` in one launch, fp32 accumulation, output in x's dtype.

    x: ``[M, K]`` or ``[*, K]`` (leading dims flattened), bf16 / fp16 / fp32 (fp32 is the exact,
    slower fallback: full-precision dot, no tf32). weight: ``[N, K]`` (``nn.Linear`` layout), x's
    dtype. bias: ``[N]`` or None. activation: None | "gelu" (erf, as ``nn.GELU()``) | "relu" |
    "silu". residual: ``[*, N]`` like the output, or None. norm: None | "rmsnorm" | "layernorm":
    x's rows normalised over K first, unit affine (the norm's scale and shift belong in weight
    and bias: ``reference.fold_norm``), ``norm_eps`` inside the square root; the fused kernel sums
    the row statistics in its main loop (from a load of its own) where ``configs.fuses_norm`` says
    so, the route is forced to "triton" or a config is given; elsewhere the norm kernel runs first,
    then the route. weight_sums: ``[N]`` fp32 Σₖ weight[n, k] (``reference.weight_sums``), which
    LayerNorm's fused kernel reads (norm "layernorm" only); None: computed here, a launch per call. out:
    ``[*, N]`` in x's dtype to write into (contiguous), or None. config: a fixed tiling of the
    fused kernel instead of the route and tiling chosen per shape (module docstring). Returns
    ``[*, N]``. CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if norm not in NORMS:
        raise ValueError(f"linear: norm must be one of {NORMS}, got {norm!r}")

    if x.dim() < 1 or weight.dim() != 2:
        raise ValueError(f"linear: x must be [*, K] and weight [N, K], got {list(x.shape)} and {list(weight.shape)}")
    check_runnable("linear", x)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"linear: x's last dim must equal weight's K = {K}, got x {list(x.shape)}")
    lead = tuple(x.shape[:-1])
    x2 = as_rows(x, K)
    M = x2.shape[0]
    operands = (("x", x2, (M, K)), ("weight", weight, (N, K)), ("bias", bias, (N,)), ("residual", residual, (*lead, N)))
    check_operands("linear", x.device, *operands)
    for name, t, _ in operands:
        if t is not None:
            check_int32("linear", name, t)
    if weight.dtype != x.dtype:
        raise ValueError(f"linear: weight.dtype must equal x.dtype ({x.dtype}), got {weight.dtype}")
    if bias is not None:
        bias = bias.contiguous()
    if weight_sums is not None:
        if norm != "layernorm":
            raise ValueError(f"linear: weight_sums is read only with norm='layernorm', got norm={norm!r}")
        if weight_sums.shape != (N,) or weight_sums.dtype != torch.float32 or weight_sums.device != x.device:
            raise ValueError(
                f"linear: weight_sums must be fp32 [{N}] on {x.device}, got {weight_sums.dtype} "
                f"{list(weight_sums.shape)} on {weight_sums.device}"
            )
        weight_sums = weight_sums.contiguous()
    r2 = None if residual is None else as_rows(residual, N)
    if out is not None:
        check_int32("linear", "out", out)
    out = output_buffer("linear", out, (*lead, N), x)
    y2 = out.view(-1, N)
    if M == 0 or N == 0:
        return out

    if config is None:
        if _ROUTE is not None:
            route = _ROUTE
        elif INTERPRETED or x.dtype == torch.float32:
            route = "triton"
        else:
            route = (
                "cublas"
                if _configs.prefers_cublas(
                    torch.cuda.get_device_capability(x.device),
                    _configs.m_bucket(M),
                    N,
                    K,
                    activation,
                    r2 is not None,
                    bias is not None,
                    norm=norm is not None,
                )
                else "triton"
            )
        if _shares_memory(r2, y2):  # out is the residual: the matmul would overwrite it before the add
            route = "triton"
        _last_route[:] = [route]
        if norm is not None and (
            route == "cublas" or (_ROUTE is None and not _configs.fuses_norm(_configs.m_bucket(M), K))
        ):
            # the norm as a launch of its own (unit affine), before cuBLAS or the plain fused kernel
            x2 = rms_norm(x2, None, norm_eps) if norm == "rmsnorm" else layer_norm(x2, None, None, norm_eps)
            norm = None
        if route == "cublas":
            _cublas_route(x2, weight, bias, r2, y2, activation)
            return out
    args = (
        x2,
        weight,
        bias,
        r2,
        y2,
        None,  # sums: set below where LayerNorm's fused kernel reads them
        M,
        N,
        K,
        x2.stride(0),
        x2.stride(1),
        weight.stride(0),
        weight.stride(1),
        0 if r2 is None else r2.stride(0),
        y2.stride(0),
        _configs.m_bucket(M),
        float(norm_eps),
    )
    meta = dict(
        ACTIVATION=activation or "none",
        NORM=norm or "none",
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=r2 is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED,
        **pdl(x),
    )

    def grid(meta_: dict) -> tuple[int]:
        return (triton.cdiv(M, meta_["BLOCK_M"]) * triton.cdiv(N, meta_["BLOCK_N"]),)

    if norm == "layernorm":
        sums = weight_sums if weight_sums is not None else weight.float().sum(1)
        args = (*args[:5], sums, *args[6:])
    if config is None and INTERPRETED:
        config = (
            _configs.INTERPRETER_TMA if _USE_TMA else _configs.INTERPRETER
        )  # timing interpreted candidates would measure numpy
    if config is not None:
        tma = config.tma
    else:
        capability = torch.cuda.get_device_capability(x.device)
        tma = capability >= (9, 0) and (
            _USE_TMA if _USE_TMA is not None else _configs.prefers_tma(capability, _configs.m_bucket(M), K)
        )
    if tma and _tma_addressable(x2, weight, r2, y2):
        use_torch_allocator()  # descriptors need launch-time scratch
        sms = _INTERPRETER_SMS if INTERPRETED else sm_count(x.device)
        tma_args = (
            x2,
            weight,
            bias,
            r2,
            y2,
            args[5],
            M,
            N,
            K,
            x2.stride(0),
            weight.stride(0),
            0 if r2 is None else r2.stride(0),
            y2.stride(0),
            _configs.m_bucket(M),
            float(norm_eps),
        )

        def tma_grid(meta_: dict) -> tuple[int]:
            return (tma_programs(M, N, meta_["BLOCK_M"], meta_["BLOCK_N"], meta_.get("PERSISTENT", True), sms),)

        if config is None:
            _last_tuner[:] = [_tuned_tma_kernel]
            _tuned_tma_kernel[tma_grid](*tma_args, **meta)
        else:
            _linear_tma_kernel[tma_grid](
                *tma_args,
                **meta,
                BLOCK_M=config.block_m,
                BLOCK_N=config.block_n,
                BLOCK_K=config.block_k,
                GROUP_M=config.group_m,
                FLATTEN=config.flatten,
                WARP_SPECIALIZE=config.warp_specialize,
                PERSISTENT=config.persistent,
                num_warps=config.num_warps,
                num_stages=config.num_stages,
            )
        return out
    if config is not None and config.tma:  # operands a descriptor cannot address: the pointer kernel's tiling
        config = dataclasses.replace(config, tma=False, flatten=False, warp_specialize=False, persistent=True)
    if config is None:
        _last_tuner[:] = [_tuned_kernel]
        _tuned_kernel[grid](*args, **meta)
    else:
        _fixed_kernel[grid](
            *args,
            **meta,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            GROUP_M=config.group_m,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out
