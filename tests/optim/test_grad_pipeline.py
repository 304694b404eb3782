"""What step() does before the update: global-norm clipping, the exposed norm, annealed noise."""

from __future__ import annotations

import math

import pytest
import torch

from nas.optim import SGD, AdamW, GradOptions, Lion, RAdam
from tests.optim.problems import assert_moved, make_params, run_pair

MAX_NORM = 1.0
GRAD_SCALE = 2.0  # random grads over ~90 elements have norm ≈ 19 > MAX_NORM: clipping is active

OPTIMIZERS = [
    pytest.param(lambda g, **kw: SGD(g, momentum=0.9, **kw), id="sgd"),
    pytest.param(lambda g, **kw: AdamW(g, **kw), id="adamw"),
    pytest.param(lambda g, **kw: RAdam(g, **kw), id="radam"),
    pytest.param(lambda g, **kw: Lion(g, **kw), id="lion"),
]


def _clip_before_step(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    total = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], MAX_NORM)
    assert total > MAX_NORM, "the test problem must actually clip"


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_clipping_equals_clip_grad_norm_before_step(make) -> None:
    initial, clipped, preclipped = run_pair(
        lambda g: make(g, grad_options=GradOptions(max_norm=MAX_NORM)),
        lambda g: make(g),
        dtype=torch.float64,
        lr=0.01,
        weight_decay=0.1,
        before_b=_clip_before_step,
        grad_scale=GRAD_SCALE,
    )
    assert_moved(initial, clipped)
    for a, b in zip(clipped, preclipped, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_clipped_adamw_matches_torch_adamw_with_clip_grad_norm() -> None:
    _, ours, ref = run_pair(
        lambda g: AdamW(g, grad_options=GradOptions(max_norm=MAX_NORM)),
        lambda g: torch.optim.AdamW(g),
        dtype=torch.float32,
        lr=0.01,
        weight_decay=0.1,
        before_b=_clip_before_step,
        grad_scale=GRAD_SCALE,
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", OPTIMIZERS)
def test_clipping_below_threshold_changes_nothing(make) -> None:
    _, loose, unclipped = run_pair(
        lambda g: make(g, grad_options=GradOptions(max_norm=1e6)),
        lambda g: make(g),
        dtype=torch.float32,
        lr=0.01,
        weight_decay=0.1,
    )
    for a, b in zip(loose, unclipped, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("max_norm", [0.0, MAX_NORM], ids=["clip-off", "clip-on"])
def test_last_grad_norm_is_the_true_global_norm(max_norm: float) -> None:
    params = make_params(torch.float32)
    opt = AdamW(
        [{"params": params[:2]}, {"params": params[2:], "lr": 0.1}], grad_options=GradOptions(max_norm=max_norm)
    )
    assert opt.last_grad_norm is None
    for p in params:
        p.grad = torch.randn(p.shape) * GRAD_SCALE
    grads_before = [p.grad.clone() for p in params]
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads_before]))
    opt.step()
    torch.testing.assert_close(opt.last_grad_norm, expected, rtol=1e-6, atol=0)
    for p, g in zip(params, grads_before, strict=True):
        assert torch.equal(p.grad, g), "step() must not modify .grad"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("max_norm", [0.0, MAX_NORM], ids=["clip-off", "clip-on"])
def test_non_finite_grad_gives_non_finite_norm(bad: float, max_norm: float) -> None:
    params = make_params(torch.float32)
    opt = SGD(params, lr=0.1, grad_options=GradOptions(max_norm=max_norm))
    for p in params:
        p.grad = torch.randn(p.shape)
    params[3].grad[0] = bad
    opt.step()
    assert not torch.isfinite(opt.last_grad_norm)


def _noise_sgd(eta: float, seed: int = 7, n: int = 200_000) -> tuple[SGD, torch.Tensor]:
    """SGD with lr=1 and no momentum on a zero-grad param: each update is exactly −noise."""
    p = torch.zeros(n, requires_grad=True)
    p.grad = torch.zeros(n)
    return SGD([p], lr=1.0, grad_options=GradOptions(noise=eta, noise_gamma=0.55, seed=seed)), p


def _one_update(opt: SGD, p: torch.Tensor) -> torch.Tensor:
    before = p.detach().clone()
    opt.step()
    return p.detach() - before


def test_noise_std_follows_the_annealing_schedule() -> None:
    eta, gamma, later = 0.3, 0.55, 20
    opt, p = _noise_sgd(eta)
    updates = {}
    for t in range(later + 1):
        update = _one_update(opt, p)
        if t in (0, later):
            updates[t] = update
    for t, update in updates.items():
        # t counts earlier step() calls: the first call uses σ_0² = η.
        expected = math.sqrt(eta / (1 + t) ** gamma)
        assert update.std().item() == pytest.approx(expected, rel=0.02), f"t={t}"
        assert abs(update.mean().item()) < 5 * expected / math.sqrt(update.numel())


def test_noise_is_seeded_and_deterministic() -> None:
    first = [_one_update(*_noise_sgd(0.1, seed=3)) for _ in range(2)]
    other_seed = _one_update(*_noise_sgd(0.1, seed=4))
    assert torch.equal(first[0], first[1])
    assert not torch.allclose(first[0], other_seed)


def test_zero_eta_adds_no_noise() -> None:
    opt, p = _noise_sgd(0.0)
    for _ in range(3):
        opt.step()
    assert torch.count_nonzero(p) == 0


def test_noise_is_added_after_clipping() -> None:
    """Same seed, grad G vs grad 0: the updates differ by exactly the clipped G, so g·scale + noise."""
    n = 1000
    grad = torch.randn(n) * 10
    options = GradOptions(max_norm=MAX_NORM, noise=0.5, seed=11)
    updates = []
    for g in (grad, torch.zeros(n)):
        p = torch.zeros(n, requires_grad=True)
        p.grad = g.clone()
        SGD([p], lr=1.0, grad_options=options).step()
        updates.append(p.detach().clone())
    reference = torch.nn.Parameter(torch.zeros(n))
    reference.grad = grad.clone()
    torch.nn.utils.clip_grad_norm_([reference], MAX_NORM)
    torch.testing.assert_close(updates[1] - updates[0], reference.grad, rtol=1e-5, atol=1e-6)
    assert updates[1].std() > 0.3, "the noise must be there"
