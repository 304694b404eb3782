"""Train one candidate with the library's optimizers and score it on the held-out split."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kernels.device import is_cuda
from nas import settings
from nas.models import Population, build
from nas.optim import make_optimizer
from nas.spec import ArchSpec, TrainSpec
from nas.tasks.base import Task

__all__ = [
    "RUNGS",
    "INTERVAL_COVERAGE",
    "Budget",
    "PopulationResult",
    "TrainResult",
    "TrainingDiverged",
    "TrainingOOM",
    "TrainingStopped",
    "TrialTimeout",
    "accuracy_interval",
    "evaluate",
    "evaluate_stored",
    "evaluate_variants",
    "lr_factor",
    "rung_steps",
    "train",
    "train_population",
]

logger = logging.getLogger(__name__)

CURVE_POINTS = 20  # learning-curve samples per run
COMPILE_ENV = "NAS_TRAIN_COMPILE"  # "1": train through torch.compile (see train)
CHECK_EVERY = 16  # steps between non-finite checks: one host sync per window, not per step
EVAL_BATCH = 256
RUNGS = (1 / 8, 1 / 4, 1 / 2)  # fractions of the planned steps where ``on_rung`` is asked whether to go on
RUNG_ROWS = 256  # test rows scored at a rung: a cheap estimate (±3 % at 256 rows), not the final score
# A loss this many times a uniform guess's (ln of the outputs) is a diverged run, though finite: at
# lr 1e5 RAdam's and SGD's losses climbed from 2.8 to 1e9-1e11 without reaching inf, and such a
# trial was recorded as completed and led the front. A working model never comes near it.
DIVERGED_LOSS_FACTOR = 100.0


class TrainingDiverged(RuntimeError):
    """Loss or gradient norm became NaN/inf; ``step`` is the first window where it was seen."""

    def __init__(self, reason: str, step: int) -> None:
        super().__init__(reason)
        self.step = step


class TrainingOOM(RuntimeError):
    """The device ran out of memory; the message names the batch size and step."""


class TrialTimeout(RuntimeError):
    """The trial's hard deadline passed during training."""


class TrainingStopped(RuntimeError):
    """``on_rung`` asked to stop at ``step`` (early stopping): the rung's accuracy and the
    learning curve so far come with it, so the partial run can be recorded."""

    def __init__(self, step: int, accuracy: float, curve: tuple[tuple[int, float], ...], seconds: float) -> None:
        super().__init__(f"stopped at step {step} (rung accuracy {accuracy:.3f})")
        self.step, self.accuracy, self.curve, self.seconds = step, accuracy, curve, seconds


@dataclass(frozen=True)
class Budget:
    """``max_seconds``: stop training early and keep what was learned (None: no limit), counted from
    the end of the first step (its one-off set-up is not the candidate's training speed).
    ``deadline``: a ``time.monotonic()`` instant after which the trial is abandoned (TrialTimeout)."""

    max_seconds: float | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class TrainResult:
    """``accuracy`` is at the architecture's stored precision (``evaluate_stored``); where that is
    narrower than full precision, ``full_precision_accuracy`` is the same model's at its own
    (None at full precision: the two are one number)."""

    accuracy: float  # on the test split, over scored positions
    test_loss: float
    steps: int  # optimizer steps actually taken
    seconds: float
    stopped: str  # "completed" or "time budget"
    curve: tuple[tuple[int, float], ...] = field(default=())  # (step, mean train loss of the window)
    full_precision_accuracy: float | None = None


