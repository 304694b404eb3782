"""Fused optimizer steps: every tensor of a param group updated by ONE Triton launch.

Each function here updates lists of tensors in place with exactly the math of the matching
``kernels.optim.reference`` function (same order of operations, fp32 arithmetic, no FMA
contraction, IEEE division and square root), with the gradient pipeline folded into the same
pass: ``g ← g·clip_scale + noise_std·z``. Shapes: ``params[i]``, ``grads[i]`` and each state
tensor ``[*]_i`` (any shapes, contiguous); params fp32 or bf16, grads of the param's dtype,
state fp32; ``clip_scale`` 0-dim fp32.

Design: a pointer table over the existing tensors, not a flat buffer.
    A flat-buffer design (apex's contiguous params) needs every param, grad and state tensor to
    be a view into one big buffer. The models here allocate params per module and autograd
    allocates ``p.grad``, so flattening would mean copying in and out on every step (more bytes
    than the update itself) or re-pointing the model's params into the buffer (invasive; breaks
    loading and ``.data`` swaps). Instead each launch reads two small int64 tables: one row per
    tensor (addresses of p, g and two state tensors, numel, noise offset) and one entry per
    program (tensor index << 32 | chunk index). Tensors stay ordinary tensors; the tables are
    cached by the addresses, so in steady state a step copies nothing to the device, and the
    look-up costs 56 B per program of ``block`` elements (0.2% of AdamW's 28 B/element at 1024).

    Addresses loaded from memory carry no alignment facts, so when the host has checked every
    tensor starts 16-B aligned the kernel says so (``tl.multiple_of``): that is what makes its
    loads and stores 16-byte vectors. For the same reason full chunks run unmasked; a mask against
    a run-time numel would split the vectors, so only a tensor's last chunk is masked.

Per-step values are run-time arguments, never constexprs: lr, bias corrections, RAdam's
rectification, noise σ and seed, and the clip scale, read in-kernel from its 0-dim device tensor
(no host sync). Constexprs are only what changes the code: the rule, dtypes, SGD's momentum /
Nesterov / coupled decay, clip and noise on/off, alignment and block size. Adam-family tensors
at different step counts (a param that missed some grads) need different bias corrections, so
they go in one launch per distinct step; a group stepped together is one launch.

Every rule streams close to the device-to-device copy bandwidth measured in the same run
(benchmarks/results/optimizers_h200.json).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels._common import INTERPRETED
from kernels.device import is_cuda
from kernels.optim.configs import StepConfig, norm_config, step_config

__all__ = [
    "PARAM_DTYPES",
    "ROW",
    "step_row",
    "supports",
    "grad_norm",
    "sgd_step_",
    "adamw_step_",
    "radam_step_",
    "lion_step_",
]

PARAM_DTYPES = (torch.float32, torch.bfloat16)
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}
# The tensor table: _ROW int64s per tensor, these columns (constexprs: the kernels read them too).
_ROW = tl.constexpr(6)
_P, _G, _STATE1, _STATE2, _NUMEL, _NOISE = (tl.constexpr(i) for i in range(6))
_ALIGN = 16  # bytes: one vector load
# A step row (``step_row``): int32 slots, the _Scalars fields' fp32 bits in field order, then
# noise σ and the Philox seed. Read in-kernel instead of the run-time arguments when a step is
# replayed from a CUDA graph, whose launches keep the arguments they were captured with.
ROW = 16
_NOISE_STD, _SEED = tl.constexpr(13), tl.constexpr(14)


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _chunk(tensors, blocks, BLOCK: tl.constexpr):
    """This program's tensor-table row, element offsets ``[BLOCK]`` (int64), numel, and whether
    the chunk lies wholly inside its tensor (``full``: loads and stores need no mask)."""
    entry = tl.load(blocks + tl.program_id(0))
    row = tensors + (entry >> 32) * _ROW
    start = (entry & 0xFFFFFFFF) * BLOCK
    numel = tl.load(row + _NUMEL)
    return row, start + tl.arange(0, BLOCK), numel, start + BLOCK <= numel


@triton.jit
def _ptrs(row, column: tl.constexpr, DTYPE: tl.constexpr, offs, ALIGNED: tl.constexpr, BLOCK: tl.constexpr):
    """Typed pointers ``[BLOCK]`` to elements ``offs`` of the tensor whose address is in ``row``."""
    ptrs = tl.load(row + column).to(tl.pointer_type(DTYPE)) + offs
    if ALIGNED:
        # The host checked each address is 16-B aligned; chunks start at multiples of BLOCK.
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, [16]), [BLOCK])
    return ptrs


@triton.jit
def _load(ptrs, offs, numel, full):
    if full:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=offs < numel, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _store(ptrs, x, offs, numel, full):
    if full:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=offs < numel)


@triton.jit
def _round(x, DTYPE: tl.constexpr):
    """fp32 → DTYPE, rounding to nearest even. bf16 is rounded by hand because the Triton
    interpreter truncates fp32 → bf16 (the GPU rounds); NaN stays NaN."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = tl.where(x == x, bits + 0x7FFF + ((bits >> 16) & 1), bits | 0x400000)
        return (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


@triton.jit
def _sgd(
    w,
    g,
    buf,
    lr,
    decay,
    weight_decay,
    momentum,
    MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    COUPLED_DECAY: tl.constexpr,
):
    """reference.sgd_step_ on one chunk: returns (w, buf)."""
    if COUPLED_DECAY:
        g = g + weight_decay * w
    else:
        w = w * decay
    if MOMENTUM:
        buf = buf * momentum + g
        if NESTEROV:
            g = g + momentum * buf
        else:
            g = buf
    return w - lr * g, buf


@triton.jit
def _adam_moments(w, g, m, v, decay, beta2, one_minus_beta1, one_minus_beta2):
    """The AdamW/RAdam prologue: decoupled decay, m ← lerp(m, g, 1 − β1), v ← β2·v + (1 − β2)·g²."""
    return w * decay, m + one_minus_beta1 * (g - m), v * beta2 + one_minus_beta2 * g * g


@triton.jit
def _adamw(w, m, v, eps, step_size, bias_correction2_sqrt):
    """reference.adamw_step_ after the moments: w ← w − step_size·m / (√v / √bc2 + ε)."""
    denom = tl.math.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    return w - step_size * tl.math.div_rn(m, denom)


@triton.jit
def _radam(w, m, v, lr, eps, bias_correction1, bias_correction2_sqrt, rect):
    """reference.radam_step_ after the moments; ``rect`` 0 means ρ_t ≤ 5 (momentum SGD)."""
    update = tl.math.div_rn(m, bias_correction1) * lr
    if rect > 0:
        update = update * tl.math.div_rn(bias_correction2_sqrt, tl.sqrt_rn(v) + eps) * rect
    return w - update


@triton.jit
def _lion(w, g, m, lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2):
    """reference.lion_step_: c = β1·m + (1 − β1)·g; w ← w·(1 − lr·wd) − lr·sign(c);
    m ← β2·m + (1 − β2)·g. Returns (w, m)."""
    c = m * beta1 + g * one_minus_beta1
    sign = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, c * 0.0))  # torch.sign, NaN-preserving
    return w * decay - lr * sign, m * beta2 + g * one_minus_beta2


