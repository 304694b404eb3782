"""Early stopping on known costs: an Optuna pruner for nas search's multi-objective studies.

A candidate's costs — the study's objectives other than accuracy: latency and memory by default,
decode latency or cache memory when the study asks for them — are known before it trains
(``record.write_scored``); only its accuracy is uncertain. So whether it can still reach the front
is a one-dimensional question at its cost: at each rung (``nas.train.RUNGS`` of its planned steps)
training reports the accuracy on a small held-out batch, and the trial is stopped when even an
optimistic extrapolation of it,

    best case = 1 - (1 - accuracy) · (step / planned steps)²

(the error may still shrink with the square of the steps left: MQAR-like tasks learn in a late
jump, so a trial near chance at 1/8 of its steps can end at 0.99), stays ``margin`` below the
accuracy of a completed, feasible, fully trained trial at no more of any cost.
That trial would dominate it, so it cannot reach the front. A candidate cheaper than every such
trial is never stopped this way. With a length curriculum (``Task.stage1_steps``) the rungs and
the steps in the bound count from the end of its first stage: the rung accuracy is scored at the
task's full length, which the model is not trained on before then (on the CPU a 2-layer
attention model scored 0.47 on T=256 halfway through its T=64 stage and ended at 0.96; linear
stacks stay at chance there whatever they reach later).

While the front is still empty (the first trials, or every one so far over a hard budget or cut
short), the fallback is successive halving among trials of similar cost (latency and memory
each within ``COST_BAND``×): at a rung, a trial goes on only if its accuracy is among the best
``1/ETA`` of the trials — running, stopped or complete — that reported the same rung (ASHA's rule,
Li et al. 2020, here within a cost band since cost is known), and only once ``ETA`` trials have.

Optuna's pruners refuse multi-objective studies (``Trial.report`` raises; optuna#3450), so the
rung is written as the trial's intermediate value through the storage (``record.write_rung``) and
``CostAwarePruner.prune`` is called with the stored trial, as ``Trial.should_prune`` would. A
stopped trial is told PRUNED with ``pruned_at``/``prune_reason`` and its partial curve; it is not
on the front, not in the hypervolume and not counted toward ``--trials``.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from nas.search import record

__all__ = ["COST_BAND", "ETA", "MARGIN", "CostAwarePruner", "best_case", "rung"]

# How optimistic: on full-information runs of the search-quality MQAR (every trial trained to the end, its rungs
# recorded), the linear bound with a 0.02 margin would have stopped some runs' most accurate trial, the square
# with 0.05 none, while still stopping trials early (docs/benchmarks.md, earlier experiments).
MARGIN = 0.05  # accuracy a dominating trial must beat the best case by
ETA = 3  # successive halving: the best 1/ETA at a rung go on
COST_BAND = 2.0  # successive halving compares trials whose latency and memory are within this factor


def best_case(accuracy: float, step: int, planned_steps: int, start: int = 0) -> float:
    """The optimistic final accuracy of a trial at ``accuracy`` after ``step`` of ``planned_steps``,
    counting from ``start`` (the end of a length curriculum's first stage: the scored task is
    trained from there on)."""
    done = min(1.0, max(0.0, (step - start) / max(1, planned_steps - start)))
    return 1.0 - (1.0 - accuracy) * done**2


class CostAwarePruner(BasePruner):
    """Stops a trial whose best-case accuracy is dominated at its known latency and memory."""

    def __init__(self, margin: float = MARGIN, start_of: Callable[[int], int] | None = None) -> None:
        """``start_of(planned_steps)``: the step from which a trial trains on the scored task (a
        length curriculum's ``Task.stage1_steps``; 0 without one), where its rungs and its best
        case count from."""
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.margin = margin
        self.start_of = start_of or (lambda _steps: 0)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.reason(study, trial) is not None

    def reason(self, study: optuna.Study, trial: FrozenTrial) -> str | None:
        """Why ``trial`` should stop at its latest rung; None when it may still reach the front."""
        r = record.record(study, trial)
        costs = [o for o in record.study_objectives(study) if o.metric != "accuracy"]
        mine = [r.value(o.metric) for o in costs]
        if not r.rungs or r.planned_steps is None or any(v is None for v in mine):
            return None
        step, accuracy = r.rungs[-1]
        bound = best_case(accuracy, step, r.planned_steps, self.start_of(r.planned_steps))
        finished = [
            o
            for o in record.records(study, (TrialState.COMPLETE,))
            if o.trained and o.feasible and not o.truncated and o.number != r.number
        ]
        if not finished:
            return self._halving(study, r, step, accuracy, costs)

        def no_more(o: record.TrialRecord) -> bool:
            theirs = [o.value(c.metric) for c in costs]
            return all(t is not None and t <= m for t, m in zip(theirs, mine, strict=True))

        rivals = [o for o in finished if no_more(o)]
        if not rivals:
            return None
        best = max(rivals, key=lambda o: (o.accuracy, *(-(o.value(c.metric) or 0.0) for c in costs)))
        if best.accuracy < bound + self.margin:
            return None
        names = " or ".join(c.name.replace("_", " ") for c in costs)
        return (
            f"rung at step {step}/{r.planned_steps}: accuracy {accuracy:.3f}, best case {bound:.3f}; trial "
            f"{best.number} reached {best.accuracy:.3f} at {best.costs_text(costs)} (no more {names})"
        )

    def _halving(
        self, study: optuna.Study, r: record.TrialRecord, step: int, accuracy: float, costs: list
    ) -> str | None:
        """Successive halving at ``r``'s latest rung among trials of similar cost (module docstring)."""
        fraction = step / r.planned_steps
        mine = [r.value(c.metric) for c in costs]

        def similar(o: record.TrialRecord) -> bool:
            theirs = [o.value(c.metric) for c in costs]
            if o.planned_steps is None or any(t is None or t <= 0 for t in theirs):
                return False
            return all(max(t, m) <= COST_BAND * min(t, m) for t, m in zip(theirs, mine, strict=True))

        peers = [
            acc
            for o in record.records(study, (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
            if o.number != r.number and similar(o)
            for s, acc in o.rungs
            if abs(s / o.planned_steps - fraction) < 1e-9
        ]
        n = len(peers) + 1
        if n < ETA:
            return None
        keep = -(-n // ETA)
        rank = 1 + sum(acc > accuracy for acc in peers)  # ties go on
        if rank <= keep:
            return None
        names = " and ".join(c.name.replace("_", " ") for c in costs)
        return (
            f"successive halving at step {step}/{r.planned_steps} (no front yet): accuracy {accuracy:.3f} ranks "
            f"{rank} of {n} trials of similar cost ({names} within {COST_BAND:g}×); the best {keep} go on"
        )


def rung(pruner: CostAwarePruner, trial: optuna.Trial, step: int, accuracy: float) -> str | None:
    """Record the rung of ``trial`` at ``step`` and ask ``pruner``; the reason to stop, or None."""
    record.write_rung(trial, step, accuracy)
    frozen = trial.storage.get_trial(trial._trial_id)  # noqa: SLF001 - Trial.should_prune reads the same
    return pruner.reason(trial.study, frozen)
