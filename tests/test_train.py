"""The trainer: schedule, learning, divergence, time budget, determinism, curve, evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nas.train as train_module
from nas.models import build
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from nas.tasks import IGNORE_INDEX, Task
from nas.train import (
    CURVE_POINTS,
    INTERVAL_COVERAGE,
    Budget,
    TrainingDiverged,
    accuracy_interval,
    evaluate,
    lr_factor,
    train,
    train_population,
)

CPU = torch.device("cpu")
V, T = 16, 16


def previous_token_task(n_train: int = 512, n_test: int = 128) -> Task:
    """y[t] = x[t-1]: needs a token mixer, learnable in a few dozen steps. Position 0 is unscored."""
    g = torch.Generator().manual_seed(0)

    def split(n):
        x = torch.randint(0, V, (n, T), generator=g)
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, 1:] = x[:, :-1]
        return x, y

    return Task("previous_token", {}, V, V, "token", *split(n_train), *split(n_test))


ARCH = ArchSpec(32, (LayerSpec("attention", heads=2, mlp_ratio=2.0),), V, V)


# ---------------------------------------------------------------- schedule


@pytest.mark.parametrize(
    "step, want",
    [
        (0, 0.1),
        (4, 0.5),
        (9, 1.0),  # warmup: (step + 1) / 10
        (10, 1.0),
        (40, 0.75),
        (55, 0.5),
        (70, 0.25),  # cosine over the 90 steps after warmup
        (100, 0.0),
        (130, 0.0),  # ends at zero and stays there
    ],
    ids=lambda v: str(v),
)
def test_lr_factor_warmup_then_cosine(step, want):
    spec = TrainSpec(steps=100, warmup_frac=0.1)  # 10 warmup steps
    assert lr_factor(step, spec) == pytest.approx(want, abs=1e-12)


def test_lr_factor_without_warmup():
    spec = TrainSpec(steps=4, warmup_frac=0.0)
    got = [lr_factor(s, spec) for s in range(5)]
    want = [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 - math.cos(math.pi / 4)), 0.0]
    assert got == pytest.approx(want, abs=1e-12)
    # a warmup shorter than one step is no warmup: int(0.1 · 5) = 0
    assert lr_factor(0, TrainSpec(steps=5, warmup_frac=0.1)) == 1.0


# ---------------------------------------------------------------- learning


def test_tiny_model_learns_an_easy_task():
    task = previous_token_task()
    model = build(ARCH, task, seed=0)
    before, loss_before = evaluate(model, task, CPU)
    result = train(model, task, TrainSpec(lr=1e-2, steps=60, batch_size=32), device="cpu")
    assert before < 0.15  # chance is 1/16
    assert result.accuracy > 0.8, result
    assert result.test_loss < loss_before - 1.0
    assert (result.steps, result.stopped) == (60, "completed") and result.seconds > 0
    assert result.curve[-1][1] < result.curve[0][1]
    assert (result.accuracy, result.test_loss) == pytest.approx(evaluate(model, task, CPU))


def test_same_seeds_give_identical_runs():
    task = previous_token_task(n_train=128, n_test=32)
    spec = TrainSpec(lr=1e-2, steps=20, batch_size=8, grad_noise=0.01, seed=3)
    a = train(build(ARCH, seed=1), task, spec, device="cpu")
    b = train(build(ARCH, seed=1), task, spec, device="cpu")
    assert (a.accuracy, a.test_loss, a.steps, a.curve) == (b.accuracy, b.test_loss, b.steps, b.curve)
    other_batches = train(build(ARCH, seed=1), task, TrainSpec(**{**spec.to_dict(), "seed": 4}), device="cpu")
    other_init = train(build(ARCH, seed=2), task, spec, device="cpu")
    assert other_batches.curve != a.curve and other_init.curve != a.curve


# ---------------------------------------------------------------- divergence


class _Poison(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (inf → an inf grad norm)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class Saboteur(nn.Module):
    """Wraps a model; from its ``at``-th training forward on, poisons the ``what``: "loss" (NaN logits)
    or "gradient" (finite logits, inf gradients)."""

    def __init__(self, inner: nn.Module, at: int, what: str) -> None:
        super().__init__()
        self.inner, self.at, self.what, self.calls = inner, at, what, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if self.training:
            self.calls += 1
            if self.calls >= self.at:
                out = out * float("nan") if self.what == "loss" else _Poison.apply(out, float("inf"))
        return out


def test_nan_loss_raises_naming_the_loss_and_the_window():
    task = previous_token_task(n_train=64, n_test=16)
    model = Saboteur(build(ARCH, seed=0), at=20, what="loss")
    with pytest.raises(TrainingDiverged, match=r"^loss became NaN/inf within steps 17-32$") as err:
        train(model, task, TrainSpec(steps=40, batch_size=4), device="cpu")
    assert err.value.step == 32  # checked every CHECK_EVERY = 16 steps


def test_inf_gradient_raises_naming_the_gradient():
    """Poisoned on the last step only: every loss is finite, the gradient norm is not."""
    task = previous_token_task(n_train=64, n_test=16)
    model = Saboteur(build(ARCH, seed=0), at=10, what="gradient")
    with pytest.raises(TrainingDiverged, match=r"^gradient norm became NaN/inf within steps 1-10$") as err:
        train(model, task, TrainSpec(steps=10, batch_size=4), device="cpu")
    assert err.value.step == 10


def test_huge_learning_rate_diverges():
    task = previous_token_task(n_train=64, n_test=16)
    spec = TrainSpec(optimizer="sgd", lr=1e6, grad_clip=0.0, steps=64, batch_size=8)
    with pytest.raises(TrainingDiverged, match=r"(loss|gradient norm) became NaN/inf"):
        train(build(ARCH, seed=0), task, spec, device="cpu")


class Overconfident(nn.Module):
    """From training forward ``at`` on (or, with ``at`` 0, in eval mode only) every position puts a
    logit of 1e5 on class 0: a finite loss of about 1e5 wherever the target is another class."""

    def __init__(self, classes: int, at: int) -> None:
        super().__init__()
        self.classes, self.at, self.calls = classes, at, 0
        self.p = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        logits = torch.zeros(*x.shape, self.classes) + self.p
        wild = (self.at and self.training and self.calls >= self.at) or (not self.at and not self.training)
        if wild:
            logits[..., 0] = logits[..., 0] + 1e5
        return logits


def test_a_finite_loss_far_above_a_uniform_guess_is_a_divergence():
    """At lr 1e5 RAdam's loss climbed to 1e9 without reaching inf: the trial was recorded as
    completed and led the front (found by a new-user audit)."""
    task = previous_token_task(n_train=64, n_test=16)
    ceiling = 100 * math.log(V)
    said = rf"^loss reached [0-9.]+e\+0[45] within steps 17-32, over 100x a uniform guess's loss \({ceiling:.3g}\)"
    with pytest.raises(TrainingDiverged, match=said) as err:
        train(Overconfident(V, at=20), task, TrainSpec(steps=40, batch_size=4), device="cpu")
    assert err.value.step == 32
    with pytest.raises(TrainingDiverged, match=r"^test loss 9\.\d+e\+04 is over 100x a uniform guess's loss"):
        train(Overconfident(V, at=0), task, TrainSpec(steps=8, batch_size=4), device="cpu")
    spec = TrainSpec(optimizer="radam", lr=1e5, grad_clip=1.0, steps=20, batch_size=8)
    with pytest.raises(TrainingDiverged, match=r"loss reached .* within steps 1-16, over 100x|became NaN/inf"):
        train(build(ARCH, seed=0), task, spec, device="cpu")


# ---------------------------------------------------------------- budget and curve


def test_time_budget_stops_early():
    task = previous_token_task(n_train=64, n_test=16)
    spec = TrainSpec(steps=50, batch_size=4)
    result = train(build(ARCH, seed=0), task, spec, device="cpu", budget=Budget(max_seconds=1e-9))
    assert result.stopped == "time budget"
    assert 1 <= result.steps < spec.steps
    assert 0.0 <= result.accuracy <= 1.0 and math.isfinite(result.test_loss)


def test_the_guard_counts_from_the_end_of_the_first_step():
    """A first step slowed by one-off set-up (here a 1 s pause before it) does not spend the guard;
    the same pause before a later step does."""
    import time

    task = previous_token_task(n_train=64, n_test=16)
    spec = TrainSpec(steps=6, batch_size=4)

    def pause_before(n: int):
        return lambda step: time.sleep(1.0) if step == n else None

    budget = Budget(max_seconds=0.5)
    first = train(build(ARCH, seed=0), task, spec, device="cpu", budget=budget, step_hook=pause_before(1))
    assert first.stopped == "completed" and first.steps == spec.steps and first.seconds >= 1.0
    later = train(build(ARCH, seed=0), task, spec, device="cpu", budget=budget, step_hook=pause_before(3))
    assert later.stopped == "time budget" and later.steps == 3


class ScriptedLoss(nn.Module):
    """Training forward k (1-based) gives every position logits [0.1·k, 0, …, 0]: with target 0
    its loss is log(1 + (C-1)·e^(-0.1k)) whatever the batch, so the curve is known in advance."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.classes, self.calls = classes, 0
        self.p = nn.Parameter(torch.zeros(()))  # something for the optimizer to hold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        logits = torch.zeros(*x.shape, self.classes)
        logits[..., 0] = 0.1 * self.calls
        return logits + 0 * self.p

    def loss_at(self, k: int) -> float:
        return math.log1p((self.classes - 1) * math.exp(-0.1 * k))


