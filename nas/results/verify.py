"""``nas verify``: retrain a study's front and a few random trials for longer, to measure how well
the search's short training ranks them (``nas.results.fidelity``).

Each chosen trial's recipe is trained ``steps_factor`` × its steps from fresh seeds, derived from
the trial's own seed and configuration with a ``verify`` salt (a repeated verify trains the same),
on the study's own task (``nas.results.export.study_task``) and this machine's device; the
accuracies are stored in the study through ``nas.search.record.write_verified``, one trial at a
time (an interrupted run keeps what it finished). Trials already retrained the same way are not
trained again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import optuna
import torch

from nas.models import build
from nas.results.pareto import completed, front
from nas.search.record import (
    TrialRecord,
    Verified,
    VerifySettings,
    verified,
    verify_settings,
    write_verified,
)
from nas.search.setup import MAX_TRIALS
from nas.space import LIMITS
from nas.spec import TrainSpec, arch_hash
from nas.tasks import Task
from nas.train import TrainingDiverged, TrainingOOM, train

__all__ = [
    "MAX_SEEDS",
    "MAX_STEPS_FACTOR",
    "MAX_WORKERS",
    "Planned",
    "VerifyError",
    "check_settings",
    "long_recipe",
    "plan",
    "retrain",
    "run_verify",
    "training_seeds",
]

logger = logging.getLogger(__name__)

MAX_STEPS_FACTOR = 100.0  # past it a factor is a typo: 100× a recipe's steps is already hours
MAX_SEEDS = 16  # long runs per trial: each is a full retraining


class VerifyError(ValueError):
    """The verification cannot run as asked; the message says why."""


@dataclass(frozen=True)
class Planned:
    """A trial chosen for a long run: ``why`` is ``front`` or ``random``."""

    record: TrialRecord
    why: str


def check_settings(settings: VerifySettings) -> None:
    """VerifyError naming the flag unless the settings are within their bounds."""
    if not 1 < settings.steps_factor <= MAX_STEPS_FACTOR:  # a "long run" no longer than the search's says nothing
        raise VerifyError(f"--steps-factor must be in (1, {MAX_STEPS_FACTOR:g}], got {settings.steps_factor:g}")
    if not 0 <= settings.random <= MAX_TRIALS:  # no study holds more trials than a search runs
        raise VerifyError(f"--random must be in [0, {MAX_TRIALS:,}], got {settings.random}")
    if not 1 <= settings.seeds <= MAX_SEEDS:
        raise VerifyError(f"--seeds must be in [1, {MAX_SEEDS}], got {settings.seeds}")


def plan(study: optuna.Study, settings: VerifySettings) -> list[Planned]:
    """The displayed front (``pareto.front``), then ``settings.random`` of the study's other trained,
    untruncated trials drawn with ``settings.seed``. The draw is a seeded permutation taken from
    its start, so a rerun asking for more random trials gets the earlier ones and then others."""
    trained = [r for r in completed(study) if r.trained and not r.truncated and r.arch is not None]
    if not trained:
        raise VerifyError(
            f"study {study.study_name!r} has no trained trial to verify (each is over a budget, cut short by "
            f"its time guard or unfinished)"
        )
    shown = [r for r in front(study) if r.trained and not r.truncated]
    on_front = {r.number for r in shown}
    others = [r for r in trained if r.number not in on_front]  # trial order: the draw's starting point
    order = np.random.default_rng([settings.seed, 0x7E51F]).permutation(len(others))
    drawn = [others[i] for i in order[: settings.random]]
    return [Planned(r, "front") for r in shown] + [Planned(r, "random") for r in drawn]


def training_seeds(r: TrialRecord, count: int) -> tuple[int, ...]:
    """``count`` training seeds for ``r``'s long runs: a hash of its architecture, its recipe (its
    own seed among it) and a ``verify`` salt, so they differ from the search's seed and repeat
    on every verify of the same trial."""
    recipe = json.dumps(r.train.to_dict(), sort_keys=True)
    return tuple(
        int.from_bytes(hashlib.sha256(f"verify:{arch_hash(r.arch)}:{recipe}:{i}".encode()).digest()[:4], "little")
        for i in range(count)
    )


def long_recipe(r: TrialRecord, steps_factor: float) -> TrainSpec:
    """``r``'s recipe at ``steps_factor`` × its steps (within the space's step bound), at the best
    lr its population training found when it recorded one."""
    limit = LIMITS["train.steps"]
    steps = max(1, round(r.train.steps * steps_factor))
    if not limit.holds(steps):
        raise VerifyError(
            f"--steps-factor {steps_factor:g} gives trial {r.number} {steps:,} steps; train.steps must be {limit}"
        )
    lr = r.population.get("best_lr") if r.population else None
    return dataclasses.replace(r.train, steps=steps, lr=float(lr) if lr else r.train.lr)


def retrain(r: TrialRecord, task: Task, spec: TrainSpec, seeds: tuple[int, ...], device: torch.device) -> Verified:
    """``r``'s architecture trained per ``spec`` once from each of ``seeds`` (weights and batches);
    a run that diverges or runs out of memory is recorded as the row's failure."""
    accuracies = []
    for seed in seeds:
        model = build(r.arch, task, seed=seed)
        try:
            result = train(model, task, dataclasses.replace(spec, seed=seed), device=device)
        except (TrainingDiverged, TrainingOOM) as e:
            failure = f"{'diverged' if isinstance(e, TrainingDiverged) else 'out of memory'}: {e} (seed {seed})"
            return Verified(r.number, spec.steps, seeds, (), spec.lr, str(device), failure=failure)
        accuracies.append(result.accuracy)
    return Verified(r.number, spec.steps, seeds, tuple(accuracies), spec.lr, str(device))


