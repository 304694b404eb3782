"""A population step (params ``[P, *]``, one lr per variant, clipped per variant) equals each
variant stepped alone at its own lr, for every optimizer, with clipping and weight decay."""

from __future__ import annotations

import pytest
import torch

from nas.optim import make_optimizer
from nas.spec import TrainSpec
from tests.optim.problems import SHAPES

MULTIPLIERS = (0.5, 1.0, 3.0)
RECIPES = [
    pytest.param(TrainSpec(optimizer="sgd", lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True), id="sgd"),
    pytest.param(TrainSpec(optimizer="adamw", lr=0.01, weight_decay=0.1), id="adamw"),
    pytest.param(TrainSpec(optimizer="radam", lr=0.01, weight_decay=0.1), id="radam"),
    pytest.param(TrainSpec(optimizer="lion", lr=0.003, weight_decay=0.1), id="lion"),
]


@pytest.mark.parametrize("clip", [0.0, 0.3], ids=["no-clip", "clip"])
@pytest.mark.parametrize("spec", RECIPES)
def test_a_population_step_is_each_variant_stepped_alone(spec, clip):
    spec = TrainSpec(**{**spec.to_dict(), "grad_clip": clip, "lr_multipliers": (1.0,)})
    P = len(MULTIPLIERS)
    gen = torch.Generator().manual_seed(0)
    stacked = [torch.randn(P, *s, generator=gen, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    alone = [[p[i].detach().clone().requires_grad_() for p in stacked] for i in range(P)]
    pop = make_optimizer(spec, stacked).population(MULTIPLIERS)
    singles = [
        make_optimizer(TrainSpec(**{**spec.to_dict(), "lr": spec.lr * m}), alone[i]) for i, m in enumerate(MULTIPLIERS)
    ]
    for step in range(12):
        grads = [torch.randn(P, *s, generator=gen, dtype=torch.float64) * (1 + step % 3) for s in SHAPES]
        for p, g in zip(stacked, grads, strict=True):
            p.grad = g.clone()
        for i in range(P):
            for p, g in zip(alone[i], grads, strict=True):
                p.grad = g[i].clone()
        pop.step()
        for i, opt in enumerate(singles):
            opt.step()
            torch.testing.assert_close(pop.last_grad_norm[i], opt.last_grad_norm, rtol=1e-12, atol=0)
    for i in range(P):
        for p, q in zip(stacked, alone[i], strict=True):
            torch.testing.assert_close(p[i], q, rtol=1e-10, atol=1e-12)


def test_a_population_needs_the_population_dim_on_every_param():
    params = [torch.zeros(3, 4, requires_grad=True), torch.zeros(2, 4, requires_grad=True)]
    with pytest.raises(ValueError, match="leading dim to be 3, got shape \\(2, 4\\)"):
        make_optimizer(TrainSpec(), params).population(MULTIPLIERS)


def _fused_vs_reference(spec: TrainSpec, device: str, dtype: torch.dtype) -> None:
    """The population stepped through the fused kernel (one launch per variant) against the
    reference math, same grads: equal to the kernel's own tolerance against the reference."""
    P = len(MULTIPLIERS)
    gen = torch.Generator().manual_seed(1)
    base = [torch.randn(P, *s, generator=gen).to(device=device, dtype=dtype) for s in SHAPES]
    fused = [b.clone().requires_grad_() for b in base]
    plain = [b.clone().requires_grad_() for b in base]
    opts = [make_optimizer(spec, params).population(MULTIPLIERS) for params in (fused, plain)]
    opts[0].fused, opts[1].fused = True, False
    for step in range(6):
        grads = [torch.randn(P, *s, generator=gen).to(device=device, dtype=dtype) * (1 + step) for s in SHAPES]
        for params in (fused, plain):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        for opt in opts:
            opt.step()
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("spec", RECIPES)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA is absent (conftest)")
def test_the_fused_kernel_steps_a_population_as_the_reference_does_interpreted(spec):
    """Under Triton's interpreter (CPU), each variant's fused launch equals the reference math."""
    _fused_vs_reference(TrainSpec(**{**spec.to_dict(), "grad_clip": 0.3}), "cpu", torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", RECIPES)
def test_the_fused_kernel_steps_a_population_as_the_reference_does_on_the_gpu(spec):
    _fused_vs_reference(TrainSpec(**{**spec.to_dict(), "grad_clip": 0.3}), "cuda", torch.float32)
