"""The front and choosing from it: feasibility, Pareto set, hypervolume reference, picks, budgets.

Everything here works on ``TrialRecord`` (objectives by name). A trial is on the front when it
is complete, feasible (the study's current hard budgets hold — a budget tightened on resume
applies to trials trained before it, ``record.over_budgets`` — and its training was not cut
short by the wall-clock guard) and no other such trial dominates it over the study's
directions — nor does a trial kept on the front *ε-dominate* it (``epsilon_front``): two
accuracies count as level when they differ by no more than the larger of the task's test-set
resolution (``accuracy_epsilon``: 1 / the scored test targets, accuracy's smallest step, e.g.
0.9995 and 1.0000 on 2048 MQAR queries) and either trial's spread over seeds
(``TrialRecord.accuracy_interval``), so the faster or smaller of two such trials stands for both.
The displayed front, the picks and the exports use it; the study's hypervolume stays Optuna's.

``nas export``'s default pick (``cheapest-best``): the cheapest feasible trial whose accuracy is
within ε of the best feasible accuracy — cheapest by the study's ``primary_cost``, feasible within
``--max-latency-ms`` / ``--max-memory-mb``, ε the resolution or the best trial's own spread (not
the candidate's: its noise is no evidence it is as good).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from nas.search.objectives import CATALOGUE, DEFAULT_OBJECTIVES, Objective
from nas.search.record import TrialRecord, record, records, study_objectives, study_setup
from nas.search.setup import DEFAULT_PICK, PICKS

_DEFAULT = tuple(CATALOGUE[n] for n in DEFAULT_OBJECTIVES)

__all__ = [
    "DEFAULT_PICK",
    "PICKS",
    "PickError",
    "accuracy_epsilon",
    "cheapest_best",
    "completed",
    "default_pick",
    "epsilon_dominates",
    "epsilon_front",
    "front",
    "knee",
    "level",
    "more_accurate_within_epsilon",
    "pair_epsilon",
    "pick_epsilon",
    "pick",
    "primary_cost",
    "reference_point",
]

# Accuracies are ratios k/N; their difference in floating point can pass an equal ε by an ulp
# (0.986 - 0.982 > 0.004), so a positive ε is compared with this much to spare (far below 1/N).
_ROUNDING = 1e-9


class PickError(ValueError):
    """No trial satisfies the request; the message says what was asked and what exists."""


def completed(study: optuna.Study) -> list[TrialRecord]:
    return records(study, (TrialState.COMPLETE,))


def accuracy_epsilon(study: optuna.Study, override: float | None = None) -> float:
    """The accuracy difference the study's test set cannot resolve: ``override`` when given, else
    1 / the scored test targets the study recorded (``SearchSetup.test_targets``: a row each
    for a class label, every scored position for per-token targets), accuracy's smallest step;
    for a study written before that was kept, 1 / its test rows (``test_size``); 0 for a study
    that recorded neither."""
    if override is not None:
        if not 0.0 <= override < 1.0:
            raise ValueError(f"--accuracy-epsilon must be in [0, 1), got {override}")
        return override
    setup = study_setup(study)
    if setup is None:
        return 0.0
    resolution = setup.test_targets or setup.test_size
    return 1.0 / resolution if resolution else 0.0


def pair_epsilon(a: TrialRecord, b: TrialRecord, resolution: float, *, spread: bool = True) -> float:
    """The accuracy difference within which ``a`` and ``b`` count as level: the test set's
    ``resolution`` (``accuracy_epsilon``), or either trial's spread over seeds
    (``accuracy_interval``) where that is larger; ``spread=False``: ``resolution`` alone (what
    ``--accuracy-epsilon`` sets)."""
    if not spread:
        return resolution
    return max(resolution, a.accuracy_interval or 0.0, b.accuracy_interval or 0.0)


def _slack(epsilon: float) -> float:
    return epsilon + _ROUNDING if epsilon > 0 else 0.0


def level(a: TrialRecord, b: TrialRecord, resolution: float, *, spread: bool = True) -> bool:
    """Whether the accuracies of ``a`` and ``b`` differ by no more than their ``pair_epsilon``."""
    return abs(a.accuracy - b.accuracy) <= _slack(pair_epsilon(a, b, resolution, spread=spread))


def epsilon_dominates(
    a: TrialRecord,
    b: TrialRecord,
    epsilon: float,
    objectives: Sequence[Objective] = _DEFAULT,
    *,
    spread: bool = True,
) -> bool:
    """``a`` is no worse than ``b`` on every objective — accuracies level within ``epsilon`` or
    either trial's spread over seeds (``pair_epsilon``) count as equal — and better on one
    (accuracy by more than that)."""
    no_worse, better = True, False
    for o in objectives:
        x, y = a.value(o.metric), b.value(o.metric)
        if x is None or y is None:
            return False
        if not o.maximize:
            x, y = -x, -y  # larger is better from here on
        slack = _slack(pair_epsilon(a, b, epsilon, spread=spread)) if o.metric == "accuracy" else 0.0
        no_worse = no_worse and x >= y - slack
        better = better or x > y + slack
    return no_worse and better


def pareto_set(trials: Sequence[TrialRecord], objectives: Sequence[Objective] = _DEFAULT) -> list[TrialRecord]:
    """The trials no other one dominates (``epsilon_dominates`` at ε 0, no spread), in their order.

    A sweep in order of the objectives (best first, lexicographically): a trial's dominators all
    come before it, and a dominated dominator's own dominator dominates the trial too, so each
    trial is compared with the set kept so far only, not with every trial (a search's progress
    line asks for the front after each of thousands of trials). Trials missing an objective's
    value neither dominate nor are dominated."""

    def key(r: TrialRecord) -> tuple[float, ...] | None:
        values = [r.value(o.metric) for o in objectives]
        if any(v is None for v in values):
            return None
        return tuple(-v if o.maximize else v for v, o in zip(values, objectives, strict=True))

    keys = {id(r): key(r) for r in trials}
    kept: list[TrialRecord] = []
    for r in sorted((r for r in trials if keys[id(r)] is not None), key=lambda r: keys[id(r)]):
        if not any(epsilon_dominates(o, r, 0.0, objectives, spread=False) for o in kept):
            kept.append(r)
    chosen = {id(r) for r in kept} | {id(r) for r in trials if keys[id(r)] is None}
    return [r for r in trials if id(r) in chosen]


def front(study: optuna.Study, epsilon: float | None = None) -> list[TrialRecord]:
    """Feasible completed trials no other one (ε-)dominates, most accurate first (then by the
    first cost objective). ``epsilon``: see ``accuracy_epsilon`` (None: the study's resolution
    and each trial's spread over seeds; a number: that ε alone, 0 the plain Pareto front)."""
    objectives = study_objectives(study)
    # the plain Pareto set of the feasible trials, feasible under the study's current budgets
    # (``record.over_budgets``), not Optuna's best_trials, which judge by the stored constraints
    best = pareto_set([r for r in completed(study) if r.feasible and not r.truncated], objectives)
    eps, spread = accuracy_epsilon(study, epsilon), epsilon is None
    cost = primary_cost(objectives)
    return sorted(
        epsilon_front(best, eps, objectives, spread=spread), key=lambda r: (-r.accuracy, r.value(cost.metric) or 0.0)
    )


def epsilon_front(
    trials: Sequence[TrialRecord], epsilon: float, objectives: Sequence[Objective] = _DEFAULT, *, spread: bool = True
) -> list[TrialRecord]:
    """The ``trials`` (a plain Pareto set) that no trial *kept* ε-dominates, in their order. Levelness
    is not transitive (a noisy trial is level with a far better one and with a far worse one), so a
    trial is dropped only in favour of one that stays: a sweep from the cheapest (the cost
    objectives in order, then the more accurate), where every possible ε-dominator of a trial — no
    costlier on any objective — comes before it. Compared with all trials instead, a chain of
    noisy trials could drop the most accurate one for a trial that is itself dropped."""
    others = [o for o in objectives if o.metric != "accuracy"]

    def key(r: TrialRecord) -> tuple[float, ...]:
        costs = [r.value(o.metric) for o in others]
        return (*(-(v or 0.0) if o.maximize else (v or 0.0) for v, o in zip(costs, others, strict=True)), -r.accuracy)

    kept: list[TrialRecord] = []
    for r in sorted(trials, key=key):
        if not any(epsilon_dominates(o, r, epsilon, objectives, spread=spread) for o in kept):
            kept.append(r)
    chosen = {id(r) for r in kept}
    return [r for r in trials if id(r) in chosen]


def primary_cost(objectives: Sequence[Objective]) -> Objective:
    """The cost a front is drawn and a knee found against: the first time objective, else the
    first objective other than accuracy."""
    costs = [o for o in objectives if o.metric != "accuracy"]
    return next((o for o in costs if o.time), costs[0])


def reference_point(trials: list[TrialRecord], objectives: Sequence[Objective] = _DEFAULT) -> dict[str, float]:
    """A hypervolume reference point worse than every trial (by metric name): 0 for accuracy,
    1.1 × the worst value of each cost."""
    point = {}
    for o in objectives:
        if o.maximize:
            point[o.metric] = 0.0
        else:
            point[o.metric] = 1.1 * max((r.value(o.metric) or 0.0 for r in trials), default=1.0)
    return point


def knee(trials: list[TrialRecord], cost: Objective | None = None) -> TrialRecord:
    """The trial closest to the utopia point in normalised (accuracy, ``cost``) space (``cost``:
    the forward latency unless given; ``primary_cost`` of a study's objectives).

    Both are min-max scaled over ``trials`` to [0, 1]; utopia is (best accuracy, lowest cost);
    ties go to the more accurate trial. With one trial, that trial.
    """
    metric = cost.metric if cost is not None else "latency_ms"
    acc = [r.accuracy for r in trials]
    lat = [r.value(metric) or 0.0 for r in trials]

    def scaled(v: float, lo: float, hi: float) -> float:
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    def distance(r: TrialRecord) -> tuple[float, float]:
        a = 1.0 - scaled(r.accuracy, min(acc), max(acc))  # 0 at the best accuracy
        la = scaled(r.value(metric) or 0.0, min(lat), max(lat))  # 0 at the lowest cost
        return math.hypot(a, la), -r.accuracy

    return min(trials, key=distance)


def pick_epsilon(best: TrialRecord, resolution: float, *, spread: bool = True) -> float:
    """How far below ``best``'s accuracy the default pick may be: the test set's ``resolution``, or
    (``spread``) ``best``'s own spread over seeds where that is larger."""
    return max(resolution, (best.accuracy_interval or 0.0) if spread else 0.0)


def cheapest_best(
    trials: Sequence[TrialRecord], resolution: float, cost: Objective, *, spread: bool = True
) -> TrialRecord:
    """The cheapest of ``trials`` by ``cost`` (then the more accurate) whose accuracy is below the
    most accurate one's by no more than the test set's ``resolution`` or (``spread``) that best
    trial's own spread over seeds: ``nas export``'s default pick. A trial's own spread does not
    count here: the noisier a cheap trial, the likelier it would be picked over a sure better one."""
    best = max(trials, key=lambda r: (r.accuracy, -(r.value(cost.metric) or 0.0)))
    margin = _slack(pick_epsilon(best, resolution, spread=spread))
    tied = [r for r in trials if best.accuracy - r.accuracy <= margin]
    return min(tied, key=lambda r: (r.value(cost.metric) or 0.0, -r.accuracy))


def default_pick(study: optuna.Study, epsilon: float | None = None) -> TrialRecord | None:
    """The trial ``nas export`` takes with no flags (but ``--accuracy-epsilon epsilon``), which the
    report and the final table mark; None when the study has no feasible trial on its front."""
    try:
        return pick(study, DEFAULT_PICK, epsilon=epsilon)
    except PickError:
        return None


def _within(trials: list[TrialRecord], max_latency_ms: float | None, max_memory_mb: float | None) -> list[TrialRecord]:
    """The ``trials`` at or below the budgets (the forward's latency and memory; None: no budget)."""
    return [
        r
        for r in trials
        if (max_latency_ms is None or r.latency_ms <= max_latency_ms)
        and (max_memory_mb is None or r.memory_mb <= max_memory_mb)
    ]


def more_accurate_within_epsilon(
    study: optuna.Study,
    chosen: TrialRecord,
    *,
    max_latency_ms: float | None = None,
    max_memory_mb: float | None = None,
) -> TrialRecord | None:
    """The most accurate front trial within the budgets when it beats ``chosen``, which was picked
    as within ε of it (the study's resolution or its spread over seeds: ``pick_epsilon``)
    and cheaper (``--pick cheapest-best`` or ``accuracy``); a user should hear of it
    (``--accuracy-epsilon 0`` picks it). None otherwise."""
    best = max(_within(front(study, 0.0), max_latency_ms, max_memory_mb), key=lambda r: r.accuracy, default=None)
    return best if best is not None and best.accuracy > chosen.accuracy else None


def pick(
    study: optuna.Study,
    how: str = DEFAULT_PICK,
    *,
    trial: int | None = None,
    max_latency_ms: float | None = None,
    max_memory_mb: float | None = None,
    epsilon: float | None = None,
) -> TrialRecord:
    """Choose a completed trial: by number, or from the feasible front within the budgets by
    ``how`` — ``cheapest-best`` (the default: the cheapest trial level with the most accurate
    one, see :func:`cheapest_best`), ``knee`` (see :func:`knee`), ``accuracy`` (most accurate,
    then cheapest) or ``latency`` (fastest, then most accurate); cost and speed are the study's
    ``primary_cost`` (its first latency objective: the forward's by default, or e.g. decode
    latency). The budgets apply to the forward's latency and memory, which every trial records."""
    done = completed(study)
    if not done:
        raise PickError(f"study {study.study_name!r} has no completed trial yet; run nas search first")
    if trial is not None:
        if moot := [
            flag
            for flag, value in (
                ("--max-latency-ms", max_latency_ms),
                ("--max-memory-mb", max_memory_mb),
                ("--accuracy-epsilon", epsilon),
            )
            if value is not None
        ]:  # they choose among the front; a named trial was exported whatever they said
            raise PickError(
                f"--trial {trial} exports that trial; {', '.join(moot)} choose{'s' if len(moot) == 1 else ''} "
                f"among the front's trials: drop {'it' if len(moot) == 1 else 'them'}, or --trial"
            )
        by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
        if trial not in by_number:
            raise PickError(f"study {study.study_name!r} has no trial {trial} (trials are 0-{max(by_number)})")
        if by_number[trial].state != TrialState.COMPLETE:
            state = by_number[trial].state.name
            repeat = record(study, by_number[trial]).duplicate_of
            if repeat is not None:
                raise PickError(
                    f"trial {trial} of {study.study_name!r} is {state}: the same configuration as trial {repeat}, "
                    f"not trained again; export --trial {repeat}"
                )
            why = record(study, by_number[trial]).failure
            raise PickError(
                f"trial {trial} of {study.study_name!r} is {state}" + (f" ({why})" if why else "") + ", not COMPLETE"
            )
        return record(study, by_number[trial])
    if how not in PICKS:
        raise PickError(f"--pick {how!r} is not one of {list(PICKS)}")
    candidates = _within(front(study, epsilon), max_latency_ms, max_memory_mb)
    if not candidates and max_latency_ms is None and max_memory_mb is None:
        raise PickError(
            f"study {study.study_name!r} has no feasible trial on its front ({len(done)} completed: each "
            "over a budget of the search or cut short by its time guard); export one with --trial N"
        )
    if not candidates:
        fastest = min(done, key=lambda r: r.latency_ms)
        limits = [f"max latency {max_latency_ms:g} ms"] if max_latency_ms is not None else []
        limits += [f"max memory {max_memory_mb:g} MiB"] if max_memory_mb is not None else []
        raise PickError(
            f"no front trial meets the budget ({', '.join(limits)}); the fastest completed trial takes "
            f"{fastest.latency_ms:.4g} ms and {fastest.memory_mb:.4g} MiB"
        )
    cost = primary_cost(study_objectives(study))
    if how == DEFAULT_PICK:
        # among the plain front: the most accurate trial may be ε-dominated by a cheaper level one,
        # yet it sets the best accuracy (a trial's dominator, no costlier and no less accurate, is on it)
        plain = _within(front(study, 0.0), max_latency_ms, max_memory_mb)
        return cheapest_best(plain, accuracy_epsilon(study, epsilon), cost, spread=epsilon is None)
    if how == "accuracy":
        return max(candidates, key=lambda r: (r.accuracy, -(r.value(cost.metric) or 0.0)))
    if how == "latency":
        return min(candidates, key=lambda r: (r.value(cost.metric) or 0.0, -r.accuracy))
    return knee(candidates, cost)