@triton.jit
def _f32(row, i: tl.constexpr):
    """Slot ``i`` of a step row: the bits of an fp32 scalar."""
    return tl.load(row + i).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["seed"])
def _step_kernel(
    tensors,  # *i64 [T, 6]: p, g, state1, state2 addresses, numel, noise offset
    blocks,  # *i64 [n_programs]: tensor index << 32 | chunk index
    clip_scale,  # *f32 []: read only when CLIP
    seed,  # i32: Philox key of this step's noise (do_not_specialize: no recompiles)
    noise_std,
    lr,
    decay,
    weight_decay,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    momentum,
    step_size,
    bias_correction1,
    bias_correction2_sqrt,
    rect,  # f32 run-time scalars
    row,  # *i32 [ROW]: the scalars above and the seed, read only when ROW_IN_MEMORY
    RULE: tl.constexpr,  # "sgd" | "adamw" | "radam" | "lion"
    P_DTYPE: tl.constexpr,
    G_DTYPE: tl.constexpr,
    MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    COUPLED_DECAY: tl.constexpr,
    CLIP: tl.constexpr,
    NOISE: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_IN_MEMORY: tl.constexpr,
):
    if ROW_IN_MEMORY:  # a graph-captured step: this step's values are written there before each replay
        noise_std = _f32(row, _NOISE_STD)
        lr = _f32(row, 0)
        decay = _f32(row, 1)
        weight_decay = _f32(row, 2)
        beta1 = _f32(row, 3)
        beta2 = _f32(row, 4)
        one_minus_beta1 = _f32(row, 5)
        one_minus_beta2 = _f32(row, 6)
        eps = _f32(row, 7)
        momentum = _f32(row, 8)
        step_size = _f32(row, 9)
        bias_correction1 = _f32(row, 10)
        bias_correction2_sqrt = _f32(row, 11)
        rect = _f32(row, 12)
        seed = tl.load(row + _SEED)
    # Bytes per element (fp32 param / bf16 param; state is fp32):
    #   AdamW, RAdam: read p, g, m, v; write p, m, v  = 28 / 22 B
    #   Lion:         read p, g, m;    write p, m     = 20 / 16 B
    #   SGD:          read p, g [, buf]; write p [, buf] = 12 (20) / 6 (14) B
    row, offs, numel, full = _chunk(tensors, blocks, BLOCK)

    # The gradient pipeline, in fp32: clip, then noise (as reference.effective_grad).
    g = _load(_ptrs(row, _G, G_DTYPE, offs, ALIGNED, BLOCK), offs, numel, full)
    if CLIP:
        g = g * tl.load(clip_scale)
    if NOISE:
        g = g + noise_std * tl.randn(seed, tl.load(row + _NOISE) + offs)  # offsets unique per element of the launch

    p_ptrs = _ptrs(row, _P, P_DTYPE, offs, ALIGNED, BLOCK)
    w = _load(p_ptrs, offs, numel, full)  # the param in fp32, rounded once on the store below
    if RULE == "sgd":
        if MOMENTUM:
            buf_ptrs = _ptrs(row, _STATE1, tl.float32, offs, ALIGNED, BLOCK)
            buf = _load(buf_ptrs, offs, numel, full)
        else:
            buf = g
        w, buf = _sgd(w, g, buf, lr, decay, weight_decay, momentum, MOMENTUM, NESTEROV, COUPLED_DECAY)
        if MOMENTUM:
            _store(buf_ptrs, buf, offs, numel, full)
    elif RULE == "lion":
        m_ptrs = _ptrs(row, _STATE1, tl.float32, offs, ALIGNED, BLOCK)
        w, m = _lion(w, g, _load(m_ptrs, offs, numel, full), lr, decay, beta1, beta2, one_minus_beta1, one_minus_beta2)
        _store(m_ptrs, m, offs, numel, full)
    else:
        m_ptrs = _ptrs(row, _STATE1, tl.float32, offs, ALIGNED, BLOCK)
        v_ptrs = _ptrs(row, _STATE2, tl.float32, offs, ALIGNED, BLOCK)
        m = _load(m_ptrs, offs, numel, full)
        v = _load(v_ptrs, offs, numel, full)
        w, m, v = _adam_moments(w, g, m, v, decay, beta2, one_minus_beta1, one_minus_beta2)
        if RULE == "adamw":
            w = _adamw(w, m, v, eps, step_size, bias_correction2_sqrt)
        else:
            w = _radam(w, m, v, lr, eps, bias_correction1, bias_correction2_sqrt, rect)
        _store(m_ptrs, m, offs, numel, full)
        _store(v_ptrs, v, offs, numel, full)
    _store(p_ptrs, _round(w, P_DTYPE), offs, numel, full)


