"""Each optimizer against its definition: torch.optim for SGD/AdamW/RAdam, the paper for Lion."""

from __future__ import annotations

import pytest
import torch

from nas.optim import SGD, AdamW, Lion, RAdam, make_optimizer
from nas.spec import TrainSpec
from tests.optim.problems import STEPS, assert_moved, lr_lambda, make_params, run_pair, set_grads

# (dtype, rtol, atol): fp64 shows the math is the same, fp32 that the default dtype tracks it.
DTYPES = [
    pytest.param(torch.float64, 1e-6, 1e-12, id="fp64"),
    pytest.param(torch.float32, 1e-6, 1e-6, id="fp32"),
]


def _assert_close(a: list[torch.Tensor], b: list[torch.Tensor], rtol: float, atol: float) -> None:
    for pa, pb in zip(a, b, strict=True):
        torch.testing.assert_close(pa, pb, rtol=rtol, atol=atol)


SGD_CASES = [
    pytest.param(dict(momentum=0.0), id="plain"),
    pytest.param(dict(momentum=0.9), id="momentum"),
    pytest.param(dict(momentum=0.9, nesterov=True), id="nesterov"),
]


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_coupled_weight_decay_matches_torch(kw: dict, dtype: torch.dtype, rtol: float, atol: float) -> None:
    initial, ours, ref = run_pair(
        lambda g: SGD(g, decoupled_weight_decay=False, **kw),
        lambda g: torch.optim.SGD(g, **kw),
        dtype=dtype,
        lr=0.05,
        weight_decay=0.1,
    )
    assert_moved(initial, ours)
    _assert_close(ours, ref, rtol, atol)


