"""One decode step of the short causal depthwise convolution: the newest token against the K − 1
inputs before it, kept in a rolling state.

``y[b, c] = bias[c] + Σ_{j<K−1} weight[c, j] · state[b, j, c] + weight[c, K−1] · x[b, c]``, then
the state drops its oldest row and appends x. One launch, grid B × C/BLOCK_C: each program owns
BLOCK_C channels of one sequence, so it reads every state row it rewrites before it writes any
(the shift is in place with no race). Per channel: reads K − 1 state values, x, K weights and the
bias; writes y and K − 1 state values; 2·K FLOPs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import check_operands, check_runnable, pdl
from kernels._pdl import enter
from kernels.conv.configs import INTERPRETER_STEP_BLOCK_C, STEP_BLOCK_C, STEP_NUM_WARPS
from kernels.device import is_cuda

__all__ = ["causal_conv_step"]

MAX_KERNEL = 16  # the state rows live in one [16, BLOCK_C] tile at most: the longest short conv a space may hold


@triton.jit
def _conv_step_kernel(
    X,  # [B, C], unit stride on C
    S,  # state [B, K − 1, C] contiguous, shifted in place
    W,  # [C, K] contiguous
    BIAS,  # [C]
    Y,  # [B, C] contiguous
    C,
    stride_xb,
    KERNEL: tl.constexpr,
    ROWS: tl.constexpr,  # K − 1 rounded up to a power of two (≥ 1)
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):
    enter(PDL)  # programmatic dependent launch: first (kernels/_pdl.py)
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    c_ok = c < C
    j = tl.arange(0, ROWS)  # [ROWS]: state row j holds x_{t−K+1+j}
    rows_ok = (j < KERNEL - 1)[:, None] & c_ok[None, :]
    s_base = S + b * (KERNEL - 1) * C
    state = tl.load(s_base + j[:, None] * C + c[None, :], mask=rows_ok, other=0.0)  # [ROWS, BC]
    x = tl.load(X + b * stride_xb + c, mask=c_ok, other=0.0)
    w_state = tl.load(W + c[None, :] * KERNEL + j[:, None], mask=rows_ok, other=0.0).to(tl.float32)
    w_last = tl.load(W + c * KERNEL + KERNEL - 1, mask=c_ok, other=0.0).to(tl.float32)
    y = tl.sum(state.to(tl.float32) * w_state, 0) + x.to(tl.float32) * w_last
    y += tl.load(BIAS + c, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(Y + b * C + c, y.to(Y.dtype.element_ty), mask=c_ok)
    if KERNEL > 1:
        # Shift: row j takes row j + 1 (read above, before any store), the last row takes x.
        shifted = tl.load(s_base + (j[:, None] + 1) * C + c[None, :], mask=(j < KERNEL - 2)[:, None] & c_ok[None, :])
        tl.store(s_base + j[:, None] * C + c[None, :], shifted, mask=(j < KERNEL - 2)[:, None] & c_ok[None, :])
        tl.store(s_base + (KERNEL - 2) * C + c, x.to(S.dtype.element_ty), mask=c_ok)


def causal_conv_step(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """One token of the causal depthwise convolution; shifts ``state`` in place; one launch.

    x: ``[B, C]`` bf16/fp16/fp32, unit stride on C. state: ``[B, K − 1, C]`` contiguous of x's
    dtype, the previous K − 1 inputs, oldest first (zeros before the sequence start). weight:
    ``[C, K]``, 1 ≤ K ≤ MAX_KERNEL (16). bias: ``[C]``. Returns y ``[B, C]`` in x's dtype, equal to the last
    output of ``kernels.conv.reference.causal_depthwise_conv`` over the sequence.
    """
    if x.dim() != 2 or weight.dim() != 2 or state.dim() != 3:
        raise ValueError(
            "causal_conv_step: x must be [B, C], state [B, K − 1, C] and weight [C, K], "
            f"got {list(x.shape)}, {list(state.shape)} and {list(weight.shape)}"
        )
    B, C = x.shape
    K = weight.shape[1]
    if not 1 <= K <= MAX_KERNEL:
        raise ValueError(f"causal_conv_step: the filter length K must be in 1..{MAX_KERNEL}, got {K}")
    check_runnable("causal_conv_step", x)
    check_operands(
        "causal_conv_step",
        x.device,
        ("x", x, (B, C)),
        ("state", state, (B, K - 1, C)),
        ("weight", weight, (C, K)),
        ("bias", bias, (C,)),
    )
    if state.dtype != x.dtype or not state.is_contiguous():
        raise ValueError(f"causal_conv_step: state must be contiguous {x.dtype}, got {state.dtype} {state.stride()}")
    if x.stride(1) != 1:
        raise ValueError(f"causal_conv_step: x needs unit stride on C, got strides {x.stride()}")
    y = torch.empty(B, C, device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    block_c = STEP_BLOCK_C if is_cuda(x.device) else INTERPRETER_STEP_BLOCK_C
    _conv_step_kernel[(B, triton.cdiv(C, block_c))](
        x,
        state,
        weight.contiguous(),
        bias.contiguous(),
        y,
        C,
        x.stride(0),
        KERNEL=K,
        ROWS=max(1, triton.next_power_of_2(K - 1)),
        BLOCK_C=block_c,
        num_warps=STEP_NUM_WARPS,
        **pdl(x),
    )
    return y
