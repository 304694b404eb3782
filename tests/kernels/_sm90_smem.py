"""Compile the TMA linear kernel's Hopper tilings for sm_90 without a GPU, without and with the
LayerNorm prologue (the heavier of the two norms), and print, as JSON, the shared memory Triton
reports next to ``LinearConfig.smem_bytes`` (run by test_linear.py in a process without
TRITON_INTERPRET: the interpreter's kernels cannot be compiled)."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.linear import configs
from kernels.linear.triton import _linear_tma_kernel as kernel

TYPES = {
    **dict.fromkeys(("x", "w", "b", "r", "y"), "*bf16"),
    "sums": "*fp32",
    "eps": "fp32",
    **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_wn", "stride_rm", "stride_ym", "M_BUCKET"), "i32"),
}

rows = []
for c, norm in ((c, n) for c in configs.HOPPER_TMA for n in ("none", "layernorm")):
    const = dict(
        ACTIVATION="gelu",
        NORM=norm,
        HAS_BIAS=True,
        HAS_RESIDUAL=True,
        PRECISION="tf32",
        UPCAST=False,
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        GROUP_M=c.group_m,
        FLATTEN=c.flatten,
        WARP_SPECIALIZE=c.warp_specialize,
        PERSISTENT=c.persistent,
        PDL=2,  # as launched on sm_90 in a small step: the wait and the early trigger (kernels._common.pdl)
    )
    src = ASTSource(
        kernel,
        {**TYPES, **dict.fromkeys(const, "constexpr")},
        {(kernel.arg_names.index(k),): v for k, v in const.items()},
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=c.num_warps, num_stages=c.num_stages)
    )
    rows.append({"config": repr(c), "norm": norm, "shared": compiled.metadata.shared, "estimate": c.smem_bytes(2)})
print(json.dumps(rows))