@triton.jit
def _sum_squares_kernel(
    tensors,  # *i64 [T, 6]: the grad address in column 1, numel in column 4
    blocks,  # *i64 [n_programs]
    partials,  # *f32 [n_programs]: Σ g² over this program's chunk
    G_DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Reads g (4 B fp32 / 2 B bf16 per element); writes 4 B per program.
    row, offs, numel, full = _chunk(tensors, blocks, BLOCK)
    g = _load(_ptrs(row, _G, G_DTYPE, offs, ALIGNED, BLOCK), offs, numel, full)
    tl.store(partials + tl.program_id(0), tl.sum(g * g, axis=0))


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tables:
    tensors: Tensor  # int64 [T * _ROW] on the device
    blocks: Tensor  # int64 [n_programs] on the device
    aligned: bool


_TABLE_CACHE: OrderedDict[tuple, _Tables] = OrderedDict()
_TABLE_CACHE_SIZE = 64


def _tables(
    columns: Sequence[Sequence[Tensor | None]],
    numels: Sequence[int],
    noise_offsets: Sequence[int],
    device: torch.device,
    block: int,
) -> _Tables:
    """The tensor and block tables for ``columns`` (p, g, state1, state2 lists; None = unused),
    cached by every address, numel and offset: they change only when a tensor is reallocated."""
    addresses = [[0 if t is None else t.data_ptr() for t in column] for column in columns]
    key = (device, block, *map(tuple, addresses), tuple(numels), tuple(noise_offsets))
    cached = _TABLE_CACHE.get(key)
    if cached is not None:
        _TABLE_CACHE.move_to_end(key)
        return cached
    rows = torch.tensor(
        [[*row, n, o] for *row, n, o in zip(*addresses, numels, noise_offsets, strict=True)], dtype=torch.int64
    )
    n_blocks = (torch.tensor(numels, dtype=torch.int64) + block - 1) // block  # [T]
    tensor_index = torch.repeat_interleave(torch.arange(len(numels)), n_blocks)
    first = torch.repeat_interleave(torch.cumsum(n_blocks, 0) - n_blocks, n_blocks)
    entries = (tensor_index << 32) | (torch.arange(len(tensor_index)) - first)
    host = torch.cat([rows.flatten(), entries])
    if is_cuda(device):
        host = host.pin_memory()  # the caching host allocator keeps it until the async copy lands
    table = host.to(device, non_blocking=True)
    aligned = all(a % _ALIGN == 0 for column in addresses for a in column)
    tables = _Tables(table[: rows.numel()], table[rows.numel() :], aligned)
    _TABLE_CACHE[key] = tables
    if len(_TABLE_CACHE) > _TABLE_CACHE_SIZE:
        _TABLE_CACHE.popitem(last=False)
    return tables


# ---------------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------------


def supports(p: Tensor, g: Tensor) -> bool:
    """Whether the fused kernel can update ``p`` from ``g``: fp32/bf16 param, grad of the same
    dtype, both contiguous and dense, on one CUDA device (or anywhere under TRITON_INTERPRET).
    Called per tensor per step, so it sticks to cheap attribute reads."""
    return (
        (p.is_cuda or INTERPRETED)
        and p.dtype in _TL_DTYPES
        and g.dtype is p.dtype
        and not g.is_sparse
        and g.get_device() == p.get_device()
        and p.is_contiguous()
        and g.is_contiguous()
    )


@dataclass(frozen=True)
class _Scalars:
    """The kernel's f32 run-time arguments; each rule reads its own (see the kernel)."""

    lr: float = 0.0
    decay: float = 1.0
    weight_decay: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    one_minus_beta1: float = 0.0
    one_minus_beta2: float = 0.0
    eps: float = 0.0
    momentum: float = 0.0
    step_size: float = 0.0
    bias_correction1: float = 1.0
    bias_correction2_sqrt: float = 1.0
    rect: float = 0.0


def _sgd_scalars(lr: float, momentum: float, weight_decay: float) -> _Scalars:
    return _Scalars(lr=lr, decay=1 - lr * weight_decay, weight_decay=weight_decay, momentum=momentum)


def _adam_scalars(
    rule: str, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int
) -> _Scalars:
    """AdamW's or RAdam's values at ``step`` (1 on the first update): bias corrections and
    RAdam's ρ_t / rectification, on the host in float64."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    rect = 0.0
    if rule == "radam":
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    return _Scalars(
        lr=lr,
        decay=1 - lr * weight_decay,
        beta2=beta2,
        one_minus_beta1=1 - beta1,
        one_minus_beta2=1 - beta2,
        eps=eps,
        step_size=lr / bias_correction1,
        bias_correction1=bias_correction1,
        bias_correction2_sqrt=bias_correction2**0.5,
        rect=rect,
    )


def _lion_scalars(lr: float, beta1: float, beta2: float, weight_decay: float) -> _Scalars:
    return _Scalars(
        lr=lr,
        decay=1 - lr * weight_decay,
        beta1=beta1,
        beta2=beta2,
        one_minus_beta1=1 - beta1,
        one_minus_beta2=1 - beta2,
    )


def step_row(
    rule: str,
    *,
    lr: float,
    weight_decay: float,
    beta1: float = 0.0,
    beta2: float = 0.0,
    eps: float = 0.0,
    momentum: float = 0.0,
    step: int = 1,
    noise_std: float = 0.0,
    seed: int = 0,
) -> list[int]:
    """The ``ROW`` int32 slots a step fn's ``row`` carries for one launch of ``rule`` ("sgd",
    "adamw", "radam", "lion") with these values (``step``: Adam's, 1 on the first update): the
    kernel reads exactly the fp32 values the run-time arguments would have given it."""
    _check_seed(seed)
    if rule == "sgd":
        scalars = _sgd_scalars(lr, momentum, weight_decay)
    elif rule == "lion":
        scalars = _lion_scalars(lr, beta1, beta2, weight_decay)
    elif rule in ("adamw", "radam"):
        scalars = _adam_scalars(rule, lr, beta1, beta2, eps, weight_decay, step)
    else:
        raise ValueError(f"unknown rule {rule!r}")
    floats = [*vars(scalars).values(), noise_std]
    bits = np.array(floats, dtype=np.float32).view(np.int32).tolist()
    return [*bits, seed] + [0] * (ROW - len(floats) - 1)


def _launch(
    rule: str,
    columns: list[Sequence[Tensor | None]],
    indices: list[int],
    scalars: _Scalars,
    *,
    clip_scale: Tensor | None,
    noise_std: float,
    seed: int,
    offsets: list[int],
    config: StepConfig | None,
    momentum: bool = False,
    nesterov: bool = False,
    coupled_decay: bool = False,
    row: Tensor | None = None,
) -> None:
    """One launch over tensors ``indices`` of ``columns`` (all on one device, one p and g dtype);
    with ``row`` (a step row on that device) the kernel reads the per-step values from it."""
    params, grads = columns[0], columns[1]
    first = params[indices[0]]
    config = config or step_config(first.device)
    picked = [[None if column is None else column[i] for i in indices] for column in columns]
    tables = _tables(
        picked, [params[i].numel() for i in indices], [offsets[i] for i in indices], first.device, config.block
    )
    n_programs = tables.blocks.numel()
    if n_programs == 0:
        return
    if clip_scale is not None:
        clip_scale = clip_scale.to(device=first.device, dtype=torch.float32)
    _step_kernel[(n_programs,)](
        tables.tensors,
        tables.blocks,
        tables.tensors if clip_scale is None else clip_scale,  # a placeholder pointer when CLIP is off
        seed,
        float(noise_std),
        **vars(scalars),
        row=tables.tensors if row is None else row,  # a placeholder pointer when the values are arguments
        RULE=rule,
        P_DTYPE=_TL_DTYPES[first.dtype],
        G_DTYPE=_TL_DTYPES[grads[indices[0]].dtype],
        MOMENTUM=momentum,
        NESTEROV=nesterov,
        COUPLED_DECAY=coupled_decay,
        CLIP=clip_scale is not None,
        NOISE=noise_std > 0,
        ALIGNED=tables.aligned,
        BLOCK=config.block,
        ROW_IN_MEMORY=row is not None,
        num_warps=config.num_warps,
        enable_fp_fusion=False,
    )


def _buckets(
    params: Sequence[Tensor], grads: Sequence[Tensor], steps: Sequence[int] | None = None, *, checked: bool = False
) -> list[list[int]]:
    """Indices grouped by what must share a launch: device, param and grad dtype (and step).
    ``checked``: the caller has already verified ``supports`` for every pair (the optimizer
    does, once per step), so the per-tensor check is not repeated on this hot path."""
    if not checked:
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if not supports(p, g):
                raise ValueError(
                    f"tensor {i} ({p.dtype}, {tuple(p.shape)}, {p.device}) is not supported by the "
                    f"fused kernel: params must be {PARAM_DTYPES}, contiguous, with a grad of the same "
                    "dtype"
                )
    if len(params) != len(grads):
        raise ValueError(f"{len(params)} params but {len(grads)} grads")
    if not params:
        return []
    p0, g0 = params[0], grads[0]
    device, p_dtype, g_dtype = p0.get_device(), p0.dtype, g0.dtype
    step0 = None if steps is None else steps[0]
    if all(
        p.dtype is p_dtype and g.dtype is g_dtype and p.get_device() == device
        for p, g in zip(params, grads, strict=True)
    ) and (steps is None or all(s == step0 for s in steps)):
        return [list(range(len(params)))]  # the common case: one launch over everything
    groups: dict[tuple, list[int]] = {}
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        groups.setdefault((p.get_device(), p.dtype, g.dtype, None if steps is None else steps[i]), []).append(i)
    return list(groups.values())


def _noise_offsets(params: Sequence[Tensor], noise: bool = True) -> list[int]:
    """Each tensor's first Philox counter: the elements before it, so every element of every
    launch of one call draws a distinct normal (all 0 without noise: the kernel ignores them)."""
    if not noise:
        return [0] * len(params)
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel()
    return offsets


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 2**31:
        raise ValueError(f"seed must be in [0, 2**31) (passed to the kernel as int32), got {seed}")


def sgd_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor] | None,
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
    decoupled_weight_decay: bool,
    clip_scale: Tensor | None = None,
    noise_std: float = 0.0,
    seed: int = 0,
    config: StepConfig | None = None,
    checked: bool = False,
    row: Tensor | None = None,
) -> None:
    """reference.sgd_step_ over all tensors, one launch per (device, dtype).

    momentum_buffers: fp32 ``[*]_i`` (zeros at first), required iff ``momentum > 0``.
    """
    _check_seed(seed)
    assert (momentum_buffers is not None) == (momentum != 0), "momentum > 0 needs momentum buffers, and only then"
    scalars = _sgd_scalars(lr, momentum, weight_decay)
    offsets = _noise_offsets(params, noise_std > 0)
    for indices in _buckets(params, grads, checked=checked):
        _launch(
            "sgd",
            [params, grads, momentum_buffers, None],
            indices,
            scalars,
            clip_scale=clip_scale,
            noise_std=noise_std,
            seed=seed,
            offsets=offsets,
            config=config,
            momentum=momentum != 0,
            nesterov=nesterov,
            coupled_decay=not decoupled_weight_decay,
            row=row,
        )


def _adam_step_(
    rule: str,
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    steps: Sequence[int],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    clip_scale: Tensor | None = None,
    noise_std: float = 0.0,
    seed: int = 0,
    config: StepConfig | None = None,
    checked: bool = False,
    row: Tensor | None = None,
) -> None:
    """AdamW or RAdam (``rule``) over all tensors, one launch per (device, dtype, step).

    exp_avgs, exp_avg_sqs: fp32 ``[*]_i``. steps[i]: 1 on tensor i's first update. Bias
    corrections and RAdam's ρ_t / rectification are computed on the host per distinct step.
    """
    _check_seed(seed)
    offsets = _noise_offsets(params, noise_std > 0)
    buckets = _buckets(params, grads, steps, checked=checked)
    if row is not None and len(buckets) > 1:
        raise ValueError("a step row holds one step's values: its tensors must share device, dtypes and step")
    for indices in buckets:
        scalars = _adam_scalars(rule, lr, beta1, beta2, eps, weight_decay, steps[indices[0]])
        _launch(
            rule,
            [params, grads, exp_avgs, exp_avg_sqs],
            indices,
            scalars,
            clip_scale=clip_scale,
            noise_std=noise_std,
            seed=seed,
            offsets=offsets,
            config=config,
            row=row,
        )


# reference.adamw_step_ / reference.radam_step_ over lists: the arguments of _adam_step_ after ``rule``.
adamw_step_ = partial(_adam_step_, "adamw")
radam_step_ = partial(_adam_step_, "radam")


def lion_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    clip_scale: Tensor | None = None,
    noise_std: float = 0.0,
    seed: int = 0,
    config: StepConfig | None = None,
    checked: bool = False,
    row: Tensor | None = None,
) -> None:
    """reference.lion_step_ over all tensors, one launch per (device, dtype). exp_avgs: fp32 ``[*]_i``."""
    _check_seed(seed)
    scalars = _lion_scalars(lr, beta1, beta2, weight_decay)
    offsets = _noise_offsets(params, noise_std > 0)
    for indices in _buckets(params, grads, checked=checked):
        _launch(
            "lion",
            [params, grads, exp_avgs, None],
            indices,
            scalars,
            clip_scale=clip_scale,
            noise_std=noise_std,
            seed=seed,
            offsets=offsets,
            config=config,
            row=row,
        )


def grad_norm(grads: Sequence[Tensor], config: StepConfig | None = None, *, checked: bool = False) -> Tensor:
    """Global L2 norm of ``grads`` (fp32/bf16, contiguous ``[*]_i``) as a 0-dim fp32 tensor on
    ``grads[0]``'s device, without a host sync: one sum-of-squares launch per (device, dtype),
    then a deterministic sum of the per-program partials. Matches reference.global_grad_norm to
    fp32 rounding."""
    if not grads:
        return torch.zeros(())
    sums = []
    for indices in _buckets(grads, grads, checked=checked):
        first = grads[indices[0]]
        cfg = config or norm_config(first.device)
        nothing = [None] * len(indices)
        tables = _tables(
            [nothing, [grads[i] for i in indices], nothing, nothing],
            [grads[i].numel() for i in indices],
            [0] * len(indices),
            first.device,
            cfg.block,
        )
        partials = torch.empty(tables.blocks.numel(), dtype=torch.float32, device=first.device)  # all written
        if partials.numel() > 0:
            _sum_squares_kernel[(partials.numel(),)](
                tables.tensors,
                tables.blocks,
                partials,
                G_DTYPE=_TL_DTYPES[first.dtype],
                ALIGNED=tables.aligned,
                BLOCK=cfg.block,
                num_warps=cfg.num_warps,
                enable_fp_fusion=False,
            )
        sums.append(partials.sum().to(grads[0].device))
    return (sums[0] if len(sums) == 1 else torch.stack(sums).sum()).sqrt()