def _decay_before_step(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Decoupled weight decay by hand, as the spec defines it: p ← p·(1 − lr·wd) on params with grads."""
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.mul_(1 - group["lr"] * group["decay"])


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_decoupled_weight_decay_matches_manual_decay(
    kw: dict, dtype: torch.dtype, rtol: float, atol: float
) -> None:
    def torch_sgd_without_decay(g: list[dict]) -> torch.optim.Optimizer:
        return torch.optim.SGD([{**group, "weight_decay": 0.0} for group in g], **kw)

    initial, ours, ref = run_pair(
        lambda g: SGD(g, **kw),
        torch_sgd_without_decay,
        dtype=dtype,
        lr=0.05,
        weight_decay=0.5,
        before_b=_decay_before_step,
    )
    assert_moved(initial, ours)
    _assert_close(ours, ref, rtol, atol)


def test_sgd_decoupled_and_coupled_decay_differ() -> None:
    """Guards the two tests above: the flag must change the trajectory when momentum is on."""
    _, coupled, decoupled = run_pair(
        lambda g: SGD(g, momentum=0.9, decoupled_weight_decay=False),
        lambda g: SGD(g, momentum=0.9),
        dtype=torch.float64,
        lr=0.05,
        weight_decay=0.5,
    )
    assert not torch.allclose(coupled[0], decoupled[0], rtol=1e-3)


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
@pytest.mark.parametrize("wd", [0.0, 0.1], ids=["wd0", "wd0.1"])
def test_adamw_matches_torch(wd: float, dtype: torch.dtype, rtol: float, atol: float) -> None:
    initial, ours, ref = run_pair(
        lambda g: AdamW(g, betas=(0.8, 0.99), eps=1e-6),
        lambda g: torch.optim.AdamW(g, betas=(0.8, 0.99), eps=1e-6),
        dtype=dtype,
        lr=0.01,
        weight_decay=wd,
    )
    assert_moved(initial, ours)
    _assert_close(ours, ref, rtol, atol)


@pytest.mark.parametrize("dtype,rtol,atol", DTYPES)
@pytest.mark.parametrize("wd", [0.0, 0.1], ids=["wd0", "wd0.1"])
def test_radam_matches_torch_decoupled(wd: float, dtype: torch.dtype, rtol: float, atol: float) -> None:
    # beta2 = 0.9 makes ρ_t cross 5 after a few steps, so both RAdam branches are exercised.
    initial, ours, ref = run_pair(
        lambda g: RAdam(g, betas=(0.9, 0.9)),
        lambda g: torch.optim.RAdam(g, betas=(0.9, 0.9), decoupled_weight_decay=True),
        dtype=dtype,
        lr=0.01,
        weight_decay=wd,
    )
    assert_moved(initial, ours)
    _assert_close(ours, ref, rtol, atol)


def _lion_paper(
    params: list[torch.Tensor],
    grads_per_step: list[list[torch.Tensor | None]],
    lrs: list[float],
    beta1: float,
    beta2: float,
    wd: float,
) -> list[torch.Tensor]:
    """Chen et al. 2023, Algorithm 2, in float64, one param group."""
    p = [x.detach().double().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    for grads, lr in zip(grads_per_step, lrs, strict=True):
        for i, g in enumerate(grads):
            if g is None:
                continue
            g = g.double()
            c = beta1 * m[i] + (1 - beta1) * g
            p[i] = p[i] - lr * (torch.sign(c) + wd * p[i])
            m[i] = beta2 * m[i] + (1 - beta2) * g
    return p


@pytest.mark.parametrize(
    "dtype,atol", [pytest.param(torch.float64, 1e-12, id="fp64"), pytest.param(torch.float32, 1e-5, id="fp32")]
)
def test_lion_matches_paper(dtype: torch.dtype, atol: float) -> None:
    params = make_params(dtype)
    initial = [p.detach().clone() for p in params]
    opt = Lion(params, lr=0.01, betas=(0.9, 0.99), weight_decay=0.3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    gen = torch.Generator().manual_seed(1)
    grads_per_step, lrs = [], []
    for t in range(STEPS):
        set_grads([params], t, gen)
        grads_per_step.append([None if p.grad is None else p.grad.clone() for p in params])
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert len(set(lrs)) > 10, "the schedule must change lr"
    expected = _lion_paper(initial, grads_per_step, lrs, 0.9, 0.99, 0.3)
    assert_moved(initial, params)
    for p, e in zip(params, expected, strict=True):
        torch.testing.assert_close(p.double(), e, rtol=1e-6, atol=atol)


@pytest.mark.parametrize("cls", [SGD, AdamW, RAdam, Lion], ids=lambda c: c.__name__)
def test_params_without_grad_are_untouched(cls: type) -> None:
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(5, requires_grad=True)
    b0 = b.detach().clone()
    opt = cls([a, b], lr=0.1, weight_decay=0.5)
    a.grad = torch.randn(4, 3)
    opt.step()
    assert torch.equal(b, b0)
    assert len(opt.state[b]) == 0


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: SGD(p, lr=-1.0), id="sgd-lr"),
        pytest.param(lambda p: SGD(p, nesterov=True), id="sgd-nesterov-without-momentum"),
        pytest.param(lambda p: AdamW(p, betas=(0.9, 1.0)), id="adamw-beta2"),
        pytest.param(lambda p: RAdam(p, eps=-1.0), id="radam-eps"),
        pytest.param(lambda p: Lion(p, weight_decay=-0.1), id="lion-wd"),
        pytest.param(lambda p: AdamW(p, fused="yes"), id="adamw-fused"),
    ],
)
def test_bad_hyperparameters_raise(make) -> None:
    with pytest.raises(ValueError):
        make([torch.zeros(2, requires_grad=True)])


@pytest.mark.parametrize("name,lr", [("sgd", 0.05), ("adamw", 0.05), ("radam", 0.05), ("lion", 0.01)])
def test_each_optimizer_fits_least_squares_via_closure(name: str, lr: float) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=gen)
    y = x @ torch.randn(5, 1, generator=gen) + 0.3
    model = torch.nn.Linear(5, 1)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    opt = make_optimizer(TrainSpec(optimizer=name, lr=lr, grad_noise=1e-4), model.parameters())

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    first = closure().item()
    for _ in range(150):
        last = opt.step(closure)
    assert last.item() < 0.05 * first