@dataclass(frozen=True)
class PopulationResult:
    """A candidate trained as a population (``train_population``): ``accuracy`` is the best
    learning rate's mean over seeds and ``interval`` the half-width of its interval (None with
    one seed: no spread to measure); ``accuracies[i][s]`` is (lr ``multipliers[i]``, seed
    ``seeds[s]``)'s accuracy, None where it diverged. ``model`` is ``kept``'s trained model:
    (seed index, lr factor, its own accuracy), the best seed at the best learning rate.

    Every accuracy is at the architecture's stored precision (``evaluate_stored``), and the best
    learning rate and kept seed are chosen on it; for an architecture stored narrower than full
    precision, ``full_precision_accuracy`` is the same learning rate's mean over the same seeds at
    the models' own precision (None at full precision), so the difference is the choice's cost."""

    accuracy: float
    interval: float | None
    test_loss: float  # the kept variant's
    steps: int
    seconds: float
    stopped: str
    curve: tuple[tuple[int, float], ...]  # the kept variant's
    best_multiplier: float
    seeds: tuple[int, ...]
    multipliers: tuple[float, ...]
    accuracies: tuple[tuple[float | None, ...], ...]
    kept: tuple[int, float, float]
    model: torch.nn.Module
    full_precision_accuracy: float | None = None


# The share of retrainings with fresh seeds the accuracy interval is meant to hold: a two-sided
# prediction interval for the mean of S new seeds, from S seeds' pooled spread (Student's t);
# benchmarks/population.py interval checks it on held-out candidates
# (benchmarks/results/population.json, part interval_cpu).
INTERVAL_COVERAGE = 0.90


def accuracy_interval(accuracies: list[list[float]], resolution: float) -> float | None:
    """The half-width of a population's accuracy interval, at least ``resolution`` and at most 1
    (the whole range of an accuracy); None when no
    learning rate has two seeds. ``accuracies``: each learning rate's seeds (S each).

    With s the standard deviation over seeds pooled across the learning rates (ν degrees of
    freedom), the mean of S fresh seeds differs from this mean by a t-distributed multiple of
    s·√(2/S): the half-width is t(ν, (1 + INTERVAL_COVERAGE) / 2)·s·√(2/S)."""
    from scipy.special import stdtrit  # noqa: PLC0415  (scipy is a dependency; load it only here)

    dof = sum(len(a) - 1 for a in accuracies)
    if dof < 1:
        return None
    ss = sum(sum((x - sum(a) / len(a)) ** 2 for x in a) for a in accuracies)
    seeds = max(len(a) for a in accuracies)
    t = float(stdtrit(dof, (1 + INTERVAL_COVERAGE) / 2))
    return min(1.0, max(resolution, t * math.sqrt(ss / dof) * math.sqrt(2 / seeds)))  # accuracy spans 1 at most


def lr_factor(step: int, spec: TrainSpec) -> float:
    """Linear warmup over ``warmup_frac·steps``, then cosine decay to zero at ``steps``."""
    warmup = int(spec.warmup_frac * spec.steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, spec.steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def rung_steps(steps: int, start: int = 0) -> tuple[int, ...]:
    """The steps (1-based, ascending, distinct, before the last) at which a training of ``steps``
    steps reports a rung: ``RUNGS`` of the steps after ``start``, rounded; none for a training too
    short to have them. ``start``: a length curriculum's first stage (``Task.stage1_steps``): a
    rung is scored at the task's full length, which a model still trained on the short rows has
    not been asked to solve, so its rungs fall in the last stage."""
    span = steps - start
    return tuple(sorted({start + round(f * span) for f in RUNGS} - {start, steps}))


def _autocast(device: torch.device) -> torch.autocast:
    # bf16 on GPU (no loss scaling needed); fp32 on CPU, where bf16 matmuls are slow. No cast
    # cache: a captured step must cast the weights it is replayed on (the same numbers either way)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=is_cuda(device), cache_enabled=False)


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, device: torch.device, rows: int | None = None) -> tuple[float, float]:
    """(accuracy, mean loss) of ``model`` over the scored positions of the test split (its first
    ``rows`` rows when given)."""
    accuracy, loss = evaluate_variants(model, task, device, rows)
    return accuracy[0].item(), loss[0].item()


