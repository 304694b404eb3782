"""make_optimizer maps every TrainSpec field; state_dict round trips resume bit-identically."""

from __future__ import annotations

import io

import pytest
import torch

from nas.optim import SGD, AdamW, GradOptions, Lion, OptimizerBase, RAdam, make_optimizer
from nas.spec import OPTIMIZERS, TrainSpec
from tests.optim.problems import clone_params, make_params, set_grads

EXPECTED = {
    "sgd": (SGD, None),
    "adamw": (AdamW, (0.9, 0.999)),
    "radam": (RAdam, (0.9, 0.999)),
    "lion": (Lion, (0.9, 0.99)),
}


def test_every_spec_optimizer_is_covered() -> None:
    assert set(EXPECTED) == set(OPTIMIZERS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_make_optimizer_maps_fields_and_default_betas(name: str) -> None:
    spec = TrainSpec(
        optimizer=name,
        lr=3e-3,
        weight_decay=0.05,
        eps=1e-7,
        grad_clip=0.5,
        grad_noise=0.01,
        grad_noise_gamma=0.6,
        seed=9,
    )
    cls, betas = EXPECTED[name]
    opt = make_optimizer(spec, [torch.zeros(3, requires_grad=True)])
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (3e-3, 0.05)
    assert group.get("betas") == betas
    assert opt.grad_options == GradOptions(max_norm=0.5, noise=0.01, noise_gamma=0.6, seed=9)
    if name in ("adamw", "radam"):
        assert group["eps"] == 1e-7


@pytest.mark.parametrize("name", ["adamw", "radam", "lion"])
def test_make_optimizer_explicit_betas_override_defaults(name: str) -> None:
    default2 = EXPECTED[name][1][1]
    opt = make_optimizer(TrainSpec(optimizer=name, beta1=0.8), [torch.zeros(3, requires_grad=True)])
    assert opt.param_groups[0]["betas"] == (0.8, default2)
    opt = make_optimizer(TrainSpec(optimizer=name, beta1=0.7, beta2=0.95), [torch.zeros(3, requires_grad=True)])
    assert opt.param_groups[0]["betas"] == (0.7, 0.95)


def test_make_optimizer_sgd_fields() -> None:
    spec = TrainSpec(optimizer="sgd", momentum=0.8, nesterov=True, grad_clip=0.0, grad_noise=0.0)
    opt = make_optimizer(spec, [torch.zeros(3, requires_grad=True)])
    group = opt.param_groups[0]
    assert (group["momentum"], group["nesterov"], group["decoupled_weight_decay"]) == (0.8, True, True)
    assert opt.grad_options == GradOptions(max_norm=0.0, noise=0.0, noise_gamma=0.55, seed=0)


def _train(opt: OptimizerBase, params: list[torch.Tensor], steps: range, gen: torch.Generator) -> None:
    for t in steps:
        set_grads([params], t, gen)
        opt.step()


def _save_load(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _continue_and_resume(spec: TrainSpec, *, load: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Train 10 steps, checkpoint, train 10 more; then resume from the checkpoint (loading the
    optimizer state only if ``load``) and replay the same 10. Returns both final param lists."""
    params = make_params(torch.float32)
    opt = make_optimizer(spec, params)
    gen = torch.Generator().manual_seed(2)
    _train(opt, params, range(10), gen)
    saved_params, saved_state, gen_state = clone_params(params), _save_load(opt.state_dict()), gen.get_state()
    _train(opt, params, range(10, 20), gen)
    for a, s in zip(params, saved_params, strict=True):
        assert not torch.equal(a, s)

    resumed = clone_params(saved_params)
    opt2 = make_optimizer(spec, resumed)
    if load:
        opt2.load_state_dict(saved_state)
    gen.set_state(gen_state)
    _train(opt2, resumed, range(10, 20), gen)
    return params, resumed


# Noise on, so the generator state and the noise step must round-trip too.
_SPEC = dict(lr=1e-2, weight_decay=0.1, grad_clip=1.0, grad_noise=0.01, seed=5)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_dict_round_trip_resumes_identically(name: str) -> None:
    continued, resumed = _continue_and_resume(TrainSpec(optimizer=name, **_SPEC), load=True)
    for a, b in zip(continued, resumed, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_resume_without_state_differs(name: str) -> None:
    """Guards the round-trip test: a fresh optimizer (new moments, noise restarted) must differ."""
    continued, resumed = _continue_and_resume(TrainSpec(optimizer=name, **_SPEC), load=False)
    assert not torch.equal(continued[0], resumed[0])


def test_bf16_params_keep_fp32_state_across_load() -> None:
    params = make_params(torch.bfloat16)
    opt = AdamW(params, lr=1e-2)
    _train(opt, params, range(3), torch.Generator().manual_seed(2))
    saved = _save_load(opt.state_dict())
    opt2 = AdamW(clone_params(params), lr=1e-2)
    opt2.load_state_dict(saved)
    for p, p2 in zip(params, opt2.param_groups[0]["params"], strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt2.state[p2][key].dtype == torch.float32
            assert torch.equal(opt2.state[p2][key], opt.state[p][key])


def test_loading_a_torch_state_dict_is_refused() -> None:
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="nas_optim"):
        AdamW([p]).load_state_dict(torch.optim.AdamW([p]).state_dict())


def test_building_and_stepping_an_optimizer_does_not_import_dynamo() -> None:
    """Each optimizer's construction, zero_grad and step in a fresh process leave ``torch._dynamo``
    unimported (torch's _disable_dynamo wrapper would import it on the first call: seconds of every
    training process's start), and zero_grad still does what torch's does."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from nas.optim import make_optimizer\n"
        "from nas.spec import OPTIMIZERS, TrainSpec\n"
        "for name in OPTIMIZERS:\n"
        "    p = torch.nn.Parameter(torch.ones(3))\n"
        "    opt = make_optimizer(TrainSpec(optimizer=name, lr=0.1, steps=1, batch_size=1), [p])\n"
        "    p.grad = torch.ones(3); opt.step(); opt.zero_grad(set_to_none=False)\n"
        "    assert p.grad is not None and not p.grad.any(), name\n"
        "    opt.zero_grad(); assert p.grad is None, name\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