@pytest.mark.parametrize("steps, window", [(100, 5), (45, 2), (20, 1), (7, 1)], ids=lambda v: str(v))
def test_curve_is_window_means_labelled_by_their_last_step(steps, window):
    task = previous_token_task(n_train=32, n_test=8)
    task = Task(
        "zeros",
        {},
        V,
        V,
        "token",
        task.x_train,
        torch.zeros_like(task.y_train),
        task.x_test,
        torch.zeros_like(task.y_test),
    )
    model = ScriptedLoss(V)
    result = train(model, task, TrainSpec(steps=steps, batch_size=4), device="cpu")
    assert window == max(1, steps // CURVE_POINTS)
    assert [s for s, _ in result.curve] == list(range(window, steps + 1, window))
    if steps % CURVE_POINTS == 0:
        assert len(result.curve) == CURVE_POINTS
    for end, got in result.curve:
        want = sum(model.loss_at(k) for k in range(end - window + 1, end + 1)) / window
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), end  # fp32 cross-entropy


# ---------------------------------------------------------------- evaluate


class FixedLogits(nn.Module):
    """Row i of the input carries i at position 0; the model answers ``table[i]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x[:, 0]]


def test_evaluate_counts_only_scored_positions_by_hand():
    # 2 rows × 3 positions, 2 classes; the model always prefers class 0 with probability e/(e+1)
    logits = torch.tensor([[[1.0, 0.0]] * 3] * 2)
    y = torch.tensor([[0, IGNORE_INDEX, 1], [IGNORE_INDEX, IGNORE_INDEX, 1]])
    x = torch.tensor([[0, 0, 0], [1, 1, 1]])
    task = Task("hand", {}, 2, 2, "token", x, y, x, y)
    accuracy, loss = evaluate(FixedLogits(logits), task, CPU)
    assert accuracy == pytest.approx(1 / 3)  # one right of three scored; the ignored ones count for nothing
    right, wrong = math.log1p(math.exp(-1)), math.log1p(math.exp(1))  # -log p(0), -log p(1)
    assert loss == pytest.approx((right + 2 * wrong) / 3)


@pytest.mark.parametrize("eval_batch", [1, 3, 256], ids=lambda b: f"batch{b}")
@pytest.mark.parametrize("readout", ["token", "last"])
def test_evaluate_is_the_mean_over_scored_positions_across_batches(monkeypatch, eval_batch, readout):
    """Rows score different numbers of positions, and rows 5-6 none at all: a batch holding only
    those must neither turn the loss into NaN nor weigh rows instead of positions."""
    monkeypatch.setattr(train_module, "EVAL_BATCH", eval_batch)
    g = torch.Generator().manual_seed(0)
    N, C = 7, 5
    x = torch.arange(N).unsqueeze(1).repeat(1, 9)
    if readout == "token":
        logits = torch.randn(N, 9, C, generator=g)
        y = torch.randint(0, C, (N, 9), generator=g)
        y[torch.rand(N, 9, generator=g) < 0.5] = IGNORE_INDEX
        y[5:] = IGNORE_INDEX
    else:
        logits = torch.randn(N, C, generator=g)
        y = torch.randint(0, C, (N,), generator=g)
        y[5:] = IGNORE_INDEX
    task = Task("hand", {}, N, C, readout, x, y, x, y)
    flat_logits, flat_y = logits.reshape(-1, C), y.reshape(-1)
    scored = flat_y != IGNORE_INDEX
    want_acc = (flat_logits.argmax(-1)[scored] == flat_y[scored]).float().mean().item()
    want_loss = F.cross_entropy(flat_logits[scored], flat_y[scored]).item()
    accuracy, loss = evaluate(FixedLogits(logits), task, CPU)
    assert accuracy == pytest.approx(want_acc)
    assert loss == pytest.approx(want_loss, rel=1e-6)


def test_compiled_training_matches_eager(monkeypatch):
    """NAS_TRAIN_COMPILE=1 trains through torch.compile (inductor; ~25 s on a CI core): same
    data, same optimizer, so the same test loss to float rounding."""
    from nas.tasks import load_task

    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=64,n_test=32")
    spec = TrainSpec("adamw", 3e-3, 0.0, 0.0, 20, 8)
    arch = ArchSpec(32, [LayerSpec("attention", 2, None, 0, 2.0)], task.vocab_size, task.vocab_size)
    eager = train(build(arch, task, seed=0), task, spec, device="cpu")
    monkeypatch.setenv("NAS_TRAIN_COMPILE", "1")
    calls = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: calls.append(m) or real_compile(m, **kw))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = train(build(arch, task, seed=0), task, spec, device="cpu")
    assert len(calls) == 1
    assert counters["stats"]["unique_graphs"] > 0, "the training forward never ran through the compiled model"
    assert compiled.steps == eager.steps
    assert compiled.test_loss == pytest.approx(eager.test_loss, rel=1e-4)


# ---------------------------------------------------------------- rungs (early stopping)


@pytest.mark.parametrize("steps, want", [(16, (2, 4, 8)), (5, (1, 2)), (2, (1,)), (1, ())], ids=str)
def test_rung_steps_are_fractions_of_the_planned_steps(steps, want):
    assert train_module.rung_steps(steps) == want


def test_rungs_are_reported_without_changing_the_training():
    task = previous_token_task(n_train=128, n_test=32)
    spec = TrainSpec(lr=1e-2, steps=16, batch_size=8, seed=3)
    seen = []
    asked = train(build(ARCH, seed=1), task, spec, device="cpu", on_rung=lambda s, a: seen.append((s, a)) is not None)
    plain = train(build(ARCH, seed=1), task, spec, device="cpu")
    assert [s for s, _ in seen] == [2, 4, 8] and all(0.0 <= a <= 1.0 for _, a in seen)
    assert (asked.accuracy, asked.test_loss, asked.curve) == (plain.accuracy, plain.test_loss, plain.curve)


def test_a_rung_that_says_stop_stops_with_the_partial_curve():
    task = previous_token_task(n_train=128, n_test=32)
    spec = TrainSpec(lr=1e-2, steps=16, batch_size=8)
    with pytest.raises(train_module.TrainingStopped) as stop:
        train(build(ARCH, seed=1), task, spec, device="cpu", on_rung=lambda step, _acc: step >= 4)
    assert stop.value.step == 4 and [s for s, _ in stop.value.curve] == [1, 2, 3, 4]
    assert 0.0 <= stop.value.accuracy <= 1.0 and stop.value.seconds > 0


# ---------------------------------------------------------------- length curriculum


class LengthRecorder(nn.Module):
    """Wraps a model and records the sequence length of every training forward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.lengths = inner, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.lengths.append(x.shape[1])
        return self.inner(x)


