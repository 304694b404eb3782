"""kernels/optim/triton: the fused multi-tensor steps against kernels.optim.reference.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET before any test module imports a kernel).
With CUDA the interpreter tests are skipped and the ``gpu`` tests run 100 compiled steps against
the CPU reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from kernels.optim import configs
from kernels.optim import reference as ref
from kernels.optim import triton as fused
from kernels.optim.configs import StepConfig
from nas.optim import SGD, AdamW, GradOptions, Lion, OptimizerBase, RAdam
from tests.optim.problems import run_pair

INTERPRETED = isinstance(fused._step_kernel, InterpretedFunction)
CUDA = torch.device("cuda")
requires_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="interpreter tests run where CUDA is absent (TRITON_INTERPRET=1)"
)
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# 37: a lone masked chunk; 65: one full chunk and a 1-element tail; 231: three full and a tail;
# 64: one full chunk, no tail (blocks of INTERPRETER.block = 64 elements).
SHAPES = [(37,), (5, 13), (3, 7, 11), (2, 32)]
# On the GPU: tensors spanning several chunks (configs.HOPPER: 1024 elements, the norm 4096) and
# an exact multiple of both.
GPU_SHAPES = [(37,), (5, 13), (3, 7, 11), (4099, 3), (8192,), (1, 1)]
MAX_NORM = 0.5  # random grads over these shapes have norm ≫ 0.5: the clip is always active


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    mismatch: float = 1.0  # largest share of elements allowed to differ at all
    outliers: float = 0.0  # share allowed beyond rtol/atol, each still within outlier_atol
    outlier_atol: float = 0.0


# fp32: kernel and reference differ only by rounding (torch's lerp/addcmul may use FMA on CPU).
# bf16: both round to bf16 once per step, so an fp32 rounding difference occasionally lands a
# param one bf16 ulp apart; that gap (2**-6 for |p| in [2, 4)) persists as the param moves, even
# towards zero, hence the absolute term. At most 1% of params may differ at all.
TOLERANCES = {
    torch.float32: Tolerance(1e-5, 1e-6),
    torch.bfloat16: Tolerance(2**-7, 2**-6, mismatch=0.01),
}
# fp32 state of bf16 params: SGD's coupled decay feeds w into the buffer (buf ← μ·buf + g + wd·w),
# so a one-ulp param gap shows up there too, at most wd·2**-6 / (1 − μ) ≈ 0.03 here, in as few
# elements as the params that differ.
BF16_STATE = Tolerance(1e-5, 1e-6, outliers=0.01, outlier_atol=0.05)
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def _lion(tol: Tolerance, lr: float) -> Tolerance:
    """Where one rounding (torch's CPU kernels may fuse a multiply-add) tips a near-zero sign(c)
    the other way, a Lion param moves 2·lr apart: up to 0.1% of params may carry two such flips."""
    return replace(tol, outliers=1e-3, outlier_atol=4.1 * lr)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> None:
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    a, e = actual.float(), expected.float()
    differ = (actual != expected).float().mean().item()
    assert differ <= tol.mismatch, f"{differ:.1%} of elements differ (allowed {tol.mismatch:.1%})"
    if tol.outliers:
        outlying = (a - e).abs() > tol.atol + tol.rtol * e.abs()
        share = outlying.float().mean().item()
        assert share <= tol.outliers, f"{share:.2%} of elements are off (allowed {tol.outliers:.2%})"
        assert ((a - e).abs()[outlying] <= tol.outlier_atol).all(), f"an outlier is off by more than {tol.outlier_atol}"
        a = torch.where(outlying, e, a)
    torch.testing.assert_close(a, e, rtol=tol.rtol, atol=tol.atol)


# ---------------------------------------------------------------------------------------------
# Each rule, called directly: one launch over all SHAPES vs the reference per tensor.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One optimizer configuration: how many state tensors, the fused call and the reference."""

    n_state: int
    fused_step: Callable[..., None]  # (params, grads, states, steps, clip_scale)
    reference_step: Callable[..., None]  # (p, g, state, step)
    sign_lr: float = 0.0  # Lion's lr: see _lion


def _adam_rule(fused_fn: Callable, ref_fn: Callable) -> Rule:
    hp = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
    return Rule(
        2,
        lambda ps, gs, ss, steps, scale: fused_fn(ps, gs, ss[0], ss[1], steps, clip_scale=scale, **hp),
        lambda p, g, s, step: ref_fn(p, g, s[0], s[1], step=step, **hp),
    )


def _sgd_rule(momentum: float, nesterov: bool, decoupled: bool) -> Rule:
    hp = dict(lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=0.2, decoupled_weight_decay=decoupled)
    return Rule(
        1 if momentum else 0,
        lambda ps, gs, ss, steps, scale: fused.sgd_step_(ps, gs, ss[0] if momentum else None, clip_scale=scale, **hp),
        lambda p, g, s, step: ref.sgd_step_(p, g, s[0] if momentum else None, **hp),
    )


_LION_HP = dict(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.3)
RULES = [
    pytest.param(_adam_rule(fused.adamw_step_, ref.adamw_step_), id="adamw"),
    pytest.param(_adam_rule(fused.radam_step_, ref.radam_step_), id="radam"),
    pytest.param(
        Rule(
            1,
            lambda ps, gs, ss, steps, scale: fused.lion_step_(ps, gs, ss[0], clip_scale=scale, **_LION_HP),
            lambda p, g, s, step: ref.lion_step_(p, g, s[0], **_LION_HP),
            sign_lr=_LION_HP["lr"],
        ),
        id="lion",
    ),
    pytest.param(_sgd_rule(0.0, False, True), id="sgd-plain"),
    pytest.param(_sgd_rule(0.9, False, True), id="sgd-momentum-decoupled"),
    pytest.param(_sgd_rule(0.9, False, False), id="sgd-momentum-coupled"),
    pytest.param(_sgd_rule(0.9, True, True), id="sgd-nesterov-decoupled"),
    pytest.param(_sgd_rule(0.9, True, False), id="sgd-nesterov-coupled"),
]


def _run_rule(
    rule: Rule, dtype: torch.dtype, shapes: list[tuple[int, ...]], steps: int, device: torch.device, seed: int = 0
) -> None:
    """``steps`` fused steps on ``device`` vs the reference on CPU copies, clip active, fresh grads
    each step. Adam tensors start at different step counts (0 and 9), so RAdam runs both of its
    branches and every call needs two launches (one per distinct step)."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    states = [[torch.rand(s, generator=gen) * 0.1 for s in shapes] for _ in range(rule.n_state)]
    ref_params = [p.clone() for p in params]
    ref_states = [[s.clone() for s in column] for column in states]
    params = [p.to(device) for p in params]
    states = [[s.to(device) for s in column] for column in states]
    counts = [0 if i % 2 == 0 else 9 for i in range(len(shapes))]
    for _ in range(steps):
        grads = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
        norm = ref.global_grad_norm(grads)
        scale = ref.clip_scale(norm, MAX_NORM)
        assert scale.item() < 1, "the clip must be active"
        counts = [c + 1 for c in counts]
        rule.fused_step(params, [g.to(device) for g in grads], states, counts, scale.to(device))
        for i, (p, g) in enumerate(zip(ref_params, grads, strict=True)):
            effective = ref.effective_grad(g, scale=scale, noise_std=0.0, generator=None)
            rule.reference_step(p, effective, [column[i] for column in ref_states], counts[i])
    param_tol = TOLERANCES[dtype] if not rule.sign_lr else _lion(TOLERANCES[dtype], rule.sign_lr)
    state_tol = TOLERANCES[torch.float32] if dtype == torch.float32 else BF16_STATE
    for p, expected in zip(params, ref_params, strict=True):
        assert p.dtype == dtype
        _assert_close(p, expected, param_tol)
    for column, ref_column in zip(states, ref_states, strict=True):
        for s, expected in zip(column, ref_column, strict=True):
            assert s.dtype == torch.float32
            _assert_close(s, expected, state_tol)


@requires_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULES)
def test_step_matches_reference(rule: Rule, dtype: torch.dtype) -> None:
    _run_rule(rule, dtype, SHAPES, steps=3, device=torch.device("cpu"))


@requires_interpreter
def test_unaligned_views_match_reference() -> None:
    """Params that start 4 B past an allocation: the kernel must drop its 16-B alignment hint."""
    base = torch.randn(200)
    params = [base[1:38], base[41:106].view(5, 13)]
    grads = [torch.randn(p.shape) for p in params]
    exp_avgs, exp_avg_sqs = [torch.zeros(p.shape) for p in params], [torch.zeros(p.shape) for p in params]
    expected = [p.clone() for p in params]
    ref_m, ref_v = [torch.zeros(p.shape) for p in params], [torch.zeros(p.shape) for p in params]
    fused.adamw_step_(
        params, grads, exp_avgs, exp_avg_sqs, [1, 1], lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1
    )
    for p, g, m, v in zip(expected, grads, ref_m, ref_v, strict=True):
        ref.adamw_step_(p, g, m, v, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, step=1)
    for p, e in zip(params, expected, strict=True):
        _assert_close(p, e, TOLERANCES[torch.float32])


@requires_interpreter
def test_grad_norm_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(s, generator=gen) * 3 for s in SHAPES] + [torch.randn(7, 9, generator=gen).bfloat16()]
    torch.testing.assert_close(fused.grad_norm(grads), ref.global_grad_norm(grads), rtol=1e-6, atol=0)
    assert fused.grad_norm([]).item() == 0.0
    grads[2][1, 2, 3] = math.inf
    assert not torch.isfinite(fused.grad_norm(grads))


# Every launch config of the step and the norm: per GPU, the interpreter's, and the sweeps'.
STEP_CONFIGS = [
    pytest.param(c, id=f"{c.block}w{c.num_warps}")
    for c in dict.fromkeys((configs.HOPPER, configs.DEFAULT, configs.INTERPRETER, *configs.SWEEP))
]
NORM_CONFIGS = [
    pytest.param(c, id=f"{c.block}w{c.num_warps}")
    for c in dict.fromkeys((configs.HOPPER_NORM, configs.DEFAULT_NORM, configs.INTERPRETER, *configs.NORM_SWEEP))
]
_ADAMW_HP = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)


def _check_step_config(config: StepConfig, shapes: list[tuple[int, ...]], device: torch.device) -> None:
    """One fused AdamW step with ``config`` vs the reference per tensor (fp32)."""
    gen = torch.Generator().manual_seed(config.block + config.num_warps)
    params, grads = ([torch.randn(s, generator=gen) for s in shapes] for _ in range(2))
    moments = [[torch.zeros(s) for s in shapes] for _ in range(2)]
    expected = [p.clone() for p in params]
    on = [[t.to(device, copy=True) for t in column] for column in (params, grads, *moments)]
    fused.adamw_step_(*on, [1] * len(shapes), config=config, **_ADAMW_HP)
    for i, (p, g) in enumerate(zip(expected, grads, strict=True)):
        ref.adamw_step_(p, g, moments[0][i], moments[1][i], step=1, **_ADAMW_HP)
    for p, want in zip(on[0], expected, strict=True):
        _assert_close(p, want, TOLERANCES[torch.float32])


@requires_interpreter
@pytest.mark.parametrize("config", STEP_CONFIGS)
def test_every_step_config(config: StepConfig) -> None:
    """The contract over every step config, run as given on odd-sized tensors."""
    _check_step_config(config, SHAPES, torch.device("cpu"))


@requires_interpreter
@pytest.mark.parametrize("config", NORM_CONFIGS)
def test_every_norm_config(config: StepConfig) -> None:
    gen = torch.Generator().manual_seed(config.block)
    grads = [torch.randn(s, generator=gen) for s in SHAPES]
    torch.testing.assert_close(fused.grad_norm(grads, config), ref.global_grad_norm(grads), rtol=1e-6, atol=0)


def test_unsupported_tensors_are_refused() -> None:
    p = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="not supported"):
        fused.lion_step_([p], [p.clone()], [p.clone()], lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0)
    with pytest.raises(ValueError, match="seed"):
        fused.lion_step_([], [], [], lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, seed=2**31)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block"):
        StepConfig(block=100, num_warps=4)
    with pytest.raises(ValueError, match="num_warps"):
        StepConfig(block=128, num_warps=3)


# ---------------------------------------------------------------------------------------------
# Gradient noise: statistics and determinism (the draws differ from the reference's by design).
# ---------------------------------------------------------------------------------------------

NOISE_STD = 0.3
NOISE_SHAPES = [(100_003,), (317, 311)]  # ≈ 200k draws


def _noise_update(device: torch.device, seed: int) -> torch.Tensor:
    """SGD with lr=1 on zero params and zero grads: the update is exactly −σ·z."""
    params = [torch.zeros(s, device=device) for s in NOISE_SHAPES]
    grads = [torch.zeros(s, device=device) for s in NOISE_SHAPES]
    config = None if device.type == "cuda" else StepConfig(block=8192, num_warps=4)  # fewer interpreted programs
    fused.sgd_step_(
        params,
        grads,
        None,
        lr=1.0,
        momentum=0.0,
        nesterov=False,
        weight_decay=0.0,
        decoupled_weight_decay=True,
        noise_std=NOISE_STD,
        seed=seed,
        config=config,
    )
    return -torch.cat([p.flatten() for p in params]).cpu()


NOISE_DEVICES = [
    pytest.param(torch.device("cpu"), id="interpreter", marks=requires_interpreter),
    pytest.param(CUDA, id="cuda", marks=[pytest.mark.gpu, requires_cuda]),
]


@pytest.mark.parametrize("device", NOISE_DEVICES)
def test_noise_statistics_and_determinism(device: torch.device) -> None:
    z = _noise_update(device, seed=5)
    n = z.numel()
    assert abs(z.mean().item()) < 5 * NOISE_STD / math.sqrt(n)
    assert z.std().item() == pytest.approx(NOISE_STD, rel=0.01)
    # Standardized 4th moment of a normal is 3; a uniform's is 1.8.
    assert (z / NOISE_STD).pow(4).mean().item() == pytest.approx(3.0, rel=0.05)
    first, second = z[:1000], z[100_003:101_003]
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1].item()) < 0.15, "tensors share draws"
    assert torch.equal(z, _noise_update(device, seed=5))
    assert not torch.allclose(z, _noise_update(device, seed=6))


# ---------------------------------------------------------------------------------------------
# The optimizers: fused path vs reference path, multi-group, lr schedule, a param skipping grads.
# ---------------------------------------------------------------------------------------------

LR = 0.01
OPTIMIZERS = [  # (make, sign_lr)
    pytest.param(lambda g, **kw: SGD(g, momentum=0.9, nesterov=True, **kw), 0.0, id="sgd-nesterov"),
    pytest.param(lambda g, **kw: SGD(g, momentum=0.9, decoupled_weight_decay=False, **kw), 0.0, id="sgd-coupled"),
    pytest.param(lambda g, **kw: AdamW(g, **kw), 0.0, id="adamw"),
    pytest.param(lambda g, **kw: RAdam(g, betas=(0.9, 0.9), **kw), 0.0, id="radam"),
    pytest.param(lambda g, **kw: Lion(g, **kw), LR, id="lion"),
]
CLIP = GradOptions(max_norm=1.0)


@requires_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make,sign_lr", OPTIMIZERS)
def test_optimizer_fused_path_matches_reference_path(make: Callable, sign_lr: float, dtype: torch.dtype) -> None:
    _, ours, expected = run_pair(
        lambda g: make(g, grad_options=CLIP, fused=True),
        lambda g: make(g, grad_options=CLIP, fused=False),
        dtype=dtype,
        lr=LR,
        weight_decay=0.1,
        grad_scale=2.0,
        steps=4,
    )
    tol = _lion(TOLERANCES[dtype], sign_lr) if sign_lr else TOLERANCES[dtype]
    for a, b in zip(ours, expected, strict=True):
        _assert_close(a, b, tol)


@requires_interpreter
def test_fused_noise_resumes_exactly_from_a_state_dict() -> None:
    options = GradOptions(noise=0.1, seed=4)

    def run(opt: OptimizerBase, p: torch.Tensor, steps: int) -> None:
        for _ in range(steps):
            p.grad = torch.ones_like(p)
            opt.step()

    p = torch.zeros(300, requires_grad=True)
    opt = Lion([p], lr=0.1, grad_options=options, fused=True)
    run(opt, p, 2)
    saved, p_saved = opt.state_dict(), p.detach().clone()
    run(opt, p, 2)
    p2 = p_saved.clone().requires_grad_()
    opt2 = Lion([p2], lr=0.1, grad_options=options, fused=True)
    opt2.load_state_dict(saved)
    run(opt2, p2, 2)
    assert torch.equal(p, p2)


def test_fused_true_refuses_what_the_kernel_cannot_run() -> None:
    p = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    p.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="fused=True"):
        AdamW([p], fused=True).step()


# ---------------------------------------------------------------------------------------------
# GPU: 100 compiled steps against the CPU reference.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULES)
def test_gpu_100_steps_match_cpu_reference(rule: Rule, dtype: torch.dtype) -> None:
    _run_rule(rule, dtype, GPU_SHAPES, steps=100, device=CUDA)


def _to_cuda(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().to(CUDA).requires_grad_() for p in params]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make,sign_lr", OPTIMIZERS)
def test_gpu_optimizer_100_steps_match_cpu_reference_path(make: Callable, sign_lr: float, dtype: torch.dtype) -> None:
    """The optimizers on CUDA (fused by default) vs on CPU, via the same grads and schedule."""
    gen = torch.Generator().manual_seed(0)
    cpu = [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in GPU_SHAPES]
    gpu = _to_cuda(cpu)
    opts = [
        make([{"params": ps[:3]}, {"params": ps[3:], "lr": LR / 2}], lr=LR, weight_decay=0.1, grad_options=CLIP)
        for ps in (cpu, gpu)
    ]
    for t in range(100):
        for i, (a, b) in enumerate(zip(cpu, gpu, strict=True)):
            grad = None if (i == 2 and t % 3 == 1) else (torch.randn(a.shape, generator=gen) * 2).to(dtype)
            a.grad = grad
            b.grad = None if grad is None else grad.to(CUDA)
        for opt in opts:
            opt.step()
    torch.testing.assert_close(opts[1].last_grad_norm.cpu(), opts[0].last_grad_norm, rtol=1e-5, atol=0)
    tol = _lion(TOLERANCES[dtype], sign_lr) if sign_lr else TOLERANCES[dtype]
    for a, b in zip(cpu, gpu, strict=True):
        _assert_close(b, a, tol)


@pytest.mark.gpu
@requires_cuda
def test_gpu_grad_norm_and_unaligned_views() -> None:
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(s, generator=gen) for s in GPU_SHAPES]
    torch.testing.assert_close(
        fused.grad_norm([g.to(CUDA) for g in grads]).cpu(), ref.global_grad_norm(grads), rtol=1e-5, atol=0
    )
    base = torch.randn(20_000, generator=gen)
    p_cpu = base[1:12_289].clone()  # 3 × 4096 elements, one float past a 16-B boundary on the GPU
    p_gpu = base.to(CUDA)[1:12_289]
    g = torch.randn(p_cpu.shape, generator=gen)
    states = [torch.zeros_like(p_cpu) for _ in range(2)]
    gpu_states = [s.to(CUDA) for s in states]
    fused.adamw_step_(
        [p_gpu],
        [g.to(CUDA)],
        [gpu_states[0]],
        [gpu_states[1]],
        [1],
        lr=0.1,
        beta1=0.9,
        beta2=0.99,
        eps=1e-8,
        weight_decay=0.1,
    )
    ref.adamw_step_(p_cpu, g, states[0], states[1], lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, step=1)
    _assert_close(p_gpu, p_cpu, TOLERANCES[torch.float32])


@pytest.mark.gpu
@requires_cuda
def test_gpu_per_step_scalars_do_not_recompile() -> None:
    """lr, bias corrections, noise σ and seed change every step; the kernel compiles once."""
    params = [torch.randn(s, device=CUDA, requires_grad=True) for s in GPU_SHAPES]
    opt = AdamW(params, grad_options=GradOptions(max_norm=1.0, noise=0.01))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))
    cache = fused._step_kernel.device_caches[torch.cuda.current_device()][0]
    sizes = []
    for _ in range(20):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        sched.step()
        sizes.append(len(cache))
    assert sizes[-1] == sizes[0], f"recompiled: cache sizes {sizes}"


@pytest.mark.gpu
@requires_cuda
def test_gpu_reference_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """NAS_OPTIM_FUSED=0 and fused=False keep CUDA params on the reference path."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fused kernel ran")

    monkeypatch.setattr(fused, "adamw_step_", refuse)
    p = torch.randn(10, device=CUDA, requires_grad=True)
    p.grad = torch.randn_like(p)
    AdamW([p], fused=False).step()
    monkeypatch.setenv("NAS_OPTIM_FUSED", "0")
    AdamW([p]).step()
    monkeypatch.delenv("NAS_OPTIM_FUSED")
    with pytest.raises(AssertionError, match="fused kernel ran"):
        AdamW([p]).step()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("config", STEP_CONFIGS)
def test_gpu_every_step_config(config: StepConfig) -> None:
    _check_step_config(config, GPU_SHAPES, CUDA)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("config", NORM_CONFIGS)
def test_gpu_every_norm_config(config: StepConfig) -> None:
    gen = torch.Generator().manual_seed(config.block)
    grads = [torch.randn(s, generator=gen) for s in GPU_SHAPES]
    torch.testing.assert_close(
        fused.grad_norm([g.to(CUDA) for g in grads], config).cpu(), ref.global_grad_norm(grads), rtol=1e-5, atol=0
    )
