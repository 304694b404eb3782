"""Early stopping on known costs: the pruner stops a trial whose best case is dominated at its
latency and memory and keeps one that can still reach the front (constructed studies); pruned
trials stay off the front and the hypervolume and are not counted; rungs survive in storage."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from nas.latency import Latency, parse_shape
from nas.results.pareto import front
from nas.search import loop as study_module
from nas.search import record
from nas.search.pruning import MARGIN, CostAwarePruner, best_case, rung
from nas.search.record import TrialRecord
from nas.search.study import (
    SearchConfig,
    SearchError,
    n_complete,
    n_pruned,
    open_study,
    prepare,
    run_search,
    worker_config,
)
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from tests.conftest import write_space

ARCH = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)
TRAIN = TrainSpec("adamw", 3e-3, 0.0, 0.0, 80, 8)


def _attrs(latency_ms: float, memory_mb: float, **extra) -> dict:
    lat = Latency(latency_ms, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"), interval=0.1)
    r = TrialRecord(0, TrialState.RUNNING, arch=ARCH, train=TRAIN, arch_summary=ARCH.summary(), params=10, latency=lat)
    return {**r.to_dict(), "memory": {"total_mb": memory_mb}, **extra}


def _study(tmp_path: Path, *done: tuple[float, float, float]) -> optuna.Study:
    """A study of nas search's shape holding completed, trained trials (accuracy, latency, memory)."""
    study = open_study("p", str(tmp_path / "p.journal"))
    for acc, lat, mem in done:
        study.add_trial(create_trial(values=[acc, lat, mem], user_attrs=_attrs(lat, mem, steps_done=80)))
    return study


def _running(study: optuna.Study, latency_ms: float, memory_mb: float, rungs: dict[int, float]):
    study.add_trial(
        create_trial(state=TrialState.RUNNING, user_attrs=_attrs(latency_ms, memory_mb), intermediate_values=rungs)
    )
    return study.get_trials(deepcopy=False)[-1]


def test_best_case_extrapolation_is_optimistic_and_exact_at_the_end():
    assert best_case(0.2, 10, 80) == pytest.approx(1 - 0.8 / 64)  # the error may still shrink 64-fold
    assert best_case(0.2, 40, 80) == pytest.approx(0.8)
    assert best_case(0.2, 80, 80) == pytest.approx(0.2)
    assert best_case(1.0, 1, 80) == 1.0


def test_best_case_counts_from_the_end_of_a_curriculum():
    # at step 885 of 1200 after 840 short-row steps, 45 of the 360 scored steps are done
    assert best_case(0.02, 885, 1200, 840) == pytest.approx(1 - 0.98 * (45 / 360) ** 2)
    assert best_case(0.02, 885, 1200) == pytest.approx(1 - 0.98 * (885 / 1200) ** 2)
    assert best_case(0.5, 1200, 1200, 840) == pytest.approx(0.5)


def test_a_curriculum_trial_at_chance_on_the_full_length_is_kept_early_in_its_last_stage(tmp_path):
    """At its first rung after a 70 % curriculum a trial is at chance on the full-length rows: its
    best case counts from the curriculum's end (kept); counted from step 0 it would be stopped."""
    study = _study(tmp_path, (0.97, 1.0, 1.0))
    trial = _running(study, 2.0, 3.0, {79: 0.02})  # TRAIN plans 80 steps: still at chance near its end
    assert CostAwarePruner(start_of=lambda steps: 70).reason(study, _running(study, 2.0, 3.0, {72: 0.02})) is None
    assert CostAwarePruner(start_of=lambda steps: 0).reason(study, _running(study, 2.0, 3.0, {72: 0.02})) is not None
    assert CostAwarePruner(start_of=lambda steps: 70).prune(study, trial)  # best case 0.206 at 9/10 of its stage


def test_a_trial_whose_best_case_is_dominated_at_its_cost_is_stopped(tmp_path):
    study = _study(tmp_path, (0.99, 1.0, 1.0))  # as fast, as small and far more accurate
    trial = _running(study, 2.0, 3.0, {10: 0.1, 40: 0.3})  # best case at step 40/80: 0.825
    why = CostAwarePruner().reason(study, trial)
    assert CostAwarePruner().prune(study, trial)
    assert why is not None and "step 40/80" in why and "trial 0 reached 0.990" in why