def test_a_curriculum_task_trains_its_first_steps_on_the_short_rows_then_the_full_ones():
    """Task.stage1_frac of the steps (the first ones) draw from x_stage1; evaluation and the rest
    use the full-length rows; a task without a stage 1 trains exactly as before."""
    from nas.tasks import load_task

    task = load_task(
        "mqar:vocab_size=32,seq_len=40,num_kv_pairs=4,n_train=64,n_test=16,curriculum_len=16,curriculum_frac=0.3"
    )
    assert tuple(task.x_stage1.shape) == (64, 16) and task.stage1_steps(20) == 6
    arch = ArchSpec(32, (LayerSpec("attention", heads=2, mlp_ratio=2.0),), 32, 32)
    model = LengthRecorder(build(arch, seed=0))
    train(model, task, TrainSpec(lr=1e-3, steps=20, batch_size=4, seed=0), device="cpu")
    assert model.lengths == [16] * 6 + [40] * 14
    plain = load_task("mqar:vocab_size=32,seq_len=40,num_kv_pairs=4,n_train=64,n_test=16")
    assert plain.stage1_steps(20) == 0 and plain.x_stage1 is None
    assert torch.equal(plain.x_train, task.x_train) and torch.equal(plain.x_test, task.x_test)
    model = LengthRecorder(build(arch, seed=0))
    train(model, plain, TrainSpec(lr=1e-3, steps=5, batch_size=4, seed=0), device="cpu")
    assert model.lengths == [40] * 5


