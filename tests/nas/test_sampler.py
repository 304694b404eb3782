"""The study's sampler: TPE draws its own random start-up trials besides the baselines, and trial
``n``'s draw depends on the history and ``n`` only."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from nas.search.sampler import TPE_STARTUP, make_sampler
from nas.search.studies import open_study

X = {"x": FloatDistribution(0.0, 1.0)}


def _study(tmp_path, baselines: int, sampled: int) -> optuna.Study:
    tmp_path.mkdir(parents=True, exist_ok=True)
    study = open_study("s", str(tmp_path / "s.journal"), sampler=make_sampler("tpe", 0))
    for i in range(baselines + sampled):
        attrs = {"baseline": f"b{i}"} if i < baselines else {}
        study.add_trial(create_trial(params={"x": i / 20}, distributions=X, values=[0.5, 1.0, 1.0], user_attrs=attrs))
    return study


def _startup(study: optuna.Study) -> int:
    trial = study.ask(X)
    frozen = study._storage.get_trial(trial._trial_id)  # what the sampler saw before this draw
    sampler = study.sampler
    sampler.before_trial(study, frozen)
    return sampler._inner._n_startup_trials  # Optuna's own count; no public accessor


def test_the_baselines_do_not_count_as_tpes_random_start(tmp_path):
    assert _startup(_study(tmp_path / "a", baselines=3, sampled=0)) == TPE_STARTUP + 3
    assert _startup(_study(tmp_path / "b", baselines=0, sampled=0)) == TPE_STARTUP  # --no-baselines


def test_trial_n_draws_the_same_given_the_same_history(tmp_path):
    draws = []
    for run in ("a", "b"):
        study = _study(tmp_path / run, baselines=3, sampled=TPE_STARTUP + 2)  # past the start: TPE models
        draws.append(study.ask(X).params["x"])
    assert draws[0] == draws[1]
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials()[:-1])


def test_tpe_lies_about_running_trials_for_parallel_workers(tmp_path):
    """A running trial (another worker's) counts as a bad result for TPE's model, so workers
    started together do not all propose the same point; set explicitly, not left to Optuna's
    default of the day."""
    study = _study(tmp_path, baselines=0, sampled=1)
    _startup(study)  # before_trial: the trial's own sampler
    assert study.sampler._inner._constant_liar is True
