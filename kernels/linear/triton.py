"""Fused linear layer: ``y = act(x Wᵀ + b) + residual`` in one launch.

The matmul accumulates in fp32 on the tensor cores; bias, activation and residual are applied
to the fp32 accumulator before the single rounding to the output dtype, so the epilogue adds
no pass over memory: against cuBLAS ``F.linear`` followed by ``F.gelu`` it saves reading and
writing ``y`` once more (2·M·N elements) and one launch.

Tiles are autotuned per (M bucket, N, K) from ``configs.candidates`` (a handful at most, one
when M is small), so a new shape costs a few short timings, once per process. Call the kernel
once outside CUDA-graph capture before capturing it: tuning launches and synchronizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._autotune import autotune
from kernels.linear import configs as _configs
from kernels.linear.configs import LinearConfig

__all__ = ["ACTIVATIONS", "DTYPES", "linear", "last_tuned_config"]

ACTIVATIONS = (None, "gelu", "relu", "silu")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INTERPRETED = triton.knobs.runtime.interpret  # read when the kernels below are decorated, as Triton does
_INT32_MAX = 2**31 - 1  # offsets are int32 products: every tensor must index below this
_AUTOTUNE_CALLS, _AUTOTUNE_REPLAYS = 20, 10  # per candidate: ~7 ms at the largest NAS shape


@triton.jit
def _activate(v, ACTIVATION: tl.constexpr):
    """The activation on an fp32 tile; "gelu" is the erf form of ``torch.nn.GELU()``."""
    if ACTIVATION == "gelu":
        return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    elif ACTIVATION == "relu":
        return tl.maximum(v, 0.0)
    elif ACTIVATION == "silu":
        return v * tl.sigmoid(v)
    else:
        return v


@triton.jit
def _linear_kernel(
    x, w, b, r, y,  # x [M, K], w [N, K], b [N], r [M, N], y [M, N]
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_ym,
    M_BUCKET,  # the autotuner's key for M; unused by the code
    ACTIVATION: tl.constexpr,  # "none" | "gelu" | "relu" | "silu"
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input_precision: "ieee" for fp32 operands (torch's default), else "tf32"
    UPCAST: tl.constexpr,  # interpreter only: its tl.dot misreads bf16 operands, so feed it fp32
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask in the K loop
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
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
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            bt = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            bt = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            bt = bt.to(tl.float32)
        acc = tl.dot(a, bt, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    # Epilogue on the fp32 accumulator: + bias, activation, + residual, one rounding.
    if HAS_BIAS:
        acc += bias[None, :]
    acc = _activate(acc, ACTIVATION)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(r + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y + rows[:, None] * stride_ym + cols[None, :], acc.to(y.dtype.element_ty), mask=mask)


_even_k = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
_fixed_kernel = _even_k(_linear_kernel)  # launched with an explicit config
_TRITON_CONFIGS = {
    c: triton.Config(dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m),
                     num_warps=c.num_warps, num_stages=c.num_stages)
    for c in _configs.ALL
}


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The tuner's candidates for this call: ``configs.candidates`` for the device, M bucket and dtype."""
    x = named_args["x"]
    picked = _configs.candidates(torch.cuda.get_device_capability(x.device), named_args["M_BUCKET"],
                                 named_args["K"], x.element_size())
    return [_TRITON_CONFIGS[c] for c in picked]


