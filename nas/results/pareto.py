"""The front and choosing from it: feasibility, Pareto set, hypervolume reference, knee, budgets.

Everything here works on ``TrialRecord`` (objectives by name). A trial is on the front when it
is complete, feasible (its hard budgets hold and its training was not cut short by the
wall-clock guard) and no other such trial dominates it (Optuna's ``best_trials`` over the study's
directions, which already leave infeasible trials out) — nor *ε-dominates* it: accuracies closer
than the task's test-set resolution (``accuracy_epsilon``: 1 / test rows, e.g. 0.9980 and 1.0000
on 512 test rows) count as equal, so the faster or smaller of two such trials stands for both.
The displayed front, the knee and the exports use it; the study's hypervolume stays Optuna's.
"""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from nas.search.record import TrialRecord, objectives_of, record, records, study_setup
from nas.search.setup import PICKS

__all__ = [
    "PICKS",
    "PickError",
    "accuracy_epsilon",
    "completed",
    "epsilon_dominates",
    "front",
    "knee",
    "pick",
    "reference_point",
]


class PickError(ValueError):
    """No trial satisfies the request; the message says what was asked and what exists."""


def completed(study: optuna.Study) -> list[TrialRecord]:
    return records(study, (TrialState.COMPLETE,))


def accuracy_epsilon(study: optuna.Study, override: float | None = None) -> float:
    """The accuracy difference the study's test set cannot resolve: ``override`` when given, else
    1 / the test rows the study recorded (``SearchSetup.test_size``); 0 for a study that
    recorded none (written before it was kept)."""
    if override is not None:
        if not 0.0 <= override < 1.0:
            raise ValueError(f"--accuracy-epsilon must be in [0, 1), got {override}")
        return override
    setup = study_setup(study)
    return 1.0 / setup.test_size if setup is not None and setup.test_size else 0.0


def epsilon_dominates(a: TrialRecord, b: TrialRecord, epsilon: float) -> bool:
    """``a`` is no worse than ``b`` on every objective — accuracy within ``epsilon`` counts as
    equal — and better on one (accuracy by more than ``epsilon``)."""
    no_worse = a.accuracy >= b.accuracy - epsilon and a.latency_ms <= b.latency_ms and a.memory_mb <= b.memory_mb
    better = a.accuracy > b.accuracy + epsilon or a.latency_ms < b.latency_ms or a.memory_mb < b.memory_mb
    return no_worse and better


def front(study: optuna.Study, epsilon: float | None = None) -> list[TrialRecord]:
    """Feasible completed trials no other one (ε-)dominates, most accurate first (then fastest).
    ``epsilon``: see ``accuracy_epsilon`` (None: the study's own)."""
    objectives = objectives_of(study)
    best = [TrialRecord.from_trial(t, objectives) for t in study.best_trials]
    best = [r for r in best if r.feasible and not r.truncated]
    eps = accuracy_epsilon(study, epsilon)
    kept = [r for r in best if not any(epsilon_dominates(o, r, eps) for o in best if o is not r)]
    return sorted(kept, key=lambda r: (-r.accuracy, r.latency_ms))


def reference_point(trials: list[TrialRecord]) -> dict[str, float]:
    """A hypervolume reference point worse than every trial: accuracy 0, 1.1 × the worst latency
    and memory (by objective name)."""
    worst_latency = max((r.latency_ms for r in trials), default=1.0)
    worst_memory = max((r.memory_mb for r in trials), default=1.0)
    return {"accuracy": 0.0, "latency_ms": 1.1 * worst_latency, "memory_mb": 1.1 * worst_memory}


def knee(trials: list[TrialRecord]) -> TrialRecord:
    """The trial closest to the utopia point in normalised (accuracy, latency) space.

    Accuracy and latency are min-max scaled over ``trials`` to [0, 1]; utopia is (best accuracy,
    lowest latency); ties go to the more accurate trial. With one trial, that trial.
    """
    acc = [r.accuracy for r in trials]
    lat = [r.latency_ms for r in trials]

    def scaled(v: float, lo: float, hi: float) -> float:
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    def distance(r: TrialRecord) -> tuple[float, float]:
        a = 1.0 - scaled(r.accuracy, min(acc), max(acc))  # 0 at the best accuracy
        la = scaled(r.latency_ms, min(lat), max(lat))  # 0 at the lowest latency
        return math.hypot(a, la), -r.accuracy

    return min(trials, key=distance)


def pick(
    study: optuna.Study,
    how: str = "knee",
    *,
    trial: int | None = None,
    max_latency_ms: float | None = None,
    max_memory_mb: float | None = None,
    epsilon: float | None = None,
) -> TrialRecord:
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
        return record(study, by_number[trial])
    if how not in PICKS:
        raise PickError(f"--pick {how!r} is not one of {list(PICKS)}")
    candidates = [
        r
        for r in front(study, epsilon)
        if (max_latency_ms is None or r.latency_ms <= max_latency_ms)
        and (max_memory_mb is None or r.memory_mb <= max_memory_mb)
    ]
    if not candidates:
        fastest = min(done, key=lambda r: r.latency_ms)
        raise PickError(
            f"no front trial meets the budget (max latency {max_latency_ms} ms, max memory "
            f"{max_memory_mb} MB); the fastest completed trial takes {fastest.latency_ms:.4g} ms "
            f"and {fastest.memory_mb:.4g} MB"
        )
    if how == "accuracy":
        return max(candidates, key=lambda r: (r.accuracy, -r.latency_ms))
    if how == "latency":
        return min(candidates, key=lambda r: (r.latency_ms, -r.accuracy))
    return knee(candidates)
