"""Captured training steps: after a few eager steps per stage, the whole step (forward, loss,
backward, clipping, the fused optimizer's launches) is captured once and replayed. The replayed
training is the eager one: on the CPU with a stand-in graph that replays by calling the captured
function (the logic: buffers, stages, optimizer values per step), on the GPU with CUDA graphs."""

from __future__ import annotations

import types

import pytest
import torch

import nas.train as train_module
from nas.models import build
from nas.optim import make_optimizer
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from nas.tasks import load_task
from nas.train import GRAPH_WARMUP, train, train_population

# small: the interpreter runs the fused optimizer on the CPU, slowly
TASK = "mqar:vocab_size=16,seq_len=12,num_kv_pairs=2,n_train=64,n_test=32"
CURRICULUM = TASK + ",curriculum_len=8,curriculum_frac=0.5"
ARCH = ArchSpec(
    16,
    (
        LayerSpec("attention", heads=2, mlp_ratio=0.0),
        LayerSpec("linear_attention", heads=2, feature_map="elu+1", short_conv=4, mlp_ratio=0.0),
    ),
    16,
    16,
)
RECIPES = [
    pytest.param(dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), id="sgd"),
    pytest.param(dict(optimizer="adamw", lr=3e-3, weight_decay=0.1), id="adamw"),
    pytest.param(dict(optimizer="radam", lr=3e-3, weight_decay=0.1), id="radam"),
    pytest.param(dict(optimizer="lion", lr=1e-3, weight_decay=0.1), id="lion"),
]


# On the CPU every fused-optimizer launch runs under the interpreter, so the CPU tests train the
# fewest steps that still replay more than one step in a row (plain: 4 replays after the warm-up)
# and replay inside both stages of a curriculum (3 steps each: 2 eager, then 1 replayed).
CPU_STEPS = 2 * GRAPH_WARMUP + 2


def _spec(recipe: dict, steps: int = 8, **extra) -> TrainSpec:
    return TrainSpec(**recipe, steps=steps, batch_size=8, seed=3, grad_clip=0.5, grad_noise=0.01, **extra)


def _fused_optimizers(monkeypatch) -> None:
    """The optimizers take the fused kernel (the interpreter on the CPU) as they do on a GPU, in
    one chunk per tensor: the interpreter's cost is per program, and these tests compare a replayed
    training with an eager one under the same launch (the kernels' own tests cover many chunks)."""
    from kernels.optim import configs

    monkeypatch.setattr(configs, "INTERPRETER", configs.StepConfig(block=4096, num_warps=4))

    def fused(spec, params):
        opt = make_optimizer(spec, params)
        opt.fused = True
        return opt

    monkeypatch.setattr(train_module, "make_optimizer", fused)


