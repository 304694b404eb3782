"""The trial record: one module reads and writes a trial's attributes; objectives by name; a
study written before records existed still opens; truncated trials stay off the front."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from nas.latency import Latency, parse_shape
from nas.results.pareto import front, pick
from nas.search import record
from nas.search.record import OBJECTIVES, RECORD_VERSION, TRUNCATED, TrialRecord, records, study_setup, values_in_order
from nas.search.setup import SearchSetup, StudyBudgets
from nas.search.study import worker_config
from nas.spec import ArchSpec, LayerSpec, TrainSpec

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "study_v0"


def test_no_trial_attribute_or_objective_position_is_read_outside_the_record_module():
    pattern = re.compile(r"\.user_attrs|set_user_attr\(|\.system_attrs|\.values\[|\bvalues\[[0-9]\]")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("nas", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
        if p != ROOT / "nas" / "search" / "record.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not offenders, offenders


def _record(**changes) -> TrialRecord:
    arch = ArchSpec(32, [LayerSpec("attention", 2), LayerSpec("linear_attention", 2, "elu+1")], 16, 16)
    lat = Latency(
        0.05, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"), interval=0.12, basis="h200, calibrated 2026-12-01"
    )
    base = dict(
        number=3,
        state=TrialState.COMPLETE,
        values={"accuracy": 0.9, "latency_ms": 0.05, "memory_mb": 1.5},
        arch=arch,
        train=TrainSpec("adamw", 3e-3, 0.0, 0.0, 150, 32),
        arch_summary=arch.summary(),
        params=1234,
        latency=lat,
        memory={"total_mb": 1.5},
        curve=((8, 2.5), (16, 1.5)),
        steps_done=150,
        stopped="completed",
        train_seconds=1.5,
        test_loss=0.3,
        weights_artifact="abc",
        pid=7,
        host="h",
    )
    return TrialRecord(**{**base, **changes})


def test_round_trip_through_the_stored_form():
    r = _record()
    back = TrialRecord.from_dict(r.number, r.state, r.to_dict(), r.values)
    assert back == r and back.version == RECORD_VERSION
    assert back.latency_label() == "predicted (h200, calibrated 2026-12-01, ±12 %)"
    assert (back.accuracy, back.latency_ms, back.memory_mb) == (0.9, 0.05, 1.5)
    assert values_in_order(("memory_mb", "accuracy"), r.values) == [1.5, 0.9]
    with pytest.raises(KeyError, match="latency_ms"):
        values_in_order(tuple(OBJECTIVES), {"accuracy": 1.0, "memory_mb": 1.0})


def test_truncation_is_derived_from_the_steps():
    cut = _record(steps_done=8, stopped="time budget")
    assert cut.truncated and cut.steps_text() == "8/150" and cut.truncation_text() == "time budget: 8/150 steps"
    assert cut.recipe() == "adamw lr=3e-03 x8/150"
    assert not _record().truncated and _record().steps_text() == "150"
    skipped = _record(steps_done=None, skipped_training="breaks the hard budget on latency")
    assert not skipped.trained and not skipped.truncated


def _study_with(trials: list[tuple[list[float], dict[str, float], dict]]) -> optuna.Study:
    study = optuna.create_study(directions=list(OBJECTIVES.values()))
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        study.set_metric_names(list(OBJECTIVES))
    for values, constraints, attrs in trials:
        trial = create_trial(
            values=values, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}, user_attrs=attrs
        )
        trial.system_attrs["constraints"] = list(constraints.values())
        study.add_trial(trial)
    return study


def test_a_truncated_trial_never_reaches_the_front_even_when_it_dominates():
    """Trial 0 beats trial 1 on every objective but its training was cut short: the front and the
    picks hold trial 1 only; without the truncation trial 0 would be the whole front."""
    train = TrainSpec("adamw", 3e-3, 0.0, 0.0, 150, 32).to_dict()
    cut = {"train": train, "steps_done": 8, "stopped": "time budget"}
    full = {"train": train, "steps_done": 150, "stopped": "completed"}
    study = _study_with([([0.99, 0.01, 1.0], {TRUNCATED: 142 / 150}, cut), ([0.5, 0.02, 2.0], {TRUNCATED: 0.0}, full)])
    assert [r.number for r in front(study)] == [1]
    assert pick(study, "accuracy").number == 1 and pick(study, "latency").number == 1
    control = _study_with([([0.99, 0.01, 1.0], {TRUNCATED: 0.0}, full), ([0.5, 0.02, 2.0], {TRUNCATED: 0.0}, full)])
    assert [r.number for r in front(control)] == [0]


def test_a_study_written_before_records_still_opens(tmp_path):
    """tests/nas/data/study_v0 was written by nas search at 34e76e4 (no record_version): its trials
    read as version-0 records, the front, picks, report figures and stored weights still work."""
    from nas.results.export import trial_model
    from nas.results.report import figures
    from nas.search.storage import open_storage

    shutil.copytree(DATA, tmp_path / "s")
    storage = str(tmp_path / "s" / "v0.journal")
    study = optuna.load_study(study_name="written-by-0.1", storage=open_storage(storage))
    done = records(study, (TrialState.COMPLETE,))
    assert len(done) == 3 and all(r.version == 0 and r.trained and r.arch is not None for r in done)
    assert all(r.latency is not None and r.latency.source == "predicted" for r in done)
    best = front(study)
    assert best and {r.number for r in best} <= {r.number for r in done}
    chosen = pick(study, "knee")
    assert set(figures(study)) == {"front2d", "front3d", "hypervolume", "parallel", "breakdown"}
    model = trial_model(chosen, storage)
    assert model.arch == chosen.arch
    setup = study_setup(study)  # the study's own record: read typed, a worker rebuilds its run from it
    assert setup.version == 0 and setup.space == "hybrid_tiny" and setup.task_config["name"] == "mqar"
    config = worker_config("written-by-0.1", storage, worker=1)
    assert (config.space_yaml, config.trials, config.max_latency_ms) == (setup.space_yaml, 3, 1.0)


def test_search_setup_and_budgets_round_trip_and_name_what_differs():
    setup = SearchSetup(
        space="s",
        space_yaml="depth: 1\n",
        task="mqar",
        target="auto",
        profile="h200",
        latency_shape="1x256",
        seed=3,
        measure=True,
        task_config={"name": "mqar", "seq_len": 32},
        profile_yaml="name: h200\n",
    )
    assert SearchSetup.from_dict(setup.to_dict()) == setup and setup.version == 3
    assert setup.objectives == ("accuracy", "latency", "memory") and setup.context is None
    decode = dataclasses.replace(setup, objectives=("accuracy", "decode_latency"), context=4096, decode_batch=8)
    back = SearchSetup.from_dict(json.loads(json.dumps(decode.to_dict())))  # as a study stores it
    assert back == decode and back.objectives == ("accuracy", "decode_latency")
    assert setup.differs(decode) == ("objectives", ("accuracy", "latency", "memory"), ("accuracy", "decode_latency"))
    assert dataclasses.replace(decode, context=8192).differs(decode) == ("context", 8192, 4096)
    assert SearchSetup.from_dict({**setup.to_dict(), "unknown_later_field": 1}) == setup  # newer writers
    other = dataclasses.replace(setup, task="mad_recall", seed=9)
    assert setup.differs(other) == ("task", "mqar", "mad_recall") and setup.differs(setup) is None
    budgets = StudyBudgets(max_latency_ms=0.5, trials=10)
    assert StudyBudgets.from_dict(budgets.to_dict()) == budgets
    assert budgets.changes(StudyBudgets(max_latency_ms=0.5, trials=12)) == ["trials 10 -> 12"]


@pytest.mark.parametrize(
    ("params", "text"),
    [(812, "812"), (1234, "1.23K"), (4999, "5K"), (999_999, "1M"), (412_345, "412K"), (2_100_000_000, "2.1B")],
)
def test_parameter_counts_read_at_every_size(params, text):
    """Tables and the report showed ``0.00M`` for every model under 5,000 parameters."""
    assert _record(params=params).params_text() == text


POPULATION = {
    "seeds": [0, 1, 2],
    "lr_multipliers": [0.5, 1.0, 2.0],
    "lrs": [1.5e-3, 3e-3, 6e-3],
    "accuracies": [[0.8, 0.82, None], [0.9, 0.896, 0.904], [0.5, 0.6, 0.7]],  # [lr][seed]; None: diverged
    "best_lr": 3e-3,
    "weights": {"seed": 2, "lr": 3e-3, "accuracy": 0.904},
}


def test_the_accuracy_s_spread_and_population_round_trip_and_older_trials_read_none():
    r = _record(accuracy_interval=0.004, population=POPULATION)
    stored = json.loads(json.dumps(r.to_dict()))  # as a study stores user attributes
    back = TrialRecord.from_dict(r.number, r.state, stored, r.values)
    assert back == r and (back.accuracy_interval, back.population) == (0.004, POPULATION)
    assert back.accuracy_text() == "0.900 ±0.004" and back.version == RECORD_VERSION == 4
    assert back.population_text() == "mean of 3 seeds at lr 3e-03, the best of 3 learning rates"
    older = {k: v for k, v in stored.items() if k not in ("accuracy_interval", "population")} | {"record_version": 2}
    old = TrialRecord.from_dict(r.number, r.state, older, r.values)
    assert (old.accuracy_interval, old.population, old.version) == (None, None, 2)
    assert old.accuracy_text() == "0.900" and old.population_text() is None
    assert "accuracy_interval" not in _record().to_dict() and "population" not in _record().to_dict()
    assert _record(accuracy_interval=0.0004).accuracy_text() == "0.900 ±0.0004"  # never ±0.000


def test_write_trained_stores_the_spread_and_population_and_old_callers_still_work():
    study = optuna.create_study(directions=list(OBJECTIVES.values()))
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        study.set_metric_names(list(OBJECTIVES))
    outcome = dict(
        curve=[(8, 2.5)], seconds=1.0, steps=150, planned_steps=150, stopped="completed", test_loss=0.3,
        weights_artifact="w", accuracy=0.9,
    )  # fmt: skip
    for population in ({"accuracy_interval": 0.004, "population": POPULATION}, {}):
        trial = study.ask()
        record.write_trained(trial, **outcome, **population)
        study.tell(trial, [0.9, 0.05, 1.5])
    new, old = records(study)
    assert (new.accuracy_interval, new.population, new.trained_accuracy) == (0.004, POPULATION, 0.9)
    assert (old.accuracy_interval, old.population, old.trained_accuracy) == (None, None, 0.9)


def test_a_finished_trial_is_parsed_once_and_still_judged_by_the_current_budgets(tmp_path, monkeypatch):
    """Records of finished trials are kept per process (the loop and the progress line read the
    whole study after every trial); budgets and measurements written later still apply, a trial
    object that is not the stored one is parsed afresh, and a running trial is never kept."""
    from nas.search.study import open_study

    study = open_study("c", str(tmp_path / "c.journal"))
    latency = Latency(0.5, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"))
    arch = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)
    r = TrialRecord(0, TrialState.COMPLETE, arch=arch, arch_summary=arch.summary(), latency=latency, steps_done=5)
    study.add_trial(create_trial(values=[0.9, 0.5, 1.0], user_attrs=r.to_dict()))
    running = study.ask()
    parsed = []
    original = TrialRecord.from_trial.__func__

    def counting(cls, trial, *args, **kw):
        parsed.append(trial.number)
        return original(cls, trial, *args, **kw)

    monkeypatch.setattr(TrialRecord, "from_trial", classmethod(counting))
    first = records(study)
    assert parsed == [0, running.number] and first[0].feasible
    record.write_study_budgets(study, StudyBudgets(max_latency_ms=0.4))
    again = records(study)
    assert parsed == [0, running.number, running.number]  # the finished one was not parsed again
    assert not again[0].feasible and again[0].over_budget == ("latency_ms",)
    copy = study.get_trials(deepcopy=True)[0]
    assert record.record(study, copy).number == 0 and parsed[-1] == 0  # a copy: parsed
