"""Short causal depthwise convolution over time, channels-last, as the model's qkv conv.

``y[b, t, c] = bias[c] + Σ_{j<K} weight[c, j] · x[b, t − (K−1) + j, c]`` with x = 0 before t = 0:
``nn.Conv1d(C, C, K, groups=C, padding=K−1)`` sliced to its first T outputs, computed directly
on ``[B, T, C]`` (the layout the qkv projection writes), so no transposes or padded copies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import INT32_MAX, INTERPRETED, check_operands, check_runnable, output_buffer, pdl
from kernels._pdl import enter
from kernels.conv.configs import ConvConfig, conv_config

__all__ = ["causal_depthwise_conv"]


@triton.jit
def _causal_conv_kernel(
    x,
    w,
    b,
    y,  # x, y [B, T, C]; w [C, K] contiguous; b [C]
    T,
    C,
    stride_xb,
    stride_xt,
    stride_yb,
    stride_yt,
    KERNEL: tl.constexpr,  # K, the filter length
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    # Reads B·T·C elements once from HBM (the K − 1 halo rows and the K shifted re-reads of a
    # tile come from L1/L2) plus C·K weights, writes B·T·C; FLOPs 2·K·B·T·C.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    batch = tl.program_id(2).to(tl.int64)
    c_ok = c < C
    x_base = x + batch * stride_xb
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(KERNEL):
        src = t - (KERNEL - 1) + j  # [BT]: the input step tap j reads; < 0 is the causal zero padding
        mask = ((src >= 0) & (src < T))[:, None] & c_ok[None, :]
        xv = tl.load(x_base + src[:, None] * stride_xt + c[None, :], mask=mask, other=0.0).to(tl.float32)
        wv = tl.load(w + c * KERNEL + j, mask=c_ok, other=0.0).to(tl.float32)  # [BC]
        acc += xv * wv[None, :]
    if HAS_BIAS:
        acc += tl.load(b + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    out_mask = (t < T)[:, None] & c_ok[None, :]
    tl.store(y + batch * stride_yb + t[:, None] * stride_yt + c[None, :], acc.to(y.dtype.element_ty), mask=out_mask)


def causal_depthwise_conv(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    out: Tensor | None = None,
    config: ConvConfig | None = None,
) -> Tensor:
    """Causal depthwise convolution over time, fp32 accumulation, output in x's dtype.

    x: ``[B, T, C]`` bf16 / fp16 / fp32 with unit stride along C. weight: ``[C, K]`` (an
    ``nn.Conv1d(C, C, K, groups=C)`` weight ``[C, 1, K]`` squeezed). bias: ``[C]`` or None.
    out: a contiguous ``[B, T, C]`` buffer in x's dtype, or None. Returns ``[B, T, C]``.
    """
    if x.dim() != 3 or weight.dim() != 2:
        raise ValueError(
            f"causal_depthwise_conv: x must be [B, T, C] and weight [C, K], "
            f"got {list(x.shape)} and {list(weight.shape)}"
        )
    B, T, C = x.shape
    K = weight.shape[1]
    check_runnable("causal_depthwise_conv", x)
    check_operands(
        "causal_depthwise_conv", x.device, ("x", x, (B, T, C)), ("weight", weight, (C, K)), ("bias", bias, (C,))
    )
    if K < 1:
        raise ValueError(f"causal_depthwise_conv: the filter length K must be >= 1, got {K}")
    if T * x.stride(1) > INT32_MAX or x.numel() > INT32_MAX:
        raise ValueError(f"causal_depthwise_conv: x of shape {list(x.shape)} is too large for int32 offsets")
    if x.stride(2) != 1:
        x = x.contiguous()
    out = output_buffer("causal_depthwise_conv", out, (B, T, C), x)
    if out.numel() == 0:
        return out
    if config is None:
        config = conv_config(None if INTERPRETED else torch.cuda.get_device_capability(x.device))
    grid = (triton.cdiv(T, config.block_t), triton.cdiv(C, config.block_c), B)
    _causal_conv_kernel[grid](
        x,
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        out,
        T,
        C,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        KERNEL=K,
        HAS_BIAS=bias is not None,
        BLOCK_T=config.block_t,
        BLOCK_C=config.block_c,
        num_warps=config.num_warps,
        **pdl(x),
    )
    return out