@torch.no_grad()
def evaluate_variants(
    model: torch.nn.Module, task: Task, device: torch.device, rows: int | None = None, variants: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each variant's (accuracy, mean loss) ``[variants]`` over the scored positions of the test
    split (its first ``rows`` rows when given). ``model`` is one model, or a ``Population`` of
    ``variants`` that reads ``[variants·N, T]`` rows (every variant sees the same test rows)."""
    model.eval()
    hits = torch.zeros(variants, dtype=torch.long, device=device)
    total = torch.zeros(variants, dtype=torch.long, device=device)
    loss_sum = torch.zeros(variants, device=device)
    n = task.x_test.shape[0] if rows is None else min(rows, task.x_test.shape[0])
    for i in range(0, n, EVAL_BATCH):
        x, y = task.batch(slice(i, min(n, i + EVAL_BATCH)), split="test")
        with _autocast(device):
            logits = model(x.repeat(variants, *([1] * (x.dim() - 1))) if variants > 1 else x)
        per_variant = logits.reshape(variants, -1, *logits.shape[1:])  # [P, N, ...]
        for p in range(variants):
            h, t = task.correct(per_variant[p], y)
            hits[p] += h
            total[p] += t
            # Task.loss is the mean over this batch's scored positions, NaN when it has none: weight
            # it by their count so batches with more (or no) scored positions count as they should
            loss_sum[p] += torch.where(t > 0, task.loss(per_variant[p], y) * t, 0.0)
    model.train()
    return hits.float() / total.clamp(min=1), loss_sum / total.clamp(min=1)


@torch.no_grad()
def evaluate_stored(
    model: torch.nn.Module, task: Task, device: torch.device, skip: list[bool] | None = None
) -> list[float] | None:
    """Each variant's accuracy with its KV cache, recurrent state and weights rounded as its
    architecture's precision fields store them (``HybridModel.stored_precision``), over the whole
    test split; None for an architecture at full precision, where it is the plain evaluation's
    (and for a module that is no candidate: it has no architecture). ``model`` is one model or a
    ``Population``, whose variants are scored one at a time as plain models; a variant marked in
    ``skip`` (diverged) is not scored (NaN)."""
    arch = getattr(model, "arch", None)
    if arch is None or arch.full_precision:
        return None
    variants = model.size if isinstance(model, Population) else 1
    out = []
    for p in range(variants):
        if skip is not None and skip[p]:
            out.append(math.nan)
            continue
        one = model.variant(p) if isinstance(model, Population) else model
        one.stored_precision(True)
        try:
            out.append(evaluate(one, task, device)[0])
        finally:
            one.stored_precision(False)
    return out


class Share(Protocol):
    """Turn-taking with neighbours on one GPU (``nas.search.gpu_share.GpuShare`` is one): training
    holds it shared one window of steps at a time; each method returns/does nothing when off."""

    def acquire_shared(self) -> float: ...

    def release_shared(self) -> None: ...


class _Alone:
    """No neighbours: nothing to wait for."""

    def acquire_shared(self) -> float:
        return 0.0

    def release_shared(self) -> None:
        return None


def train(
    model: torch.nn.Module,
    task: Task,
    spec: TrainSpec,
    *,
    device: torch.device | str,
    budget: Budget | None = None,
    step_hook: Callable[[int], None] | None = None,
    on_rung: Callable[[int, float], bool] | None = None,
    compile_model: bool | None = None,
    share: Share | None = None,
) -> TrainResult:
    """Train ``model`` on ``task`` per ``spec``; raises TrainingDiverged on a non-finite loss/grad,
    TrainingOOM when the device runs out of memory, TrialTimeout past ``budget.deadline``.
    ``step_hook(n)`` runs before the n-th step (1-based); fault injection uses it.
    ``on_rung(step, accuracy)`` runs after each of ``rung_steps(spec.steps)`` with the accuracy on
    the first ``RUNG_ROWS`` test rows; when it returns True training stops (TrainingStopped).

    ``model`` is trained with ``spec.seed`` at ``spec.lr``: one run (``train_population`` trains
    the population a recipe asks for).

    The task's tensors are moved to ``device`` once; batches are drawn there by a seeded generator,
    so a step involves no host round trip.

    ``compile_model``: run the training forward/backward through ``torch.compile`` (None: when
    ``$NAS_TRAIN_COMPILE`` is 1). It pays only for long trainings: compiling costs tens of
    seconds per candidate (``benchmarks/train_throughput.py --compile`` measures both sides).

    ``share``: the GPU's turn-taking with neighbour workers (the search passes its ``GpuShare``);
    seconds spent waiting for a neighbour's measurement do not count as training time.
    """
    result = _train(model, task, spec, _Variants.single(spec), device, budget, step_hook, on_rung, compile_model, share)
    return result.only()


def train_population(
    arch: ArchSpec,
    task: Task,
    spec: TrainSpec,
    *,
    device: torch.device | str,
    budget: Budget | None = None,
    step_hook: Callable[[torch.nn.Module], Callable[[int], None] | None] | None = None,
    on_rung: Callable[[int, float], bool] | None = None,
    share: Share | None = None,
) -> PopulationResult:
    """Train ``arch`` as the population ``spec`` asks for: ``spec.seeds`` seeds (each its own
    initialisation, batch order and gradient noise) × the learning rates ``spec.lrs()``, all in one
    batched program (``nas.models.Population``); a 1 × 1 population is the single run of ``train``.

    Variant (seed s, lr) trains as ``train`` would train ``build(arch, seed=s)`` at that lr, to
    rounding. A variant that diverges is left out; the population diverges (TrainingDiverged)
    only when every learning rate has a diverged seed. The result's accuracy is the best learning
    rate's mean over seeds (``on_rung`` is given the same at each rung), its interval from the
    spread over seeds (``accuracy_interval``), and its model the best seed at that learning rate.
    ``step_hook(model)`` makes the per-step hook for the model being trained (fault injection).
    """
    variants = _Variants.of(spec)
    models = [build(arch, task, seed=seed) for seed in spec.variant_seeds()]
    if variants.size == 1:
        model = models[0]
    else:
        model = Population([models[variants.seed_index[v]] for v in range(variants.size)])
    hook = step_hook(model) if step_hook is not None else None
    result = _train(model, task, spec, variants, device, budget, hook, on_rung, None, share)
    return result.summary(model, task)


@dataclass(frozen=True)
class _Variants:
    """Which seed and learning-rate factor each variant of a training uses (variant-major: seeds
    vary fastest, so each learning rate's seeds sit together)."""

    seeds: tuple[int, ...]  # the distinct training seeds
    seed_index: tuple[int, ...]  # per variant, its seed's index in ``seeds``
    multipliers: tuple[float, ...]  # per variant, the factor on ``spec.lr``

    @property
    def size(self) -> int:
        return len(self.seed_index)

    @classmethod
    def single(cls, spec: TrainSpec) -> _Variants:
        return cls((spec.seed,), (0,), (1.0,))

    @classmethod
    def of(cls, spec: TrainSpec) -> _Variants:
        seeds = spec.variant_seeds()
        pairs = [(s, m) for m in spec.lr_multipliers for s in range(len(seeds))]
        return cls(seeds, tuple(s for s, _ in pairs), tuple(m for _, m in pairs))


@dataclass(frozen=True)
class _Run:
    """What ``_train`` found, per variant: accuracy and test loss ``[P]`` (host floats), the step
    at which each diverged with why (None: it did not), and the training's shared facts."""

    variants: _Variants
    accuracy: list[float]
    test_loss: list[float]
    diverged: list[tuple[int, str] | None]
    steps: int
    seconds: float
    stopped: str
    losses: torch.Tensor  # [steps taken, P] on the host
    window: int
    # each variant's accuracy at its own precision where ``accuracy`` is at a narrower stored one
    full_accuracy: list[float] | None = None

    def only(self) -> TrainResult:
        """The result of a one-variant training (``train``)."""
        if self.diverged[0] is not None:
            step, why = self.diverged[0]
            raise TrainingDiverged(why, step)
        full = self.full_accuracy[0] if self.full_accuracy is not None else None
        return TrainResult(
            self.accuracy[0], self.test_loss[0], self.steps, self.seconds, self.stopped, self.curve(0), full
        )

    def curve(self, p: int) -> tuple[tuple[int, float], ...]:
        """Variant ``p``'s learning curve: (step, mean training loss of the window) per window."""
        w = self.window
        return tuple((lo + w, self.losses[lo : lo + w, p].mean().item()) for lo in range(0, self.steps - w + 1, w))

    def summary(self, model: torch.nn.Module, task: Task) -> PopulationResult:
        v = self.variants
        lrs = sorted(set(v.multipliers), key=v.multipliers.index)
        by_lr = {m: [p for p in range(v.size) if v.multipliers[p] == m] for m in lrs}
        alive = {m: ps for m, ps in by_lr.items() if all(self.diverged[p] is None for p in ps)}
        if not alive:
            step, why = max((d for d in self.diverged if d is not None), key=lambda d: d[0])
            raise TrainingDiverged(f"{why} (at every learning rate)", step)
        means = {m: sum(self.accuracy[p] for p in ps) / len(ps) for m, ps in alive.items()}
        # the best mean; on a tie the factor nearest 1 (the sampled lr), then the smaller
        best_m = max(alive, key=lambda m: (means[m], -abs(math.log(m)), -m))
        keep = max(alive[best_m], key=lambda p: (self.accuracy[p], -p))
        spreads = [[self.accuracy[p] for p in ps] for ps in alive.values()]
        kept = model.variant(keep) if isinstance(model, Population) else model
        full = self.full_accuracy
        return PopulationResult(
            accuracy=means[best_m],
            interval=accuracy_interval(spreads, 1 / max(1, task.scored_targets)),
            test_loss=self.test_loss[keep],
            steps=self.steps,
            seconds=self.seconds,
            stopped=self.stopped,
            curve=self.curve(keep),
            best_multiplier=best_m,
            seeds=v.seeds,
            multipliers=tuple(lrs),
            accuracies=tuple(
                tuple(None if self.diverged[p] is not None else self.accuracy[p] for p in by_lr[m]) for m in lrs
            ),
            kept=(v.seed_index[keep], v.multipliers[keep], self.accuracy[keep]),
            model=kept,
            full_precision_accuracy=None if full is None else sum(full[p] for p in alive[best_m]) / len(alive[best_m]),
        )


def _train(model, task, spec, variants, device, budget, step_hook, on_rung, compile_model, share) -> _Run:
    device = torch.device(device)
    budget = budget or Budget()
    share = share or _Alone()
    clock = _Clock(time.perf_counter(), share.acquire_shared())  # the copies below are GPU work too
    try:
        task = task.to(device)
        model.to(device).train()
        opt = make_optimizer(spec, model.parameters())
        if variants.size > 1:
            opt.population(variants.multipliers)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec))
        gens = [torch.Generator(device=device).manual_seed(seed) for seed in variants.seeds]
        if compile_model is None:
            compile_model = settings.get().train_compile
        forward = torch.compile(model) if compile_model else model
        steps = _Steps(forward, task, opt, variants.size, device, _use_graphs(device, compile_model))
        run = _loop(model, steps, task, spec, variants, sched, gens, budget, step_hook, on_rung, share, clock)
    finally:
        share.release_shared()  # after an exception too: queued steps must not overlap a measurement
    logger.debug("trained %d variants %d steps in %.1fs (%s)", variants.size, run.steps, run.seconds, run.stopped)
    return run


