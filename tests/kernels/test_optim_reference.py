"""kernels/optim/reference: low-precision params are upcast once; the grad pipeline helpers."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from kernels.optim import reference as ref

SHAPE = (7, 13)


def _sgd(p, g, s):
    ref.sgd_step_(p, g, s[0], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, decoupled_weight_decay=False)


def _adamw(p, g, s):
    ref.adamw_step_(p, g, s[0], s[1], lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, step=3)


def _radam(p, g, s):
    ref.radam_step_(p, g, s[0], s[1], lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, step=30)


def _lion(p, g, s):
    ref.lion_step_(p, g, s[0], lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.1)


STEPS = [
    pytest.param(_sgd, 1, id="sgd"),
    pytest.param(_adamw, 2, id="adamw"),
    pytest.param(_radam, 2, id="radam"),
    pytest.param(_lion, 1, id="lion"),
]


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("step_fn,n_state", STEPS)
def test_low_precision_param_is_updated_in_fp32_and_rounded_once(
    step_fn: Callable, n_state: int, low: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(0)
    p_low = torch.randn(SHAPE, generator=gen).to(low)
    g = torch.randn(SHAPE, generator=gen)
    state = [torch.rand(SHAPE, generator=gen) for _ in range(n_state)]  # non-negative: valid exp_avg_sq
    p_init, p32, state32 = p_low.clone(), p_low.float(), [s.clone() for s in state]

    step_fn(p_low, g, state)
    step_fn(p32, g, state32)

    assert p_low.dtype == low and all(s.dtype == torch.float32 for s in state)
    assert torch.equal(p_low, p32.to(low))
    for s, s32 in zip(state, state32, strict=True):
        assert torch.equal(s, s32)
    assert not torch.equal(p_low, p_init)


@pytest.mark.parametrize("step_fn,n_state", STEPS)
def test_step_never_writes_to_the_grad(step_fn: Callable, n_state: int) -> None:
    p, g = torch.randn(SHAPE), torch.randn(SHAPE)
    g0 = g.clone()
    step_fn(p, g, [torch.rand(SHAPE) for _ in range(n_state)])
    assert torch.equal(g, g0)


def test_effective_grad_scales_adds_noise_and_leaves_grad_alone() -> None:
    grad = torch.randn(SHAPE, dtype=torch.bfloat16)
    grad0 = grad.clone()
    out = ref.effective_grad(grad, scale=torch.tensor(0.5), noise_std=0.0, generator=None)
    assert out.dtype == torch.float32 and torch.equal(out, grad.float() * 0.5)
    noisy = ref.effective_grad(grad, scale=None, noise_std=0.1, generator=torch.Generator().manual_seed(1))
    expected_noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1)) * 0.1
    torch.testing.assert_close(noisy - grad.float(), expected_noise)
    assert torch.equal(grad, grad0)


def test_global_grad_norm_mixed_dtypes_and_empty() -> None:
    grads = [torch.randn(3, 5).to(torch.bfloat16), torch.randn(11), torch.randn(1, 2, 3)]
    expected = torch.cat([g.double().flatten() for g in grads]).norm()
    norm = ref.global_grad_norm(grads)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    torch.testing.assert_close(norm.double(), expected, rtol=1e-6, atol=0)
    assert ref.global_grad_norm([]).item() == 0.0


@pytest.mark.parametrize("norm,expected", [(10.0, 0.1), (0.5, 1.0), (math.nan, math.nan)], ids=["clip", "keep", "nan"])
def test_clip_scale(norm: float, expected: float) -> None:
    scale = ref.clip_scale(torch.tensor(norm), 1.0).item()
    assert scale == pytest.approx(expected, rel=1e-5, nan_ok=True)


def test_grad_noise_std_schedule() -> None:
    assert ref.grad_noise_std(0.3, 0.55, 0) == pytest.approx(math.sqrt(0.3))
    assert ref.grad_noise_std(0.3, 0.55, 9) == pytest.approx(math.sqrt(0.3 / 10**0.55))
    assert ref.grad_noise_std(0.0, 0.55, 5) == 0.0
