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
from nas.optim import make_optimizer
from nas.spec import TrainSpec
from nas.tasks.base import Task

__all__ = [
    "RUNGS",
    "Budget",
    "TrainResult",
    "TrainingDiverged",
    "TrainingOOM",
    "TrainingStopped",
    "TrialTimeout",
    "evaluate",
    "lr_factor",
    "rung_steps",
    "train",
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
    """``max_seconds``: stop training early and keep what was learned (None: no limit).
    ``deadline``: a ``time.monotonic()`` instant after which the trial is abandoned (TrialTimeout)."""

    max_seconds: float | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class TrainResult:
    accuracy: float  # on the test split, over scored positions
    test_loss: float
    steps: int  # optimizer steps actually taken
    seconds: float
    stopped: str  # "completed" or "time budget"
    curve: tuple[tuple[int, float], ...] = field(default=())  # (step, mean train loss of the window)


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
    # bf16 on GPU (no loss scaling needed); fp32 on CPU, where bf16 matmuls are slow
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=is_cuda(device))


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, device: torch.device, rows: int | None = None) -> tuple[float, float]:
    """(accuracy, mean loss) of ``model`` over the scored positions of the test split (its first
    ``rows`` rows when given)."""
    model.eval()
    hits = total = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), device=device)
    n = task.x_test.shape[0] if rows is None else min(rows, task.x_test.shape[0])
    for i in range(0, n, EVAL_BATCH):
        x, y = task.batch(slice(i, min(n, i + EVAL_BATCH)), split="test")
        with _autocast(device):
            logits = model(x)
        h, t = task.correct(logits, y)
        hits, total = hits + h, total + t
        # Task.loss is the mean over this batch's scored positions, NaN when it has none: weight
        # it by their count so batches with more (or no) scored positions count as they should
        loss_sum += torch.where(t > 0, task.loss(logits, y) * t, 0.0)
    model.train()
    return (hits.float() / total.clamp(min=1)).item(), (loss_sum / total.clamp(min=1)).item()


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

    The task's tensors are moved to ``device`` once; batches are drawn there by a seeded generator,
    so a step involves no host round trip.

    ``compile_model``: run the training forward/backward through ``torch.compile`` (None: when
    ``$NAS_TRAIN_COMPILE`` is 1). It pays only for long trainings: compiling costs tens of
    seconds per candidate (``benchmarks/train_throughput.py --compile`` measures both sides).

    ``share``: the GPU's turn-taking with neighbour workers (the search passes its ``GpuShare``);
    seconds spent waiting for a neighbour's measurement do not count as training time.
    """
    device = torch.device(device)
    budget = budget or Budget()
    share = share or _Alone()
    clock = _Clock(time.perf_counter(), share.acquire_shared())  # the copies below are GPU work too
    try:
        task = task.to(device)
        model.to(device).train()
        opt = make_optimizer(spec, model.parameters())
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec))
        gen = torch.Generator(device=device).manual_seed(spec.seed)
        if compile_model is None:
            compile_model = settings.get().train_compile
        forward = torch.compile(model) if compile_model else model
        accuracy, test_loss, step, stopped, curve = _loop(
            model, forward, task, spec, opt, sched, gen, budget, step_hook, on_rung, share, clock
        )
    finally:
        share.release_shared()  # after an exception too: queued steps must not overlap a measurement
    if not math.isfinite(test_loss):
        raise TrainingDiverged("test loss is not finite", step)
    if test_loss > (ceiling := _loss_ceiling(task)):
        raise TrainingDiverged(f"test loss {test_loss:.3g} is over {_over(ceiling)}", step)
    seconds = clock.elapsed()
    logger.debug("trained %d steps in %.1fs: acc=%.3f (%s)", step, seconds, accuracy, stopped)
    return TrainResult(accuracy, test_loss, step, seconds, stopped, tuple(curve))


@dataclass
class _Clock:
    """Training time, less the seconds spent paused while a neighbour on the GPU measured
    latency (``gpu_share``): those must not eat the candidate's time budget or trial deadline."""

    start: float
    paused: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def past(self, deadline: float | None) -> bool:
        return deadline is not None and time.monotonic() - self.paused > deadline


