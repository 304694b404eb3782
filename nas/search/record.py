"""A trial's record: the one place that reads and writes a trial's user attributes and values.

Optuna stores a trial as values (one per objective, in the study's order) and string-keyed user
attributes; everything else in the engine goes through ``TrialRecord`` (read, typed) and the
``write_*`` functions here (written), so objectives are addressed by name and a new attribute is
added in one module. Records carry ``record_version``; a trial written before versions existed
reads as version 0 with the same fields (studies written by earlier releases still open).

Trial states as the engine uses them:
- COMPLETE, trained: ``values`` are the measured objectives; ``truncated`` when the wall-clock
  guard stopped training early (recorded, shown with its steps, kept off the front through the
  ``truncated`` constraint);
- COMPLETE, ``skipped_training``: the candidate broke a hard budget (infeasible), accuracy 0;
- PRUNED: ``duplicate_of`` (a configuration already tried), ``surplus`` (other workers filled
  the budget) or ``pruned_at`` (early stopping, ``nas.search.pruning``: the step of the rung, with
  ``prune_reason`` and the partial curve); FAIL: ``failure`` says why.

A latency the search predicted and ``nas measure`` timed since is kept beside the prediction, in
the study's ``measured:<trial>`` attribute (``Measured``; Optuna refuses attributes on finished
trials); a record read through ``records`` / ``record`` carries it, and ``TrialRecord.value``
prefers it, while Optuna's stored ``values`` keep the prediction.

A trial's rungs (``(step, accuracy)`` on a small held-out batch, reported during training) are
Optuna's intermediate values, so they live in storage and survive a killed worker.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hardware_profiles import HardwareProfile, ProfileError, parse_profile
from nas.latency import Latency
from nas.search.objectives import BY_METRIC, DEFAULT_OBJECTIVES, Objective, metrics, objectives_for
from nas.search.setup import SearchSetup, StudyBudgets
from nas.spec import ArchSpec, TrainSpec

__all__ = [
    "DIRECTIONS",
    "MEASURE_VERSION",
    "Measured",
    "OBJECTIVES",
    "RECORD_VERSION",
    "TRUNCATED",
    "TrialRecord",
    "VERIFY_VERSION",
    "Verified",
    "VerifySettings",
    "fail_stale",
    "measured",
    "objectives_of",
    "over_budgets",
    "population_text",
    "study_objectives",
    "study_profile",
    "record",
    "records",
    "requeue",
    "study_budgets",
    "study_setup",
    "values_in_order",
    "verified",
    "verify_settings",
    "was_enqueued",
    "write_duplicate",
    "write_failure",
    "write_measured",
    "write_pruned",
    "write_rung",
    "write_scored",
    "write_skipped",
    "write_start",
    "write_study_budgets",
    "write_study_setup",
    "write_surplus",
    "write_trained",
    "write_verified",
]

# 2: the trained accuracy, and the generation costs, as attributes; 3: the accuracy's interval over
# seeds and the population (seeds x learning rates) it was trained as; 4: the accuracy at full
# precision beside the accuracy, for an architecture stored narrower (its precision fields)
RECORD_VERSION = 4
# the default objectives' metric name -> direction, in the order a study of nas search stores its values
OBJECTIVES: dict[str, str] = {BY_METRIC[m].metric: BY_METRIC[m].direction for m in metrics(DEFAULT_OBJECTIVES)}
DIRECTIONS = tuple(OBJECTIVES.values())
TRUNCATED = "truncated"  # constraint name: fraction of planned steps not trained (> 0: off the front)
VERIFY_VERSION = 1  # the study's "verify" attribute (nas verify's longer retrainings)
MEASURE_VERSION = 1  # the study's "measured:<trial>" attributes (nas measure's timings of predicted trials)
_MEASURED = "measured:"  # prefix of those attributes' keys: one per trial, so a write stays small
_TIME_METRICS = ("latency_ms", "prefill_latency_ms", "decode_latency_ms")


def objectives_of(study: optuna.Study) -> tuple[str, ...]:
    """The study's objective names in value order (studies of nas search set them as metric names)."""
    return tuple(study.metric_names or OBJECTIVES)


def study_objectives(study: optuna.Study) -> tuple[Objective, ...]:
    """The study's objectives (``nas.search.objectives``) in value order."""
    return objectives_for(objectives_of(study))


def values_in_order(objectives: Sequence[str], values: Mapping[str, float]) -> list[float]:
    """The values to ``tell`` Optuna, in the study's objective order."""
    missing = [name for name in objectives if name not in values]
    if missing:
        raise KeyError(f"no value for objective(s) {missing}")
    return [float(values[name]) for name in objectives]


