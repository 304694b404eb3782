"""The front and choosing from it: feasibility, Pareto set, hypervolume reference, knee, budgets."""

from __future__ import annotations

import math

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["PICKS", "PickError", "feasible", "front", "completed", "knee", "pick", "reference_point"]

PICKS = ("knee", "accuracy", "latency")


class PickError(ValueError):
    """No trial satisfies the request; the message says what was asked and what exists."""


def feasible(trial: FrozenTrial) -> bool:
    """All of the trial's constraint values (a name → value mapping) are ≤ 0."""
    return all(v <= 0 for v in trial.constraints.values())


def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible Pareto-optimal completed trials (Optuna's ``best_trials``), most accurate first."""
    return sorted((t for t in study.best_trials if feasible(t)), key=lambda t: (-t.values[0], t.values[1]))


def reference_point(trials: list[FrozenTrial]) -> list[float]:
    """A hypervolume reference point worse than every trial: accuracy 0, 1.1 × the worst latency
    and memory (objectives in the study's order: accuracy ↑, latency ↓, memory ↓)."""
    worst_latency = max((t.values[1] for t in trials), default=1.0)
    worst_memory = max((t.values[2] for t in trials), default=1.0)
    return [0.0, 1.1 * worst_latency, 1.1 * worst_memory]


def knee(trials: list[FrozenTrial]) -> FrozenTrial:
    """The trial closest to the utopia point in normalised (accuracy, latency) space.

    Accuracy and latency are min-max scaled over ``trials`` to [0, 1]; utopia is (best accuracy,
    lowest latency); ties go to the more accurate trial. With one trial, that trial.
    """
    acc = [t.values[0] for t in trials]
    lat = [t.values[1] for t in trials]

    def scaled(v: float, lo: float, hi: float) -> float:
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    def distance(t: FrozenTrial) -> tuple[float, float]:
        a = 1.0 - scaled(t.values[0], min(acc), max(acc))  # 0 at the best accuracy
        la = scaled(t.values[1], min(lat), max(lat))  # 0 at the lowest latency
        return math.hypot(a, la), -t.values[0]

    return min(trials, key=distance)


def pick(study: optuna.Study, how: str = "knee", *, trial: int | None = None, max_latency_ms: float | None = None,
         max_memory_mb: float | None = None) -> FrozenTrial:
    """Choose a completed trial: by number, or from the feasible front within the budgets by
    ``how`` — ``knee`` (see :func:`knee`), ``accuracy`` (most accurate, then fastest) or
    ``latency`` (fastest, then most accurate)."""
    done = completed(study)
    if not done:
        raise PickError(f"study {study.study_name!r} has no completed trial yet; run nas search first")
    if trial is not None:
        by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
        if trial not in by_number:
            raise PickError(f"study {study.study_name!r} has no trial {trial} (trials are 0-{max(by_number)})")
        if by_number[trial].state != TrialState.COMPLETE:
            raise PickError(f"trial {trial} of {study.study_name!r} is {by_number[trial].state.name}, not COMPLETE")
        return by_number[trial]
    if how not in PICKS:
        raise PickError(f"--pick {how!r} is not one of {list(PICKS)}")
    candidates = [t for t in front(study)
                  if (max_latency_ms is None or t.values[1] <= max_latency_ms)
                  and (max_memory_mb is None or t.values[2] <= max_memory_mb)]
    if not candidates:
        fastest = min(done, key=lambda t: t.values[1])
        raise PickError(f"no front trial meets the budget (max latency {max_latency_ms} ms, max memory "
                        f"{max_memory_mb} MB); the fastest completed trial takes {fastest.values[1]:.4g} ms "
                        f"and {fastest.values[2]:.4g} MB")
    if how == "accuracy":
        return max(candidates, key=lambda t: (t.values[0], -t.values[1]))
    if how == "latency":
        return min(candidates, key=lambda t: (t.values[1], -t.values[0]))
    return knee(candidates)