def _stand_in_graphs(monkeypatch) -> list:
    """Graphs on the CPU: ``_capture`` keeps the function and a replay calls it."""
    replays = []

    def capture(fn, device):
        def replay():
            replays.append(1)
            fn()

        return types.SimpleNamespace(replay=replay)

    monkeypatch.setattr(train_module, "_use_graphs", lambda device, compile_model: True)
    monkeypatch.setattr(train_module, "_capture", capture)
    return replays


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in model.parameters()]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA is absent (conftest)")
@pytest.mark.parametrize(
    "recipe, task_name",
    [pytest.param(r.values[0], TASK, id=f"plain-{r.id}") for r in RECIPES]
    + [pytest.param(RECIPES[1].values[0], CURRICULUM, id="curriculum-adamw")],
)
def test_replayed_steps_train_as_eager_steps_do(monkeypatch, recipe, task_name):
    task = load_task(task_name)
    spec = _spec(recipe, steps=CPU_STEPS)
    _fused_optimizers(monkeypatch)
    eager = build(ARCH, seed=0)
    want = train(eager, task, spec, device="cpu")
    replays = _stand_in_graphs(monkeypatch)
    replayed = build(ARCH, seed=0)
    got = train(replayed, task, spec, device="cpu")
    stages = 2 if task.stage1_steps(spec.steps) else 1
    assert len(replays) == spec.steps - stages * GRAPH_WARMUP  # every step past each stage's warm-up
    assert got.accuracy == want.accuracy and got.curve == want.curve
    for a, b in zip(_weights(replayed), _weights(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA is absent (conftest)")
def test_a_replayed_population_trains_as_its_eager_one(monkeypatch):
    task = load_task(TASK)
    spec = _spec(
        dict(optimizer="adamw", lr=3e-3, weight_decay=0.1), steps=CPU_STEPS, seeds=1, lr_multipliers=(0.5, 2.0)
    )
    _fused_optimizers(monkeypatch)
    want = train_population(ARCH, task, spec, device="cpu")
    replays = _stand_in_graphs(monkeypatch)
    got = train_population(ARCH, task, spec, device="cpu")
    assert len(replays) == spec.steps - GRAPH_WARMUP
    assert got.accuracies == want.accuracies and got.interval == want.interval
    for a, b in zip(_weights(got.model), _weights(want.model), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_group_off_the_fused_path_trains_eagerly(monkeypatch):
    """The reference optimizer path cannot be captured: the training stays eager, unchanged."""
    task = load_task(TASK)
    spec = _spec(RECIPES[1].values[0], steps=CPU_STEPS)
    want = train(build(ARCH, seed=0), task, spec, device="cpu")
    replays = _stand_in_graphs(monkeypatch)
    got = train(build(ARCH, seed=0), task, spec, device="cpu")
    assert replays == [] and got.accuracy == want.accuracy and got.curve == want.curve


# ---------------------------------------------------------------- on the GPU


def _gpu_pair(monkeypatch, task_name, spec, population=False):
    task = load_task(task_name)
    monkeypatch.setenv("NAS_TRAIN_GRAPHS", "0")
    if population:
        eager = train_population(ARCH, task, spec, device="cuda")
        eager_model = eager.model
    else:
        eager_model = build(ARCH, seed=0)
        eager = train(eager_model, task, spec, device="cuda")
    monkeypatch.setenv("NAS_TRAIN_GRAPHS", "1")
    counted = []
    real = train_module._capture
    monkeypatch.setattr(train_module, "_capture", lambda fn, device: counted.append(1) or real(fn, device))
    if population:
        captured = train_population(ARCH, task, spec, device="cuda")
        captured_model = captured.model
    else:
        captured_model = build(ARCH, seed=0)
        captured = train(captured_model, task, spec, device="cuda")
    assert counted, "no step was captured"
    return (eager, eager_model), (captured, captured_model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("task_name", [TASK, CURRICULUM], ids=["plain", "curriculum"])
def test_captured_training_matches_eager_on_the_gpu(monkeypatch, recipe, task_name):
    """Same kernels on the same tensors: equal up to the nondeterminism of the GPU's backward
    reductions (atomics in SDPA's backward), which bf16 autocast keeps small over 8 steps."""
    spec = _spec(recipe)
    (eager, eager_model), (captured, captured_model) = _gpu_pair(monkeypatch, task_name, spec)
    for a, b in zip(_weights(captured_model), _weights(eager_model), strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    assert abs(captured.accuracy - eager.accuracy) <= 0.1
    assert [s for s, _ in captured.curve] == [s for s, _ in eager.curve]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_population_matches_eager_on_the_gpu(monkeypatch):
    spec = _spec(dict(optimizer="adamw", lr=3e-3, weight_decay=0.1), seeds=2, lr_multipliers=(0.5, 1.0, 2.0))
    (eager, eager_model), (captured, captured_model) = _gpu_pair(monkeypatch, CURRICULUM, spec, population=True)
    for a, b in zip(_weights(captured_model), _weights(eager_model), strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    assert captured.steps == eager.steps == spec.steps