@pytest.mark.parametrize(
    "done, rungs",
    [
        ([(0.99, 1.0, 1.0)], {10: 0.95}),  # its best case (0.999) can still beat the rival
        ([(0.99, 1.0, 1.0)], {10: 0.05}),  # near chance at 1/8 of its steps: a late jump can still come
        ([(0.99, 3.0, 1.0)], {10: 0.1}),  # the accurate trial is slower: it does not dominate
        ([(0.99, 1.0, 4.0)], {10: 0.1}),  # ... or bigger
        ([], {10: 0.1}),  # empty front: never stopped
        ([(0.99, 1.0, 1.0)], {}),  # no rung reported yet
    ],
    ids=["can-still-reach", "early-chance", "rival-slower", "rival-bigger", "empty-front", "no-rung"],
)
def test_a_trial_that_can_still_reach_the_front_is_kept(tmp_path, done, rungs):
    study = _study(tmp_path, *done)
    assert CostAwarePruner().reason(study, _running(study, 2.0, 3.0, rungs)) is None


def test_the_margin_keeps_a_trial_just_below_the_rival(tmp_path):
    study = _study(tmp_path, (0.95, 1.0, 1.0))
    trial = _running(study, 2.0, 3.0, {40: 0.78})  # best case at 40/80: 0.945, within the margin of 0.95
    assert best_case(0.78, 40, 80) < 0.95 < best_case(0.78, 40, 80) + MARGIN
    assert not CostAwarePruner().prune(study, trial)
    assert CostAwarePruner(margin=0.0).prune(study, trial)
    with pytest.raises(ValueError, match="margin"):
        CostAwarePruner(margin=1.0)


def test_infeasible_or_truncated_trials_do_not_dominate(tmp_path):
    study = _study(tmp_path)
    study.add_trial(create_trial(values=[0.99, 1.0, 1.0], user_attrs=_attrs(1.0, 1.0), constraints={"x": 1.0}))
    study.add_trial(create_trial(values=[0.99, 1.0, 1.0], user_attrs=_attrs(1.0, 1.0, steps_done=8)))
    assert CostAwarePruner().reason(study, _running(study, 2.0, 3.0, {10: 0.1})) is None


def test_pruned_trials_are_off_the_front_and_the_hypervolume(tmp_path):
    study = _study(tmp_path, (0.5, 1.0, 1.0), (0.9, 2.0, 2.0))
    before = optuna.visualization.plot_hypervolume_history(study, [0.0, 10.0, 10.0]).data[0].y[-1]
    pruned = _attrs(0.5, 0.5, pruned_at=10, prune_reason="r", steps_done=10, stopped="pruned")
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs=pruned, intermediate_values={10: 0.99}))
    assert [r.number for r in front(study)] == [1, 0]
    after = optuna.visualization.plot_hypervolume_history(study, [0.0, 10.0, 10.0]).data[0].y[-1]
    assert after == before
    assert n_pruned(study) == 1 and n_complete(study) == 2


def test_rungs_survive_in_storage_and_a_failed_trial_keeps_them(tmp_path):
    """What a killed worker leaves: rungs written during training are in storage; recovery fails
    the trial (keeping them) and re-queues its parameters."""
    study = _study(tmp_path, (0.99, 1.0, 1.0))
    trial = study.ask()
    record.write_scored(trial, ARCH, TRAIN, 10, Latency(2.0, 0.0, "predicted", "h200", "bf16", parse_shape("1x256")),
                        {"total_mb": 3.0}, latency_seconds=0.0, wait_seconds=0.0)  # fmt: skip
    assert rung(CostAwarePruner(), trial, 10, 0.9) is None  # best case 0.998: may still reach 0.99
    assert rung(CostAwarePruner(), trial, 40, 0.3) is not None  # best case 0.825 at 40/80
    reopened = open_study("p", str(tmp_path / "p.journal"), create=False)
    running = reopened.get_trials(deepcopy=False, states=(TrialState.RUNNING,))[0]
    assert record.record(reopened, running).rungs == ((10, 0.9), (40, 0.3))
    assert record.fail_stale(reopened, running, "worker died")
    failed = open_study("p", str(tmp_path / "p.journal"), create=False).get_trials(states=(TrialState.FAIL,))[0]
    assert record.record(reopened, failed).rungs == ((10, 0.9), (40, 0.3))


def _config(tmp_path: Path, **kw) -> SearchConfig:
    space = write_space(tmp_path, steps=16)
    base = dict(space=str(space), trials=2, storage=str(tmp_path / "s.journal"), study="t", device="cpu")
    return SearchConfig(**{**base, **kw})