@pytest.mark.parametrize(
    "steps, start, want", [(1200, 840, (885, 930, 1020)), (16, 0, (2, 4, 8)), (20, 6, (8, 10, 13)), (8, 7, ())]
)
def test_rungs_of_a_curriculum_fall_in_its_last_stage(steps, start, want):
    assert train_module.rung_steps(steps, start) == want


def test_a_curriculum_training_reports_its_rungs_after_the_short_rows():
    """Rungs are scored at the task's full length: none comes while training draws short rows."""
    from nas.tasks import load_task

    task = load_task(
        "mqar:vocab_size=32,seq_len=40,num_kv_pairs=4,n_train=64,n_test=16,curriculum_len=16,curriculum_frac=0.3"
    )
    arch = ArchSpec(32, (LayerSpec("attention", heads=2, mlp_ratio=2.0),), 32, 32)
    model = LengthRecorder(build(arch, seed=0))
    seen = []

    def on_rung(step: int, accuracy: float) -> bool:
        seen.append((step, len(model.lengths), model.lengths[-1]))
        return False

    train(model, task, TrainSpec(lr=1e-3, steps=20, batch_size=4, seed=0), device="cpu", on_rung=on_rung)
    assert [s for s, _, _ in seen] == [8, 10, 13]  # 6 short steps, then 1/8, 1/4, 1/2 of the other 14
    assert all(n == s and length == 40 for s, n, length in seen)  # each after a full-length step