def _bench(fn: Callable[[], object], quantiles: Sequence[float]) -> list[float]:
    """The tuner's timing of one candidate (ms at ``quantiles``), by CUDA-graph replay.

    ``triton.testing.do_bench`` records its events around each Python launch (~20 µs of host
    time), which swamps the few-µs kernels of small NAS shapes: on an H200 it picked a tiling
    that ran 11.8 µs over one that ran 5.1. A graph of _AUTOTUNE_CALLS launches leaves only
    device time between the events.
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
    configs=list(_TRITON_CONFIGS.values()), key=["M_BUCKET", "N", "K"], prune_configs_by={"early_config_prune": _prune},
    do_bench=_bench,
)(_fixed_kernel)


def last_tuned_config() -> LinearConfig | None:
    """The tiling the tuner chose for the latest autotuned call (None before the first)."""
    chosen = getattr(_tuned_kernel, "best_config", None)
    return next((c for c, t in _TRITON_CONFIGS.items() if t is chosen), None)


def _check(name: str, t: Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"linear: {name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype not in DTYPES:
        raise ValueError(f"linear: {name}.dtype must be one of {DTYPES}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"linear: {name} is on {t.device}, x on {device}")
    if t.numel() > _INT32_MAX:
        raise ValueError(f"linear: {name} has {t.numel()} elements; the kernel indexes with int32 (< 2**31)")


def _rows(t: Tensor, n: int) -> Tensor:
    """``t`` as ``[rows, n]`` with unit stride along n (a view when it already is)."""
    t = t.reshape(-1, n)
    return t if t.stride(1) == 1 else t.contiguous()


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    out: Tensor | None = None,
    config: LinearConfig | None = None,
) -> Tensor:
    """``act(x Wᵀ + bias) + residual`` in one launch, fp32 accumulation, output in x's dtype.

    x: ``[M, K]`` or ``[*, K]`` (leading dims flattened), bf16 / fp16 / fp32 (fp32 is the exact,
    slower fallback: full-precision dot, no tf32). weight: ``[N, K]`` (``nn.Linear`` layout), x's
    dtype. bias: ``[N]`` or None. activation: None | "gelu" (erf, as ``nn.GELU()``) | "relu" |
    "silu". residual: ``[*, N]`` like the output, or None. out: ``[*, N]`` in x's dtype to write
    into (contiguous), or None. config: a fixed tiling instead of the autotuned one. Returns ``[*, N]``.
    CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if x.dim() < 1 or weight.dim() != 2:
        raise ValueError(f"linear: x must be [*, K] and weight [N, K], got {list(x.shape)} and {list(weight.shape)}")
    if not (x.is_cuda or _INTERPRETED):
        raise ValueError(f"linear: x is on {x.device}; the kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"linear: x's last dim must equal weight's K = {K}, got x {list(x.shape)}")
    lead = tuple(x.shape[:-1])
    x2 = _rows(x, K)
    M = x2.shape[0]
    _check("x", x2, (M, K), x.device)
    _check("weight", weight, (N, K), x.device)
    if weight.dtype != x.dtype:
        raise ValueError(f"linear: weight.dtype must equal x.dtype ({x.dtype}), got {weight.dtype}")
    if bias is not None:
        _check("bias", bias, (N,), x.device)
        bias = bias.contiguous()
    r2 = None
    if residual is not None:
        _check("residual", residual, (*lead, N), x.device)
        r2 = _rows(residual, N)
    if out is None:
        out = torch.empty((*lead, N), dtype=x.dtype, device=x.device)
    else:
        _check("out", out, (*lead, N), x.device)
        if out.dtype != x.dtype or not out.is_contiguous():
            raise ValueError(f"linear: out must be contiguous {x.dtype}, got {out.dtype} with strides {out.stride()}")
    y2 = out.view(-1, N)
    if M == 0 or N == 0:
        return out

    args = (x2, weight, bias, r2, y2, M, N, K, x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
            0 if r2 is None else r2.stride(0), y2.stride(0), _configs.m_bucket(M))
    meta = dict(ACTIVATION=activation or "none", HAS_BIAS=bias is not None, HAS_RESIDUAL=r2 is not None,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST=_INTERPRETED)

    def grid(meta_: dict) -> tuple[int]:
        return (triton.cdiv(M, meta_["BLOCK_M"]) * triton.cdiv(N, meta_["BLOCK_N"]),)

    if config is None and _INTERPRETED:
        config = _configs.INTERPRETER  # timing interpreted candidates would measure numpy
    if config is None:
        _tuned_kernel[grid](*args, **meta)
    else:
        _fixed_kernel[grid](*args, **meta, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                            GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages)
    return out