def test_a_search_with_pruning_stops_dominated_trials_and_does_not_count_them(tmp_path, monkeypatch):
    """A recorded trial at zero latency and memory with accuracy 1 dominates every candidate: each
    is stopped at a rung (step 4 or 8 of 16; the bound is too optimistic at 1/8 to stop
    anything), keeps its partial curve, and is not counted; a
    study of only pruned trials ends after MAX_UNTRAINED_IN_A_ROW of them instead of looping."""
    monkeypatch.setattr(study_module, "MAX_UNTRAINED_IN_A_ROW", 3)
    config = _config(tmp_path, prune=True)
    seeded = open_study("t", config.storage)
    seeded.add_trial(create_trial(values=[1.0, 1e-9, 1e-9], user_attrs=_attrs(1e-9, 1e-9, steps_done=80)))
    with pytest.raises(SearchError, match="stopped early"):
        run_search(config)
    study = open_study("t", config.storage, create=False)
    pruned = [r for r in record.records(study, (TrialState.PRUNED,)) if r.pruned_at is not None]
    assert len(pruned) == 3 and n_complete(study) == 1
    for r in pruned:
        assert r.pruned_at in (4, 8) and (r.steps_done, r.stopped) == (r.pruned_at, "pruned")
        assert [s for s, _ in r.curve][-1] == r.pruned_at
        assert [s for s, _ in r.rungs] == [2, 4, 8][: [2, 4, 8].index(r.pruned_at) + 1]
        assert "trial 0 reached 1.000" in r.prune_reason
    assert record.study_setup(study).prune and worker_config("t", config.storage).prune


def test_a_search_with_pruning_and_no_rival_trains_every_trial_reporting_its_rungs(tmp_path):
    study = run_search(_config(tmp_path, prune=True))
    done = record.records(study, (TrialState.COMPLETE,))
    assert len(done) == 2 and n_pruned(study) == 0
    assert all([s for s, _ in r.rungs] == [2, 4, 8] and r.steps_done == 16 for r in done)


def test_pruning_is_off_by_default_and_fixed_when_the_study_is_created(tmp_path):
    study = run_search(_config(tmp_path, trials=1))
    assert not record.study_setup(study).prune
    assert all(not r.rungs for r in record.records(study))
    with pytest.raises(SearchError, match="early stopping off"):
        prepare(_config(tmp_path, trials=2, prune=True))
    ctx, _ = prepare(_config(tmp_path, trials=2))  # no flag: the study's setting
    assert ctx.pruner is None


def test_with_no_front_successive_halving_stops_the_worst_of_similar_cost(tmp_path):
    from nas.search.pruning import ETA

    study = _study(tmp_path)  # nothing completed: no front to compare with
    _running(study, 1.0, 1.0, {10: 0.5})
    assert CostAwarePruner().reason(study, _running(study, 1.2, 1.5, {10: 0.2})) is None  # 2 < ETA trials
    _running(study, 100.0, 100.0, {10: 0.9})  # far costlier: not among its peers
    _running(study, 1.0, 1.0, {20: 0.9})  # another rung: not compared
    _running(study, 1.1, 1.0, {10: 0.6})
    worst = _running(study, 1.3, 1.2, {10: 0.1})
    why = CostAwarePruner().reason(study, worst)
    assert ETA == 3 and why is not None and "successive halving" in why and "ranks 4 of 4" in why
    assert CostAwarePruner().reason(study, _running(study, 1.0, 1.1, {10: 0.55})) is None  # 2nd of 5: best 2 go on


def test_successive_halving_is_only_the_fallback_of_an_empty_front(tmp_path):
    study = _study(tmp_path, (0.99, 50.0, 50.0))  # a front, but slower and bigger: it dominates nothing here
    for acc in (0.5, 0.6, 0.7):
        _running(study, 1.0, 1.0, {10: acc})
    assert CostAwarePruner().reason(study, _running(study, 1.0, 1.0, {10: 0.05})) is None


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "gp", "random"])
def test_samplers_draw_past_a_trial_stopped_at_a_rung(tmp_path, sampler):
    """TPE ranks early-stopped trials by their last intermediate value in ``study.direction``,
    which a 3-objective study refuses; every sampler must keep drawing once one is PRUNED."""
    from optuna.distributions import FloatDistribution

    from nas.search.study import make_sampler

    x = {"x": FloatDistribution(0.0, 1.0)}
    study = open_study("s", str(tmp_path / "s.journal"), sampler=make_sampler(sampler, 0))
    for i in range(12):  # past every sampler's random start-up trials
        study.add_trial(create_trial(params={"x": i / 12}, distributions=x, values=[i / 12, 1.0, 1.0]))
    study.add_trial(
        create_trial(state=TrialState.PRUNED, params={"x": 0.5}, distributions=x, intermediate_values={10: 0.3})
    )
    trial = study.ask(x)
    assert 0.0 <= trial.params["x"] <= 1.0