OnRow = Callable[[int, int, Planned, Verified, float | None], None]


MAX_WORKERS = 64  # processes retraining at once: past it a number is a typo


def _timed_retrain(
    r: TrialRecord, task: Task, spec: TrainSpec, seeds: tuple[int, ...], device: str, threads: int
) -> tuple[Verified, float]:
    """``retrain`` in a worker process (spawned: CUDA needs it), with the parent's torch threads."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    row = retrain(r, task, spec, seeds, torch.device(device))
    return row, time.perf_counter() - start


def run_verify(
    study: optuna.Study,
    settings: VerifySettings,
    task: Task,
    device: torch.device,
    *,
    on_row: OnRow | None = None,
    workers: int = 1,
) -> list[tuple[Planned, Verified]]:
    """Retrain ``plan(study, settings)`` and store each row as it finishes; ``study`` must be open
    for writing. A trial the study already verified the same way (``same_reference``) keeps its
    row. ``on_row(i, n, planned, row, seconds)`` follows each trial (``seconds`` None: kept).
    ``workers`` > 1 retrains that many trials at once in worker processes sharing ``device`` (a
    GPU that one small model leaves mostly idle); every row is written from this process, and a
    row does not depend on ``workers`` (no time guard: each long run trains all its steps)."""
    check_settings(settings)
    if not 1 <= workers <= MAX_WORKERS:
        raise VerifyError(f"--workers must be in [1, {MAX_WORKERS}], got {workers}")
    chosen = plan(study, settings)
    specs = [long_recipe(p.record, settings.steps_factor) for p in chosen]  # a bad factor fails before any training
    earlier = verify_settings(study)
    stored = verified(study) if earlier is not None and earlier.same_reference(settings) else {}
    write_verified(study, {}, settings)  # this run's settings; rows of another reference go
    rows: dict[int, Verified] = {}
    todo = []
    for planned, spec in zip(chosen, specs, strict=True):
        r = planned.record
        seeds = training_seeds(r, settings.seeds)
        row = stored.get(r.number)
        if row is None or row.seeds != seeds or row.steps != spec.steps:
            todo.append((planned, spec, seeds))
        else:
            rows[r.number] = row
    order = {p.record.number: i for i, p in enumerate(chosen, start=1)}
    n = len(chosen)
    if on_row is not None:
        for planned in chosen:
            if planned.record.number in rows:
                on_row(order[planned.record.number], n, planned, rows[planned.record.number], None)

    def finished(planned: Planned, row: Verified, seconds: float) -> None:
        r = planned.record
        logger.info("verify: trial %d at %d steps: %s", r.number, row.steps, row.accuracies or row.failure)
        write_verified(study, {r.number: row}, settings)
        rows[r.number] = row
        if on_row is not None:
            on_row(order[r.number], n, planned, row, seconds)

    if workers == 1 or len(todo) <= 1:
        for planned, spec, seeds in todo:
            start = time.perf_counter()
            row = retrain(planned.record, task, spec, seeds, device)
            finished(planned, row, time.perf_counter() - start)
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
            futures = {
                pool.submit(
                    _timed_retrain, planned.record, task, spec, seeds, str(device), torch.get_num_threads()
                ): planned
                for planned, spec, seeds in todo
            }
            for future in concurrent.futures.as_completed(futures):
                row, seconds = future.result()
                finished(futures[future], row, seconds)
    return [(p, rows[p.record.number]) for p in chosen]
