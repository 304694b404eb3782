"""The study's sampler: trial ``n`` samples with a sampler seeded from (study seed, ``n``) over the
study's history, so a resumed or parallel run continues the sequence instead of replaying it, and
a seeded run repeated from scratch proposes the same first trials."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from nas.search.config import SearchError
from nas.search.record import baseline_of
from nas.search.setup import SAMPLERS

__all__ = ["TPE_STARTUP", "make_sampler"]


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """Sampler ``name`` that draws trial ``n`` with a fresh sampler seeded from (``seed``, ``n``)."""
    _seeded_sampler(name, seed)  # an unknown name fails here, before any study is opened
    return _TrialSeeded(name, seed)


def _trial_seed(seed: int, number: int) -> int:
    """The sampler seed of trial ``number`` in a study seeded with ``seed`` (independent streams)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "little")


class _TrialSeeded(optuna.samplers.BaseSampler):
    """Re-seeds per trial: before trial ``n`` a new sampler seeded with ``_trial_seed(seed, n)``
    takes over. Optuna's samplers keep no state between trials but their random generator (the
    model is refit from the study's trials every time), so this loses nothing; what it gains is
    that the draw of trial ``n`` depends on the history and ``n`` only, not on how many trials
    this process asked before: a resumed run or a second worker continues the sequence instead
    of replaying trials 0, 1, 2... of its own fresh generator."""

    def __init__(self, name: str, seed: int) -> None:
        self._name, self._seed = name, seed
        self._inner = _seeded_sampler(name, seed)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        baselines = sum(baseline_of(t) is not None for t in study.get_trials(deepcopy=False))
        self._inner = _seeded_sampler(self._name, _trial_seed(self._seed, trial.number), baselines=baselines)
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._inner.sample_relative(_RungsMaximised(study), trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._inner.sample_independent(_RungsMaximised(study), trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


class _RungsMaximised:
    """The study as a sampler reads it, with ``direction`` answered: TPE ranks a trial stopped
    early by its last intermediate value in ``study.direction``, which a multi-objective study
    refuses (RuntimeError: the first early-stopped trial ended every TPE search with --prune).
    Those values are our rungs, held-out accuracies, so the direction is MAXIMIZE; everything
    else is the study's own."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    @property
    def direction(self) -> optuna.study.StudyDirection:
        return optuna.study.StudyDirection.MAXIMIZE


TPE_STARTUP = 5  # trials TPE draws at random before it models the history, besides the baselines


def _seeded_sampler(name: str, seed: int, *, baselines: int = 0) -> optuna.samplers.BaseSampler:
    """A seeded sampler; all of them read the constraints set by ``trial.set_constraint``.
    ``baselines``: the study's reference trials, which TPE models but does not count as its own
    random exploration (three fixed architectures at one recipe teach it little about the space)."""
    if name == "tpe":
        # group=True: the per-layer parameters exist only for some depths/mixers; grouping models
        # each co-occurring set jointly (benchmarks/search_quality.py: higher front hypervolume)
        with warnings.catch_warnings():  # multivariate/group are marked experimental in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # random trials of its own before the model, the baselines not among them: counted in,
            # they left TPE too few draws to model the space (docs/benchmarks.md, search quality:
            # the start-up table)
            # constant_liar: a running trial of a parallel worker counts as a bad result, so two
            # workers do not propose the same point (Optuna 5's default, stated: the range admits it)
            return optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,
                constant_liar=True,
                n_startup_trials=TPE_STARTUP + baselines,
            )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        # per-layer parameters are conditional by design; GP samples those independently
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise SearchError(f"unknown sampler {name!r}; choose one of {list(SAMPLERS)}")