def _loop(model, steps, task, spec, variants, sched, gens, budget, step_hook, on_rung, share, clock) -> _Run:
    """The training steps and the final evaluation of ``_train``. GPU work runs while holding
    ``share`` (windows of steps)."""
    device, P = task.x_train.device, variants.size
    stage1 = task.stage1_steps(spec.steps)  # the first steps draw short rows (a length curriculum)
    draws = _draws(task, spec, variants, gens, stage1)
    losses = torch.zeros(spec.steps, P, device=device)
    norms = torch.zeros(spec.steps, P, device=device)
    diverged: list[tuple[int, str] | None] = [None] * P
    stopped, step = "completed", 0
    rungs = set(rung_steps(spec.steps, stage1)) if on_rung is not None else set()
    ceiling = _loss_ceiling(task)
    while step < spec.steps:
        clock.paused += share.acquire_shared()
        try:
            if step_hook is not None:
                step_hook(step + 1)
            loss, norm = steps.run(draws[step], "stage1" if step < stage1 else "train")
            sched.step()
            losses[step] = loss
            norms[step] = norm
            step += 1
        except torch.cuda.OutOfMemoryError:
            rows = spec.batch_size if P == 1 else f"{spec.batch_size} x {P} variants"
            raise TrainingOOM(f"out of memory at batch {rows} (step {step + 1})") from None
        if clock.past(budget.deadline):
            raise TrialTimeout(f"stopped at step {step} of {spec.steps}")
        if step == 1:  # the guard counts from here: the first step's one-off set-up (lazy imports,
            clock.first_step = clock.elapsed()  # compiles, caches) is not the candidate's training speed
        out_of_time = budget.max_seconds is not None and clock.elapsed() - clock.first_step > budget.max_seconds
        if step in rungs:  # still holding the share: the rung's evaluation is GPU work
            _check_finite(losses, norms, step, ceiling, diverged)
            accuracy, _ = evaluate_variants(model, task, device, RUNG_ROWS, P)
            rung = _best_mean(accuracy.tolist(), variants, diverged)
            if on_rung(step, rung):
                best = _best_variant(accuracy.tolist(), variants, diverged)
                curve = _Run(variants, [], [], diverged, step, 0.0, "", losses[:step].cpu(), _window(spec)).curve(best)
                raise TrainingStopped(step, rung, curve, clock.elapsed())
        if step % CHECK_EVERY == 0 or step == spec.steps or out_of_time:
            _check_finite(losses, norms, step, ceiling, diverged)
            share.release_shared()  # a waiting latency measurement on this GPU goes now
        if out_of_time and step < spec.steps:
            stopped = "time budget"
            break
    clock.paused += share.acquire_shared()
    accuracy, test_loss = evaluate_variants(model, task, device, None, P)
    accuracy_l, test_loss_l = accuracy.tolist(), test_loss.tolist()
    for p, loss_p in enumerate(test_loss_l):
        if diverged[p] is None and not math.isfinite(loss_p):
            diverged[p] = (step, "test loss is not finite")
        elif diverged[p] is None and loss_p > ceiling:
            diverged[p] = (step, f"test loss {loss_p:.3g} is over {_over(ceiling)}")
    full_l = None
    stored = evaluate_stored(model, task, device, [d is not None for d in diverged])
    if stored is not None:  # the objective is the accuracy as deployed; the model's own is kept beside it
        accuracy_l, full_l = stored, accuracy_l
    seconds = clock.elapsed()
    return _Run(
        variants, accuracy_l, test_loss_l, diverged, step, seconds, stopped, losses[:step].cpu(), _window(spec), full_l
    )