# ---------------------------------------------------------------- populations (seeds x learning rates)


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def test_a_one_by_one_population_is_the_single_run():
    task = previous_token_task()
    spec = TrainSpec(lr=1e-2, steps=30, batch_size=16, seed=5)
    alone = build(ARCH, task, seed=5)
    single = train(alone, task, spec, device="cpu")
    pop = train_population(ARCH, task, spec, device="cpu")
    assert (pop.accuracy, pop.test_loss, pop.curve) == (single.accuracy, single.test_loss, single.curve)
    assert pop.interval is None and pop.accuracies == ((single.accuracy,),)
    assert all(torch.equal(a, b) for a, b in zip(_weights(pop.model), _weights(alone), strict=True))


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_each_variant_trains_as_it_would_alone(optimizer):
    """Variant (seed s, lr·m) of a 2 x 2 population ends where ``train`` of ``build(seed=s)`` at
    lr·m ends (to rounding): its own initialisation, batches and learning rate."""
    task = previous_token_task()
    spec = TrainSpec(optimizer=optimizer, lr=1e-2, steps=25, batch_size=16, seed=5, seeds=2, lr_multipliers=(0.5, 2.0))
    pop = train_population(ARCH, task, spec, device="cpu")
    seed_index, multiplier, accuracy = pop.kept
    seed = spec.variant_seeds()[seed_index]
    alone = build(ARCH, task, seed=seed)
    result = train(alone, task, TrainSpec(**{**spec.to_dict(), "seed": seed, "lr": spec.lr * multiplier}), device="cpu")
    assert result.accuracy == pytest.approx(accuracy, abs=2 / 128)
    for a, b in zip(_weights(pop.model), _weights(alone), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)  # Adam magnifies the batched sums' rounding
    means = [sum(row) / 2 for row in pop.accuracies]
    assert pop.accuracy == max(means) and pop.best_multiplier == spec.lr_multipliers[means.index(max(means))]
    assert pop.interval is not None and pop.interval >= 1 / task.scored_targets