@dataclass(frozen=True)
class Measured:
    """A trial's latencies as ``nas measure`` timed them on a GPU after the search predicted them:
    the forward at the study's latency shape, and the generation latencies its objectives ask
    for (None where the study has none). Kept in the study's ``measured:<trial>`` attribute
    (Optuna refuses attributes on finished trials); ``TrialRecord`` prefers them to the
    prediction, which stays in the trial as the search stored it."""

    latency: Latency
    prefill: Latency | None = None
    decode: Latency | None = None
    version: int = MEASURE_VERSION

    def of(self, metric: str) -> Latency | None:
        """The measured Latency behind a time objective (``latency_ms``, …), else None."""
        return dict(zip(_TIME_METRICS, (self.latency, self.prefill, self.decode), strict=True)).get(metric)

    @property
    def device(self) -> str:
        """The GPU it was measured on (``NVIDIA H200``)."""
        return self.latency.device

    def to_dict(self) -> dict[str, Any]:
        d = {
            "latency": self.latency.to_dict(),
            "prefill_latency": self.prefill.to_dict() if self.prefill is not None else None,
            "decode_latency": self.decode.to_dict() if self.decode is not None else None,
            "version": self.version,
        }
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measured:
        prefill, decode = data.get("prefill_latency"), data.get("decode_latency")
        return cls(
            latency=Latency.from_dict(data["latency"]),
            prefill=Latency.from_dict(prefill) if prefill else None,
            decode=Latency.from_dict(decode) if decode else None,
            version=int(data.get("version", 0)),
        )


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the engine reads it (see the module docstring for the states)."""

    number: int
    state: TrialState
    values: Mapping[str, float] = field(default_factory=dict)  # objective name -> value (COMPLETE only)
    # every constraint (hard budgets, truncation) satisfied, and the study's current budgets
    # (``over_budgets``) too when read through ``records`` / ``record``
    feasible: bool = True
    arch: ArchSpec | None = None
    train: TrainSpec | None = None
    arch_summary: str = "?"
    params: int = 0
    latency: Latency | None = None
    memory: Mapping[str, Any] = field(default_factory=dict)
    curve: tuple[tuple[int, float], ...] = ()
    steps_done: int | None = None
    stopped: str | None = None  # "completed" or why training stopped early ("time budget")
    train_seconds: float | None = None
    test_loss: float | None = None
    weights_artifact: str | None = None
    failure: str | None = None
    skipped_training: str | None = None
    duplicate_of: int | None = None
    surplus: str | None = None
    requeued_from: int | None = None
    pid: int | None = None
    pid_start: int | None = None  # its process's start (``process_start``): a reused pid is another process
    host: str | None = None
    latency_seconds: float | None = None
    latency_wait_seconds: float | None = None
    pruned_at: int | None = None  # early stopping: the step of the rung it was stopped at
    prune_reason: str | None = None
    rungs: tuple[tuple[int, float], ...] = ()  # (step, held-out accuracy): Optuna's intermediate values
    baseline: str | None = None  # a reference architecture every study starts with (nas.search.baselines)
    trained_accuracy: float | None = None  # kept whether or not accuracy is an objective
    prefill_latency: Latency | None = None  # the forward at decode batch x context (prefill_latency)
    decode_latency: Latency | None = None  # one generated token at the context (decode_latency)
    # half-width of the accuracy's interval over seeds (0.004: 0.986 ±0.004); None: one seed, or older
    accuracy_interval: float | None = None
    # how it was trained: {"seeds", "lr_multipliers", "lrs", "accuracies" [lr][seed], "best_lr", "weights"}
    population: Mapping[str, Any] | None = None
    # the same models' accuracy at their own precision, where the architecture's precision fields
    # store the KV cache, state or weights narrower (the accuracy is then at that precision); None
    # at full precision, where the two are one number
    full_precision_accuracy: float | None = None
    # the study's current hard budgets it breaks (``over_budgets``): set by ``records`` / ``record``
    over_budget: tuple[str, ...] = ()
    # its latencies timed by nas measure after the search predicted them (``Measured``), which the
    # front, the tables and the report use: set by ``records`` / ``record``
    measured: Measured | None = None
    version: int = RECORD_VERSION

    # ---- derived views
    def value(self, metric: str) -> float | None:
        """An objective's value by metric name (``nas.search.objectives``): a latency ``nas measure``
        timed after the search predicted it; else the stored value when it is one of the study's
        objectives, else the cost the trial recorded anyway; None if unknown. Optuna's own
        ``values`` keep the prediction (a finished trial's values are fixed): its samplers and
        hypervolume see what the search saw, everything that reads a record sees the measurement."""
        if self.measured is not None and (lat := self.measured.of(metric)) is not None:
            return lat.median_ms
        if metric in self.values:
            return self.values[metric]
        lat = self.latency_of(metric)
        if lat is not None:
            return lat.median_ms
        if metric == "accuracy":
            return self.trained_accuracy
        if metric in ("memory_mb", "cache_memory_mb"):
            found = self.memory.get("total_mb" if metric == "memory_mb" else "cache_memory_mb")
            return None if found is None else float(found)
        return None

    def latency_of(self, metric: str) -> Latency | None:
        """The Latency behind a time objective (its source, interval, device), else None: the
        measurement where ``nas measure`` timed it, else what the search stored."""
        if self.measured is not None and (lat := self.measured.of(metric)) is not None:
            return lat
        return self.searched_latency(metric)

    def searched_latency(self, metric: str) -> Latency | None:
        """The Latency the search stored for a time objective (predicted or measured), else None."""
        return dict(zip(_TIME_METRICS, (self.latency, self.prefill_latency, self.decode_latency), strict=True)).get(
            metric
        )

    def prediction_of(self, metric: str) -> Latency | None:
        """The search's prediction of a time objective that ``nas measure`` has since timed (shown
        beside the measurement), else None."""
        if self.measured is None or self.measured.of(metric) is None:
            return None
        return self.searched_latency(metric)

    def objective_text(self, objective: Objective, *, interval: bool = True) -> str:
        """``0.912 ±0.004``, ``0.0213 ms ±9%``, ``276 MiB``: the value of ``objective`` with its unit
        (and the accuracy's spread over seeds, a prediction's interval); ``?`` when the trial has none."""
        value = self.value(objective.metric)
        if value is None:
            return "?"
        if objective.metric == "accuracy":
            spread = _spread_text(self.accuracy_interval) if interval else ""
            return objective.format(value) + spread + self._full_precision_text()
        lat = self.latency_of(objective.metric)
        spread = f" ±{lat.interval * 100:.0f}%" if interval and lat is not None and lat.interval else ""
        return objective.format(value) + spread

    def accuracy_text(self) -> str:
        """``0.986 ±0.004`` (the interval over seeds, when the trial recorded one), else ``0.986``;
        ``0.962 (full precision 0.986)`` for an architecture stored below full precision."""
        return f"{self.accuracy:.3f}" + _spread_text(self.accuracy_interval) + self._full_precision_text()

    def _full_precision_text(self) -> str:
        """`` (full precision 0.986)``: what the stored precision costs, for a trial that has one."""
        if self.full_precision_accuracy is None:
            return ""
        return f" (full precision {self.full_precision_accuracy:.3f})"

    def population_text(self) -> str | None:
        """``mean of 3 seeds at lr 3e-03, the best of 3 learning rates``; None for a trial trained once."""
        return population_text(self.population)

    def costs_text(self, objectives: Sequence[Objective]) -> str:
        """``latency 0.0213 ms, memory 0.41 MiB``: the study's objectives other than accuracy."""
        return ", ".join(
            f"{o.name.replace('_', ' ')} {self.objective_text(o, interval=False)}"
            for o in objectives
            if o.metric != "accuracy"
        )

    def over_device(self, objectives: Sequence[Objective], profile: HardwareProfile | None) -> list[str]:
        """``memory 2.416e+06 MiB is more than h200's 141 GB (134,468 MiB)``: each memory objective
        (``memory``, ``cache_memory``) among ``objectives`` whose value exceeds the device memory of
        ``profile`` (``HardwareProfile.over_memory``); empty when all fit or the profile gives none."""
        out = []
        for o in objectives:
            value = self.value(o.metric) if o.metric in ("memory_mb", "cache_memory_mb") else None
            if value is not None and profile is not None and (more := profile.over_memory(value)) is not None:
                out.append(f"{o.name.replace('_', ' ')} {o.format(value)} is {more}")
        return out

    @property
    def accuracy(self) -> float:
        found = self.value("accuracy")
        return 0.0 if found is None else found

    @property
    def latency_ms(self) -> float:
        return self.value("latency_ms") or 0.0

    @property
    def memory_mb(self) -> float:
        return self.value("memory_mb") or 0.0

    @property
    def complete(self) -> bool:
        return self.state == TrialState.COMPLETE

    @property
    def trained(self) -> bool:
        """A completed trial whose candidate was trained (not skipped for breaking a budget)."""
        return self.complete and self.skipped_training is None

    @property
    def planned_steps(self) -> int | None:
        return self.train.steps if self.train is not None else None

    @property
    def truncated(self) -> bool:
        """Training stopped before its planned steps (the wall-clock guard fired)."""
        return (
            self.trained
            and self.steps_done is not None
            and self.planned_steps is not None
            and self.steps_done < self.planned_steps
        )

    def steps_text(self) -> str:
        """``150``, or ``127/150`` for a training stopped early."""
        planned = "?" if self.planned_steps is None else str(self.planned_steps)
        return f"{self.steps_done}/{planned}" if self.truncated else planned

    def truncation_text(self) -> str | None:
        """``time budget: 8/150 steps`` for a truncated trial, else None."""
        return f"{self.stopped or 'stopped'}: {self.steps_done}/{self.planned_steps} steps" if self.truncated else None

    def over_budget_text(self) -> str | None:
        """``over the study's budget on latency_ms (set after it was trained)`` for a trained trial
        a budget tightened on resume now rules out, else None."""
        if not self.over_budget or not self.trained:
            return None
        if "latency_ms" in self.over_budget and self.measured is not None:  # within it as predicted, maybe
            return f"over the study's budget on {', '.join(self.over_budget)} (as measured on {self.measured.device})"
        return f"over the study's budget on {', '.join(self.over_budget)} (set after it was trained)"

    def failure_kind(self) -> str:
        """What kind of failure: the recorded reason up to its first ``:``, ``;`` or ``(``
        (``diverged``, ``interrupted``, ``worker died``), for counting them."""
        text = self.failure or "no reason recorded"
        return re.split(r"[:;(]", text, maxsplit=1)[0].strip() or text

    def params_text(self) -> str:
        """The parameter count to three significant digits: ``812``, ``6.14K``, ``1.25M``, ``2.1B``
        (tables showed ``0.00M`` for any model under 5,000 parameters)."""
        value, unit = float(self.params), ""
        for larger in ("K", "M", "B"):
            if float(f"{value:.3g}") < 1000:  # as printed: 999,999 is 1M, not 1e+03K
                break
            value, unit = value / 1000, larger
        return f"{value:.3g}{unit}" if unit else str(self.params)

    def recipe(self) -> str:
        """``lion lr=1e-02 x150`` (the steps actually trained when cut short)."""
        if self.train is None:
            return "?"
        return f"{self.train.optimizer} lr={self.train.lr:.0e} x{self.steps_text()}"

    def latency_label(self) -> str:
        """How the latency was obtained, e.g. ``measured on NVIDIA H200`` or ``predicted (h200, …, ±9 %)``."""
        lat = self.latency_of("latency_ms")
        if lat is None:
            return "?"
        if lat.source == "measured":
            return f"measured on {lat.device}"
        return lat.label()

    # ---- storage form
    @classmethod
    def from_trial(cls, trial: FrozenTrial, objectives: Sequence[str] = tuple(OBJECTIVES)) -> TrialRecord:
        values = dict(zip(objectives, trial.values, strict=True)) if trial.values is not None else {}
        feasible = all(v <= 0 for v in trial.constraints.values())
        rungs = tuple(sorted((int(s), float(v)) for s, v in trial.intermediate_values.items()))
        return cls.from_dict(trial.number, trial.state, trial.user_attrs, values, feasible=feasible, rungs=rungs)

    @classmethod
    def from_dict(
        cls,
        number: int,
        state: TrialState,
        attrs: Mapping[str, Any],
        values: Mapping[str, float] | None = None,
        *,
        feasible: bool = True,
        rungs: tuple[tuple[int, float], ...] = (),
    ) -> TrialRecord:
        """Inverse of ``to_dict``, with the trial's number, state, values, feasibility and rungs beside it."""
        a = attrs
        latency = a.get("latency")
        prefill, decode = a.get("prefill_latency"), a.get("decode_latency")
        return cls(
            number=number,
            state=state,
            values=dict(values or {}),
            feasible=feasible,
            arch=ArchSpec.from_dict(a["arch"]) if "arch" in a else None,
            train=TrainSpec.from_dict(a["train"]) if "train" in a else None,
            arch_summary=a.get("arch_summary", "?"),
            params=int(a.get("params", 0)),
            latency=Latency.from_dict(latency) if latency else None,
            memory=a.get("memory", {}),
            curve=tuple((int(s), float(v)) for s, v in a.get("curve", ())),
            steps_done=a.get("steps_done"),
            stopped=a.get("stopped"),
            train_seconds=a.get("train_seconds"),
            test_loss=a.get("test_loss"),
            weights_artifact=a.get("weights_artifact"),
            failure=a.get("failure"),
            skipped_training=a.get("skipped_training"),
            duplicate_of=a.get("duplicate_of"),
            surplus=a.get("surplus"),
            requeued_from=a.get("requeued_from"),
            pid=a.get("pid"),
            pid_start=a.get("pid_start"),
            host=a.get("host"),
            latency_seconds=a.get("latency_seconds"),
            latency_wait_seconds=a.get("latency_wait_seconds"),
            pruned_at=a.get("pruned_at"),
            prune_reason=a.get("prune_reason"),
            rungs=rungs,
            baseline=a.get("baseline"),
            trained_accuracy=a.get("accuracy"),
            prefill_latency=Latency.from_dict(prefill) if prefill else None,
            decode_latency=Latency.from_dict(decode) if decode else None,
            accuracy_interval=a.get("accuracy_interval"),
            population=a.get("population"),
            full_precision_accuracy=a.get("full_precision_accuracy"),
            version=int(a.get("record_version", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The user attributes this record is stored as (absent fields left out)."""
        d: dict[str, Any] = {
            "record_version": self.version,
            "arch": self.arch.to_dict() if self.arch is not None else None,
            "train": self.train.to_dict() if self.train is not None else None,
            "arch_summary": self.arch_summary if self.arch is not None else None,
            "params": self.params if self.arch is not None else None,
            "latency": self.latency.to_dict() if self.latency is not None else None,
            "latency_source": self.latency.source if self.latency is not None else None,  # for optuna-dashboard
            "latency_device": self.latency.device if self.latency is not None else None,
            "prefill_latency": self.prefill_latency.to_dict() if self.prefill_latency is not None else None,
            "decode_latency": self.decode_latency.to_dict() if self.decode_latency is not None else None,
            "memory": dict(self.memory) or None,
            "curve": [list(p) for p in self.curve] or None,
        }
        for name in (
            "steps_done",
            "stopped",
            "train_seconds",
            "test_loss",
            "weights_artifact",
            "failure",
            "skipped_training",
            "duplicate_of",
            "surplus",
            "requeued_from",
            "pid",
            "pid_start",
            "host",
            "latency_seconds",
            "latency_wait_seconds",
            "pruned_at",
            "prune_reason",
            "baseline",
            "accuracy_interval",
            "full_precision_accuracy",
        ):
            d[name] = getattr(self, name)
        d["population"] = dict(self.population) if self.population is not None else None
        d["accuracy"] = self.trained_accuracy
        return {k: v for k, v in d.items() if v is not None}


def population_text(population: Mapping[str, Any] | None) -> str | None:
    """What a trial's accuracy is a mean of (``TrialRecord.population``, also kept in an export's
    ``arch.json``): ``mean of 3 seeds at lr 3e-03, the best of 3 learning rates``; None for none."""
    if not population:
        return None
    seeds, lrs, best = len(population.get("seeds", ())), len(population.get("lrs", ())), population.get("best_lr")
    text = f"mean of {seeds} seed{'s' if seeds != 1 else ''}" + (f" at lr {best:.0e}" if best is not None else "")
    return text + (f", the best of {lrs} learning rates" if lrs > 1 else "")


def _spread_text(interval: float | None) -> str:
    """`` ±0.004``: an accuracy interval at the value's three decimals (one significant digit
    when it is finer, so a real spread never reads ±0.000); empty for none."""
    if not interval:
        return ""
    return f" ±{interval:.3f}" if interval >= 0.0005 else f" ±{interval:.1g}"


def over_budgets(r: TrialRecord, budgets: StudyBudgets | None) -> tuple[str, ...]:
    """The hard budgets of ``budgets`` (the study's current ones, ``study_budgets``) that ``r``
    breaks, by constraint name (``latency_ms``, ``params``, ``memory_mb``). A trial is judged by
    them, not only by the constraints stored when it finished: a budget tightened on resume
    applies to the trials trained before it (Optuna's stored constraints, and so its
    hypervolume, keep the budgets each trial was scored under)."""
    if budgets is None or r.latency is None:
        return ()
    limits = (
        ("latency_ms", r.latency_of("latency_ms").median_ms, budgets.max_latency_ms),  # measured, where it was
        ("params", r.params, budgets.max_params),
        ("memory_mb", r.memory_mb, budgets.max_memory_mb),
    )
    return tuple(name for name, value, limit in limits if limit is not None and value > limit)


def _judged(r: TrialRecord, budgets: StudyBudgets | None, found: Measured | None = None) -> TrialRecord:
    """``r`` with its measured latencies (``found``) and its feasibility under the study's
    current budgets (``over_budgets``, on the measured latency where there is one)."""
    r = dataclasses.replace(r, measured=found) if found is not None else r
    broken = over_budgets(r, budgets)
    return dataclasses.replace(r, feasible=False, over_budget=broken) if broken else r


# Finished trials' records as read from their storage, per storage object and trial object: a
# finished trial never changes (Optuna refuses writes to it) and the storages hand out the same
# object for it on every read, so each is parsed once per process. The search loop, the progress
# line and the front read every trial after each one; parsed afresh, that grew with the study's
# size (quadratic over a search). A trial object that is not the stored one (a copy, one made by
# hand) is parsed as before.
_PARSED: weakref.WeakKeyDictionary[object, dict[int, tuple[FrozenTrial, tuple[str, ...], TrialRecord]]] = (
    weakref.WeakKeyDictionary()
)


def _parsed(study: optuna.Study, trial: FrozenTrial, objectives: tuple[str, ...]) -> TrialRecord:
    """``TrialRecord.from_trial``, kept for a finished trial (not yet judged: ``_judged`` reads the
    study's current budgets and measurements on every call)."""
    if not trial.state.is_finished():
        return TrialRecord.from_trial(trial, objectives)
    kept = _PARSED.setdefault(study._storage, {})  # noqa: SLF001 - what the trial objects belong to
    hit = kept.get(id(trial))
    if hit is not None and hit[0] is trial and hit[1] == objectives:
        return hit[2]
    r = TrialRecord.from_trial(trial, objectives)
    kept[id(trial)] = (trial, objectives, r)  # holding the trial: its id is not reused while kept
    return r


def records(study: optuna.Study, states: Sequence[TrialState] | None = None) -> list[TrialRecord]:
    """Every trial of ``study`` (or those in ``states``) as a record, in trial order, with what
    ``nas measure`` timed (``measured``), judged by the study's current budgets (``over_budgets``)."""
    objectives, budgets, found = objectives_of(study), study_budgets(study), measured(study)
    return [
        _judged(_parsed(study, t, objectives), budgets, found.get(t.number))
        for t in study.get_trials(deepcopy=False, states=states)
    ]


def record(study: optuna.Study, trial: FrozenTrial) -> TrialRecord:
    """``trial`` of ``study`` as a record, with its measurement, judged by the study's current budgets."""
    data = study.user_attrs.get(f"{_MEASURED}{trial.number}")
    found = Measured.from_dict(data) if data else None
    return _judged(_parsed(study, trial, objectives_of(study)), study_budgets(study), found)


# ---------------------------------------------------------------- writing (the search loop)


def write_start(trial: optuna.Trial) -> None:
    """Who runs the trial (stale-trial recovery reads it) and the record version. Each attribute is
    its own storage write, so a worker killed between two leaves some without the rest: the pid
    goes last, and a trial without one counts as unclaimed (``loop.recover_stale_trials``)."""
    trial.set_user_attr("record_version", RECORD_VERSION)
    trial.set_user_attr("host", socket.gethostname())
    if (start := process_start(os.getpid())) is not None:
        trial.set_user_attr("pid_start", start)
    trial.set_user_attr("pid", os.getpid())


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field),
    or None where there is no such process or no ``/proc``. With the pid it names one process: a
    pid is reused once its process is gone (threads take pids too), so a busy host can hand a dead
    worker's pid to another process within seconds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    return int(fields[19]) if len(fields) > 19 else None


def write_scored(
    trial: optuna.Trial,
    arch: ArchSpec,
    train: TrainSpec,
    params: int,
    latency: Latency,
    memory: Mapping[str, Any],
    *,
    latency_seconds: float,
    wait_seconds: float,
    prefill: Latency | None = None,
    decode: Latency | None = None,
) -> None:
    """The candidate and its known costs (before training). ``latency_seconds``: time spent scoring
    latency (build, compile/autotune, capture, timing; ~0 when predicted); ``wait_seconds``: time
    waited before it for this GPU's other workers to pause; ``prefill`` and ``decode``: the
    generation latencies at the study's context, when its objectives ask for them."""
    record = TrialRecord(
        trial.number,
        TrialState.RUNNING,
        arch=arch,
        train=train,
        arch_summary=arch.summary(),
        params=params,
        latency=latency,
        memory=memory,
        latency_seconds=round(latency_seconds, 3),
        latency_wait_seconds=round(wait_seconds, 3),
        prefill_latency=prefill,
        decode_latency=decode,
    )
    for key, value in record.to_dict().items():
        if key != "record_version":
            trial.set_user_attr(key, value)


def write_trained(
    trial: optuna.Trial,
    *,
    curve: Sequence[tuple[int, float]],
    seconds: float,
    steps: int,
    planned_steps: int,
    stopped: str,
    test_loss: float,
    weights_artifact: str,
    accuracy: float,
    accuracy_interval: float | None = None,
    population: Mapping[str, Any] | None = None,
    full_precision_accuracy: float | None = None,
) -> None:
    """The training's outcome. A training the wall-clock guard stopped early is marked infeasible
    by the ``truncated`` constraint (the fraction of planned steps it did not train), so it is
    recorded but stays off the front and out of the hypervolume. A candidate trained as a
    population (seeds x learning rates): ``accuracy`` is the best learning rate's mean over seeds,
    ``accuracy_interval`` the half-width of its spread over seeds (None for one seed) and
    ``population`` what was trained (``TrialRecord.population``); both None for a single run. For
    an architecture stored below full precision ``accuracy`` is at that precision and
    ``full_precision_accuracy`` the same models' at their own (None at full precision)."""
    extra = {
        "accuracy_interval": accuracy_interval,
        "population": dict(population) if population else None,
        "full_precision_accuracy": full_precision_accuracy,
    }
    for key, value in {
        "curve": [list(p) for p in curve],
        "train_seconds": round(seconds, 3),
        "steps_done": steps,
        "stopped": stopped,
        "test_loss": test_loss,
        "weights_artifact": weights_artifact,
        "accuracy": accuracy,
        **{k: v for k, v in extra.items() if v is not None},
    }.items():
        trial.set_user_attr(key, value)
    trial.set_constraint(TRUNCATED, max(0, planned_steps - steps) / max(1, planned_steps))


def write_rung(trial: optuna.Trial, step: int, accuracy: float) -> None:
    """A rung's held-out accuracy, as Optuna's intermediate value at ``step``. Written through the
    storage because ``Trial.report`` refuses multi-objective studies (optuna#3450); it is what
    ``report`` stores, and pruners read it back as ``FrozenTrial.intermediate_values``."""
    trial.storage.set_trial_intermediate_value(trial._trial_id, step, float(accuracy))  # noqa: SLF001


def write_pruned(
    trial: optuna.Trial, *, step: int, reason: str, curve: Sequence[tuple[int, float]], seconds: float
) -> None:
    """Stopped early at the rung at ``step`` (the trial is told PRUNED): why, and the partial run."""
    for key, value in {
        "pruned_at": step,
        "prune_reason": reason,
        "steps_done": step,
        "stopped": "pruned",
        "curve": [list(p) for p in curve],
        "train_seconds": round(seconds, 3),
    }.items():
        trial.set_user_attr(key, value)


def write_failure(trial: optuna.Trial, reason: str) -> None:
    trial.set_user_attr("failure", reason)


def write_skipped(trial: optuna.Trial, reason: str) -> None:
    """Recorded without training: the candidate breaks a hard budget."""
    trial.set_user_attr("skipped_training", reason)


def write_duplicate(trial: optuna.Trial, of: int) -> None:
    trial.set_user_attr("duplicate_of", of)


def write_surplus(trial: optuna.Trial, why: str) -> None:
    trial.set_user_attr("surplus", why)


def fail_stale(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    """Fail ``trial`` (RUNNING in a dead worker) with ``reason`` and enqueue its parameters again;
    False when another process changed its state first."""
    storage = study._storage  # noqa: SLF001 - Optuna exposes no public way to fail another process's trial
    try:
        storage.set_trial_user_attr(trial._trial_id, "failure", reason)  # noqa: SLF001
        if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):  # noqa: SLF001
            return False
    except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed it first
        return False
    requeue(study, trial)
    return True


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue ``trial``'s parameters again (a baseline keeps its label), for a trial that did not
    finish through no fault of its candidate: its worker died, or Ctrl-C stopped it. A trial
    stopped before it drew its parameters is queued with those it was enqueued with (a
    baseline's), and a sampled one is not queued at all (a new sample is as good)."""
    params = dict(trial.params) or dict(trial.system_attrs.get("fixed_params") or {})
    if not params:
        return
    again = {"requeued_from": trial.number}
    if "baseline" in trial.user_attrs:
        again["baseline"] = trial.user_attrs["baseline"]
    study.enqueue_trial(params, user_attrs=again)


def baseline_of(trial: optuna.Trial | FrozenTrial) -> str | None:
    """The baseline label of a trial (``enqueue_baseline``), or None for a sampled one."""
    return trial.user_attrs.get("baseline")


def enqueue_baseline(study: optuna.Study, label: str, params: Mapping[str, Any]) -> None:
    """Queue a reference architecture (``nas.search.baselines``) as the study's next trial, labelled."""
    study.enqueue_trial(dict(params), user_attrs={"baseline": label})


def was_enqueued(trial: FrozenTrial) -> bool:
    """Whether ``trial``'s parameters were enqueued (Optuna's ``fixed_params``): a re-queued trial,
    or one a user asked for with ``study.enqueue_trial``."""
    return bool(trial.system_attrs.get("fixed_params"))


# ---------------------------------------------------------------- the study's own record


def study_setup(study: optuna.Study) -> SearchSetup | None:
    """How the study searches, as ``nas search`` recorded it when creating it; None for a study
    that nas search did not create."""
    data = study.user_attrs.get("search")
    return SearchSetup.from_dict(data) if data and "space_yaml" in data else None


def study_profile(study: optuna.Study) -> HardwareProfile | None:
    """The hardware profile the study's costs are for, as it recorded it (its ``memory_gb`` is what
    the memory objectives are compared with); None for a study nas search did not create, one
    recorded before profiles were, or one whose recorded profile this version refuses."""
    setup = study_setup(study)
    if setup is None or not setup.profile_yaml:
        return None
    try:
        return parse_profile(setup.profile_yaml, f"profile {setup.profile} (as recorded)")
    except ProfileError:
        return None


def study_budgets(study: optuna.Study) -> StudyBudgets | None:
    """The trial count and hard budgets the latest run recorded (None before the first run)."""
    data = study.user_attrs.get("budgets")
    return StudyBudgets.from_dict(data) if data is not None else None


def write_study_setup(study: optuna.Study, setup: SearchSetup) -> None:
    study.set_user_attr("search", setup.to_dict())


def write_study_budgets(study: optuna.Study, budgets: StudyBudgets) -> None:
    study.set_user_attr("budgets", budgets.to_dict())


# ---------------------------------------------------------------- nas verify's longer retrainings


@dataclass(frozen=True)
class VerifySettings:
    """How ``nas verify`` last retrained the study's trials: ``steps_factor`` × each recipe's steps,
    ``seeds`` training seeds per trial, ``random`` trials drawn besides the front with ``seed``."""

    steps_factor: float
    seeds: int = 1
    random: int = 5
    seed: int = 0
    version: int = VERIFY_VERSION

    def same_reference(self, other: VerifySettings) -> bool:
        """Whether rows retrained under ``other`` measure the same thing as this run's (the long
        run's length and seed count); the random draw does not change what a row means."""
        return (self.steps_factor, self.seeds) == (other.steps_factor, other.seeds)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ("steps_factor", "seeds", "random", "seed", "version")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerifySettings:
        return cls(
            steps_factor=float(data["steps_factor"]),
            seeds=int(data.get("seeds", 1)),
            random=int(data.get("random", 0)),
            seed=int(data.get("seed", 0)),
            version=int(data.get("version", 0)),
        )


@dataclass(frozen=True)
class Verified:
    """One trial retrained ``steps`` steps (``steps_factor`` × its recipe's) from each of ``seeds``
    at ``lr`` on ``device``: its test accuracy per seed (``accuracies``), or why training failed
    (``failure``: a diverged or out-of-memory run, left out of the rank correlations)."""

    trial: int
    steps: int
    seeds: tuple[int, ...]
    accuracies: tuple[float, ...]
    lr: float
    device: str
    failure: str | None = None

    @property
    def accuracy(self) -> float | None:
        """The mean long-run accuracy over the seeds; None when training failed."""
        if self.failure is not None or not self.accuracies:
            return None
        return sum(self.accuracies) / len(self.accuracies)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "steps": self.steps,
            "seeds": list(self.seeds),
            "accuracy": self.accuracy,
            "accuracies": list(self.accuracies),
            "lr": self.lr,
            "device": self.device,
            "failure": self.failure,
        }
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, trial: int, data: Mapping[str, Any]) -> Verified:
        return cls(
            trial=trial,
            steps=int(data["steps"]),
            seeds=tuple(int(s) for s in data.get("seeds", ())),
            accuracies=tuple(float(a) for a in data.get("accuracies", ())),
            lr=float(data.get("lr", 0.0)),
            device=str(data.get("device", "?")),
            failure=data.get("failure"),
        )


def verify_settings(study: optuna.Study) -> VerifySettings | None:
    """The settings of the study's latest ``nas verify`` (None before the first)."""
    data = study.user_attrs.get("verify")
    return VerifySettings.from_dict(data["settings"]) if data else None


def verified(study: optuna.Study) -> dict[int, Verified]:
    """The study's retrained trials by number (empty before the first ``nas verify``)."""
    data = study.user_attrs.get("verify")
    if not data:
        return {}
    return {int(n): Verified.from_dict(int(n), row) for n, row in sorted(data["rows"].items(), key=lambda x: int(x[0]))}


def write_verified(study: optuna.Study, rows: Mapping[int, Verified], settings: VerifySettings) -> None:
    """Store ``rows`` and the run's ``settings`` as the study's ``verify`` attribute (Optuna refuses
    user attributes on finished trials), merged with the rows already there when they were
    retrained the same way (``same_reference``): a rerun drawing more random trials adds rows, and
    a row given replaces its trial's. Rows of another steps factor or seed count are dropped: one
    correlation must not mix two lengths of long run."""
    earlier = verify_settings(study)
    kept = verified(study) if earlier is not None and earlier.same_reference(settings) else {}
    merged = {**kept, **rows}
    study.set_user_attr(
        "verify",
        {
            "settings": settings.to_dict(),
            "rows": {str(n): merged[n].to_dict() for n in sorted(merged)},
        },
    )


# ---------------------------------------------------------------- nas measure's timings of predicted trials


def measured(study: optuna.Study) -> dict[int, Measured]:
    """The study's trials ``nas measure`` timed, by number (empty before the first)."""
    return {
        int(key.removeprefix(_MEASURED)): Measured.from_dict(data)
        for key, data in study.user_attrs.items()
        if key.startswith(_MEASURED)
    }


def write_measured(study: optuna.Study, number: int, found: Measured) -> None:
    """Store trial ``number``'s measurement as the study's ``measured:<number>`` attribute (one per
    trial: a run over a large study writes each once, and an interrupted run keeps what it
    measured), replacing an earlier one."""
    study.set_user_attr(f"{_MEASURED}{number}", found.to_dict())
