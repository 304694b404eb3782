"""Optimizer steps: ``reference`` holds the per-tensor math (fp32 torch) that every path matches.

``kernels.optim.triton`` holds the fused multi-tensor kernels and ``configs`` their launch
configs; import ``triton`` explicitly (it is not re-exported here): importing it decorates the
kernels, which in tests must happen after TRITON_INTERPRET is set.
"""

from kernels.optim.reference import (
    adamw_step_,
    clip_scale,
    compute_dtype,
    effective_grad,
    global_grad_norm,
    grad_noise_std,
    lion_step_,
    radam_step_,
    sgd_step_,
)

__all__ = [
    "compute_dtype",
    "global_grad_norm",
    "clip_scale",
    "grad_noise_std",
    "effective_grad",
    "sgd_step_",
    "adamw_step_",
    "radam_step_",
    "lion_step_",
]
