"""A step whose per-step values are read from device memory (``rows_in_memory``: the form a
CUDA graph replays) gives the same numbers, bit for bit, as the fused step that passes them as
launch arguments: every optimizer, with clipping, weight decay and gradient noise, for one model
and for a population. On the GPU the ``launch`` half is captured once and replayed."""

from __future__ import annotations

import pytest
import torch

from nas.optim import make_optimizer
from nas.spec import TrainSpec
from tests.optim.problems import SHAPES

RECIPES = [
    pytest.param(TrainSpec(optimizer="sgd", lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True), id="sgd"),
    pytest.param(TrainSpec(optimizer="sgd", lr=0.05, weight_decay=0.0, momentum=0.0), id="sgd-plain"),
    pytest.param(TrainSpec(optimizer="adamw", lr=0.01, weight_decay=0.1), id="adamw"),
    pytest.param(TrainSpec(optimizer="radam", lr=0.01, weight_decay=0.1), id="radam"),
    pytest.param(TrainSpec(optimizer="lion", lr=0.003, weight_decay=0.1), id="lion"),
]
MULTIPLIERS = (0.5, 2.0)
STEPS = 8  # RAdam's rectification switches on at step 6 with its default betas


def _pair(spec: TrainSpec, device: str, population: bool):
    """Two optimizers over equal params: the argument form and the rows-in-memory form."""
    P = len(MULTIPLIERS)
    gen = torch.Generator().manual_seed(3)
    base = [torch.randn(*((P,) if population else ()), *s, generator=gen).to(device) for s in SHAPES]
    params = [[b.clone().requires_grad_() for b in base] for _ in range(2)]
    opts = []
    for ps in params:
        opt = make_optimizer(spec, ps)
        opt.fused = True
        opts.append(opt.population(MULTIPLIERS) if population else opt)
    opts[1].rows_in_memory()
    return params, opts, gen


def _grads(params, gen, step, device):
    grads = [torch.randn(p.shape, generator=gen).to(device) * (1 + step % 3) for p in params[0]]
    for ps in params:
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()


def _schedule(opts, step):
    for opt in opts:
        for group in opt.param_groups:
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * (1 - step / (2 * STEPS))  # a decaying lr


def _same_steps(spec: TrainSpec, device: str, population: bool) -> None:
    spec = TrainSpec(**{**spec.to_dict(), "grad_clip": 0.3, "grad_noise": 0.01})
    params, opts, gen = _pair(spec, device, population)
    for step in range(STEPS):
        _grads(params, gen, step, device)
        _schedule(opts, step)
        for opt in opts:
            opt.step()
        torch.testing.assert_close(opts[1].last_grad_norm, opts[0].last_grad_norm, rtol=0, atol=0)
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    for a, b in zip(opts[0].state.values(), opts[1].state.values(), strict=True):
        assert a.get("step") == b.get("step")


@pytest.mark.parametrize("population", [False, True], ids=["one", "population"])
@pytest.mark.parametrize("spec", RECIPES)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA is absent (conftest)")
def test_rows_in_memory_step_as_the_arguments_do_interpreted(spec, population):
    _same_steps(spec, "cpu", population)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("population", [False, True], ids=["one", "population"])
@pytest.mark.parametrize("spec", RECIPES)
def test_rows_in_memory_step_as_the_arguments_do_on_the_gpu(spec, population):
    _same_steps(spec, "cuda", population)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("population", [False, True], ids=["one", "population"])
@pytest.mark.parametrize("spec", RECIPES)
def test_a_captured_launch_replays_the_eager_steps(spec, population):
    """``launch`` captured in a CUDA graph after two eager steps, then ``prepare`` + replay per
    step: the same params as stepping eagerly throughout."""
    spec = TrainSpec(**{**spec.to_dict(), "grad_clip": 0.3, "grad_noise": 0.01})
    params, opts, gen = _pair(spec, "cuda", population)
    opts[0].rows_in_memory()  # both in the row form: one eager, one captured
    graph = None
    for step in range(STEPS):
        _grads(params, gen, step, "cuda")  # new grad tensors: copy them into the captured ones
        _schedule(opts, step)
        opts[0].step()
        if step < 2:
            opts[1].step()
            continue
        opts[1].prepare()
        if graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            static = [p.grad for p in params[1]]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side), torch.cuda.graph(graph):
                opts[1].launch()
            torch.cuda.current_stream().wait_stream(side)
            kept = static
        for p, g in zip(params[1], kept, strict=True):
            g.copy_(p.grad)
            p.grad = g
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_a_step_row_carries_the_arguments_bits():
    from kernels.optim.triton import ROW, step_row

    row = step_row("adamw", lr=0.1, weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-8, step=3, seed=12345)
    assert len(row) == ROW
    as_float = torch.tensor(row, dtype=torch.int32).view(torch.float32)
    assert as_float[0].item() == pytest.approx(0.1, rel=1e-7)  # lr
    assert as_float[9].item() == pytest.approx(0.1 / (1 - 0.9**3), rel=1e-6)  # step size
    assert row[14] == 12345
    with pytest.raises(ValueError, match="unknown rule"):
        step_row("adam", lr=0.1, weight_decay=0.0)


def test_rows_in_memory_refuses_a_group_off_the_fused_path():
    params = [torch.zeros(3, 4, requires_grad=True)]
    opt = make_optimizer(TrainSpec(optimizer="adamw"), params)
    opt.fused = False
    opt.rows_in_memory()
    params[0].grad = torch.ones(3, 4)
    with pytest.raises(ValueError, match="rows in memory need the fused kernel"):
        opt.step()