GRAPH_WARMUP = 2  # eager steps of each stage before its step is captured: lazy initialisation happens there


def _draws(task: Task, spec: TrainSpec, variants: _Variants, gens: list[torch.Generator], stage1: int) -> torch.Tensor:
    """Every step's batch rows ``[steps, P·B]``, drawn up front on the device: per seed, one draw
    per stage (short rows first) from that seed's generator, so the variants of one seed see the
    same rows; variant-major within a step."""
    stages = [(stage1, task.x_stage1.shape[0] if stage1 else 0), (spec.steps - stage1, task.x_train.shape[0])]
    device = task.x_train.device
    per_seed = [
        torch.cat(
            [torch.randint(0, rows, (n, spec.batch_size), device=device, generator=g) for n, rows in stages if n > 0]
        )
        for g in gens
    ]
    if variants.size == 1:
        return per_seed[0]
    return torch.stack([per_seed[i] for i in variants.seed_index], dim=1).reshape(spec.steps, -1)


class _Steps:
    """The training step, eager or replayed from a CUDA graph.

    With ``graphs`` (CUDA, every param group on the fused optimizer path): the optimizer reads
    its per-step values from memory (``rows_in_memory``), each stage of the training (the short
    rows of a curriculum, then the full ones) runs ``GRAPH_WARMUP`` eager steps on a side stream,
    then captures forward, loss, backward, clipping and the optimizer's launches once; every
    later step copies its batch rows into the captured input, writes the optimizer's values for
    the step and replays. A replayed step is the eager step's arithmetic on the same tensors.
    """

    def __init__(self, forward, task: Task, opt, variants: int, device: torch.device, graphs: bool) -> None:
        self.forward, self.task, self.opt, self.P, self.device = forward, task, opt, variants, device
        self.graphs = graphs
        self._rows = False  # the optimizer reads its values from memory (decided at the first step)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._split: str | None = None
        self._warm = 0
        self._input: torch.Tensor | None = None
        self._out: torch.Tensor | None = None

    def run(self, idx: torch.Tensor, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on rows ``idx`` of ``split``: (loss ``[P]``, gradient norm ``[P]``)."""
        if not self.graphs:
            return self._step(idx, split, launch=False)
        if split != self._split:  # a new stage: its rows have another length, so another graph
            self._graph, self._split, self._warm = None, split, 0
        if self._graph is None and self._warm < GRAPH_WARMUP:
            self._warm += 1
            return self._on_side_stream(lambda: self._step(idx, split, launch=False))
        self.opt.prepare()
        if self._graph is None:
            self._capture(idx, split)
        self._input.copy_(idx)
        self._graph.replay()
        return self._out[0], self._out[1]

    def _step(self, idx: torch.Tensor, split: str, launch: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with _autocast(self.device):
            x, y = self.task.batch(idx, split=split)  # [P·B, T] rows, gathered on the device
            logits = self.forward(x)
            if self.P == 1:
                loss = self.task.loss(logits, y).reshape(1)
            else:
                ys = y.reshape(self.P, -1, *y.shape[1:])
                rows = logits.reshape(self.P, -1, *logits.shape[1:])
                loss = torch.stack([self.task.loss(rows[p], ys[p]) for p in range(self.P)])
        # keep the grad tensors (zero them): their addresses stay put, so the fused optimizer's
        # pointer tables are built once, not every step (docs/benchmarks.md, optimizer steps),
        # and a captured step's backward accumulates into the tensors it was captured with
        self.opt.zero_grad(set_to_none=False)
        loss.sum().backward()  # the variants' parameters are disjoint: each gets its own loss's gradient
        if self.graphs and not self._rows:  # the grads exist now: can every group be captured?
            self.graphs = self._rows = self.opt.rows_fused()
            if self._rows:
                self.opt.rows_in_memory()
        if launch:
            self.opt.launch()
        else:
            self.opt.step()
        return loss.detach(), self.opt.last_grad_norm.reshape(self.P)

    def _on_side_stream(self, fn):
        if not is_cuda(self.device):  # a stand-in graph (tests): nothing to order
            return fn()
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = fn()
        main.wait_stream(side)
        return out

    def _capture(self, idx: torch.Tensor, split: str) -> None:
        self._graph = None  # the last stage's graph and its memory go first
        self._input = idx.clone()
        self._out = torch.empty(2, self.P, device=self.device)

        def step() -> None:
            loss, norm = self._step(self._input, split, launch=True)
            self._out[0].copy_(loss)
            self._out[1].copy_(norm)

        self._graph = _capture(step, self.device)


def _use_graphs(device: torch.device, compile_model: bool) -> bool:
    """Whether training on ``device`` tries a captured step (``_Steps``)."""
    return is_cuda(device) and settings.get().train_graphs and not compile_model


def _capture(fn: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn``'s GPU work (captured, not run), on a side stream. Unlike
    ``torch.cuda.graph`` it neither collects garbage nor empties the allocator's cache per
    capture (a candidate captures once per stage); other threads' CUDA calls stay allowed."""
    graph = torch.cuda.CUDAGraph()
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            fn()
        finally:
            graph.capture_end()
    main.wait_stream(side)
    return graph


@dataclass
class _Clock:
    """Training time, less the seconds spent paused while a neighbour on the GPU measured
    latency (``gpu_share``): those must not eat the candidate's time budget or trial deadline."""

    start: float
    paused: float = 0.0
    first_step: float = 0.0  # elapsed when the first step ended: where the wall-clock guard starts counting

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def past(self, deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() - self.paused > deadline


def _window(spec: TrainSpec) -> int:
    return max(1, spec.steps // CURVE_POINTS)


def _best_mean(accuracy: list[float], variants: _Variants, diverged: list) -> float:
    """The best learning rate's mean accuracy over its seeds, among those no seed of which diverged."""
    means = []
    for m in set(variants.multipliers):
        ps = [p for p in range(variants.size) if variants.multipliers[p] == m]
        if all(diverged[p] is None for p in ps):
            means.append(sum(accuracy[p] for p in ps) / len(ps))
    return max(means, default=0.0)


def _best_variant(accuracy: list[float], variants: _Variants, diverged: list) -> int:
    alive = [p for p in range(variants.size) if diverged[p] is None] or list(range(variants.size))
    return max(alive, key=lambda p: accuracy[p])


def _over(ceiling: float) -> str:
    return f"{DIVERGED_LOSS_FACTOR:g}x a uniform guess's loss ({ceiling:.3g}): diverged"


def _loss_ceiling(task: Task) -> float:
    """The loss past which a run has diverged: ``DIVERGED_LOSS_FACTOR`` x ln(outputs) (at least ln 2)."""
    return DIVERGED_LOSS_FACTOR * math.log(max(task.n_out, 2))


def _check_finite(
    losses: torch.Tensor, norms: torch.Tensor, step: int, ceiling: float, diverged: list[tuple[int, str] | None]
) -> None:
    """Mark in ``diverged`` each variant whose last window's losses or gradient norms (``[steps,
    P]``) are NaN/inf, or a loss is over ``ceiling``; one host sync when none is. A one-variant
    training raises TrainingDiverged at once; a population trains on without the dead variant."""
    seen = slice(max(0, step - CHECK_EVERY), step)
    window, grads = losses[seen], norms[seen]
    finite = torch.isfinite(window) & torch.isfinite(grads)  # [W, P]
    if bool((finite & (window <= ceiling)).all()):
        return
    for p in range(window.shape[1]):
        if diverged[p] is not None:
            continue
        if not bool(finite[:, p].all()):
            what = "loss" if not bool(torch.isfinite(window[:, p]).all()) else "gradient norm"
            diverged[p] = (step, f"{what} became NaN/inf within steps {seen.start + 1}-{step}")
        elif not bool((window[:, p] <= ceiling).all()):
            worst = window[:, p].max().item()
            diverged[p] = (
                step,
                f"loss reached {worst:.3g} within steps {seen.start + 1}-{step}, over {_over(ceiling)}",
            )
    if window.shape[1] == 1 and diverged[0] is not None:
        raise TrainingDiverged(diverged[0][1], diverged[0][0])