def test_a_diverging_learning_rate_is_left_out_and_the_others_score():
    task = previous_token_task()
    spec = TrainSpec(optimizer="sgd", lr=1e-2, steps=20, batch_size=16, grad_clip=0.0, lr_multipliers=(1.0, 1e6))
    pop = train_population(ARCH, task, spec, device="cpu")
    assert pop.accuracies[1] == (None,) and pop.accuracies[0][0] is not None
    assert pop.best_multiplier == 1.0 and pop.accuracy == pop.accuracies[0][0]


def test_a_population_whose_every_learning_rate_diverged_diverges():
    task = previous_token_task()
    spec = TrainSpec(
        optimizer="sgd", lr=1e5, steps=20, batch_size=16, grad_clip=0.0, seeds=2, lr_multipliers=(1.0, 2.0)
    )
    with pytest.raises(TrainingDiverged, match="at every learning rate"):
        train_population(ARCH, task, spec, device="cpu")


def test_the_interval_is_a_t_prediction_interval_from_the_pooled_spread_over_seeds():
    # lr 1: seeds 0.5, 0.7 (ss 0.02); lr 2: 0.4, 0.4 (ss 0); 2 degrees of freedom: sd 0.1;
    # t(2, 0.95) = 2.919986 (a table's value), times sqrt(2 / 2 seeds) = 1
    assert INTERVAL_COVERAGE == 0.90
    assert accuracy_interval([[0.5, 0.7], [0.4, 0.4]], 0.001) == pytest.approx(2.919986 * 0.1, rel=1e-6)
    # 3 seeds at one lr: sd 0.1 over 2 dof, times sqrt(2 / 3)
    assert accuracy_interval([[0.5, 0.6, 0.7]], 0.001) == pytest.approx(2.919986 * 0.1 * (2 / 3) ** 0.5, rel=1e-6)
    assert accuracy_interval([[0.5, 0.5]], 0.01) == 0.01  # never below the test set's resolution
    assert accuracy_interval([[0.5], [0.7]], 0.01) is None  # one seed: no spread to measure