def _loop(model, forward, task, spec, opt, sched, gen, budget, step_hook, on_rung, share, clock):
    """The training steps and the final evaluation of ``train``; returns (accuracy, test loss,
    steps, how it stopped, curve). GPU work runs while holding ``share`` (windows of steps)."""
    device, n_train = task.x_train.device, task.x_train.shape[0]
    stage1 = task.stage1_steps(spec.steps)  # the first steps draw short rows (a length curriculum)
    n_stage1 = task.x_stage1.shape[0] if stage1 else 0
    window = max(1, spec.steps // CURVE_POINTS)
    losses = torch.zeros(spec.steps, device=device)
    norms = torch.zeros(spec.steps, device=device)
    curve: list[tuple[int, float]] = []
    stopped, step = "completed", 0
    rungs = set(rung_steps(spec.steps, stage1)) if on_rung is not None else set()
    ceiling = _loss_ceiling(task)
    while step < spec.steps:
        clock.paused += share.acquire_shared()
        try:
            if step_hook is not None:
                step_hook(step + 1)
            short = step < stage1
            idx = torch.randint(0, n_stage1 if short else n_train, (spec.batch_size,), device=device, generator=gen)
            with _autocast(device):
                x, y = task.batch(idx, split="stage1" if short else "train")  # [B, T] rows, gathered on the device
                loss = task.loss(forward(x), y)
            # keep the grad tensors (zero them): their addresses stay put, so the fused optimizer's
            # pointer tables are built once, not every step (H200: 640 -> 4 table builds in 320
            # steps, +4% tokens/s; benchmarks/results/optimizer_host_h200.json)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            sched.step()
            losses[step] = loss.detach()
            norms[step] = opt.last_grad_norm
            step += 1
        except torch.cuda.OutOfMemoryError:
            raise TrainingOOM(f"out of memory at batch {spec.batch_size} (step {step + 1})") from None
        if clock.past(budget.deadline):
            raise TrialTimeout(f"stopped at step {step} of {spec.steps}")
        out_of_time = budget.max_seconds is not None and clock.elapsed() > budget.max_seconds
        if step in rungs:  # still holding the share: the rung's evaluation is GPU work
            _check_finite(losses, norms, step, ceiling)
            _extend_curve(curve, losses, window, step)
            accuracy, _ = evaluate(model, task, device, rows=RUNG_ROWS)
            if on_rung(step, accuracy):
                raise TrainingStopped(step, accuracy, tuple(curve), clock.elapsed())
        if step % CHECK_EVERY == 0 or step == spec.steps or out_of_time:
            _check_finite(losses, norms, step, ceiling)
            _extend_curve(curve, losses, window, step)
            share.release_shared()  # a waiting latency measurement on this GPU goes now
        if out_of_time and step < spec.steps:
            stopped = "time budget"
            break
    clock.paused += share.acquire_shared()
    accuracy, test_loss = evaluate(model, task, device)
    return accuracy, test_loss, step, stopped, curve


def _extend_curve(curve: list[tuple[int, float]], losses: torch.Tensor, window: int, step: int) -> None:
    while (len(curve) + 1) * window <= step:  # each window that has completed since the last check
        lo = len(curve) * window
        curve.append((lo + window, losses[lo : lo + window].mean().item()))


def _over(ceiling: float) -> str:
    return f"{DIVERGED_LOSS_FACTOR:g}x a uniform guess's loss ({ceiling:.3g}): diverged"


def _loss_ceiling(task: Task) -> float:
    """The loss past which a run has diverged: ``DIVERGED_LOSS_FACTOR`` x ln(outputs) (at least ln 2)."""
    return DIVERGED_LOSS_FACTOR * math.log(max(task.n_out, 2))


def _check_finite(losses: torch.Tensor, norms: torch.Tensor, step: int, ceiling: float = math.inf) -> None:
    """TrainingDiverged when the last window's losses or gradient norms are NaN/inf, or a loss is
    over ``ceiling``; one host sync when they are not."""
    seen = slice(max(0, step - CHECK_EVERY), step)
    window = losses[seen]
    if bool(torch.isfinite(window).all() & torch.isfinite(norms[seen]).all() & (window <= ceiling).all()):
        return
    if not bool(torch.isfinite(window).all() & torch.isfinite(norms[seen]).all()):
        what = "loss" if not bool(torch.isfinite(window).all()) else "gradient norm"
        raise TrainingDiverged(f"{what} became NaN/inf within steps {seen.start + 1}-{step}", step)
    worst = window.max().item()
    raise TrainingDiverged(
        f"loss reached {worst:.3g} within steps {seen.start + 1}-{step}, over {_over(ceiling)}", step
    )
