"""Optuna glue: open or resume a study, and evaluate candidates until N trials have been trained.

Objectives: by default maximize accuracy, minimize latency_ms, minimize memory_mb; a study may
choose 2-4 of ``nas.search.objectives`` instead (fixed when it is created). Hard budgets become
Optuna constraints (feasible when ≤ 0); latency is scored before training so a candidate that
breaks a budget is recorded without being trained (``nas.search.objective``) and does not count toward
the trial budget. Several workers may share a study: the trial budget is counted in storage. A
trial left RUNNING by a dead process is failed and its parameters are queued again (same host:
by pid; RDB: by Optuna's heartbeat), so a killed search resumes where it stopped.

Trial ``n`` samples with a sampler seeded from (study seed, ``n``) over the study's history, so a
resumed or parallel run continues the sequence instead of replaying it, and a seeded run repeated
from scratch proposes the same first trials.

This module is the face of the search's study, split by job (as Optuna re-exports its private
modules): ``config`` (what a run is asked to do), ``studies`` (a study's name, opening one,
a joining worker's request), ``start`` (the checks and ``prepare``), ``resume`` (a resume checked
against its record), ``sampler`` and ``loop`` (``run_search``).
"""

from __future__ import annotations

from nas.search.config import SearchConfig, SearchError
from nas.search.loop import (
    n_complete,
    n_infeasible,
    n_pruned,
    n_truncated,
    recover_stale_trials,
    run_search,
)
from nas.search.resume import not_retrained, requeue_truncated
from nas.search.sampler import TPE_STARTUP, make_sampler
from nas.search.setup import SAMPLERS
from nas.search.start import prepare, resolve_device, resolve_measure, resolve_target
from nas.search.studies import DIRECTIONS, METRICS, open_study, study_name, worker_config

__all__ = [
    "DIRECTIONS",
    "METRICS",
    "SAMPLERS",
    "TPE_STARTUP",
    "SearchConfig",
    "SearchError",
    "make_sampler",
    "n_complete",
    "n_infeasible",
    "n_pruned",
    "n_truncated",
    "not_retrained",
    "open_study",
    "prepare",
    "recover_stale_trials",
    "requeue_truncated",
    "resolve_device",
    "resolve_measure",
    "resolve_target",
    "run_search",
    "study_name",
    "worker_config",
]
