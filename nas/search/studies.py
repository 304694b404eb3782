"""A study of ``nas search`` in storage: the name a search's study gets (and the names older
versions gave, under which a study keeps resuming), opening or creating one with the
directions and metric names of its objectives, and the request a worker joining it runs."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import optuna

from nas.search import record
from nas.search.config import SearchConfig, SearchError
from nas.search.objectives import BY_METRIC, DEFAULT_OBJECTIVES, metrics, parse_objectives
from nas.search.setup import SearchSetup, StudyBudgets
from nas.search.storage import open_storage
from nas.space import SearchSpace
from nas.tasks import task_file

if TYPE_CHECKING:
    from nas.latency import LatencyShape

__all__ = [
    "DIRECTIONS",
    "METRICS",
    "open_study",
    "recorded_setup",
    "resumed_name",
    "study_name",
    "worker_config",
]

METRICS = tuple(record.OBJECTIVES)  # the objectives a study of nas search records, in value order
DIRECTIONS = record.DIRECTIONS


def recorded_setup(name: str, storage: str) -> SearchSetup | None:
    """The ``search`` setup study ``name`` recorded, or None (no such study yet: nothing is created)."""
    try:
        existing = open_study(name, storage, create=False)
    except ValueError:
        return None
    return record.study_setup(existing)


def worker_config(
    study: str,
    storage: str,
    *,
    trials: int | None = None,
    device: str = "auto",
    worker: int | None = None,
    timeout: float | None = None,
    data: str | None = None,
) -> SearchConfig:
    """The request of a worker joining ``study``: what the study recorded (its setup, and the
    latest run's budgets), under this worker's flags (None: the study's; ``data``: the study's
    data file at another path on this host), parsed as the CLI's flags are."""
    existing = open_study(study, storage, create=False)
    setup = record.study_setup(existing)
    if setup is None:
        raise SearchError(f"study {study!r} in {storage} was not started by nas search; start it with nas search")
    return SearchConfig.parse(
        setup,
        record.study_budgets(existing) or StudyBudgets(),
        trials=trials,
        timeout=timeout,
        study=study,
        storage=storage,
        device=device,
        worker=os.getpid() if worker is None else worker,
        joins=True,
        data=data,
    )


def study_name(
    config: SearchConfig,
    space: SearchSpace,
    task_spec: str,
    *,
    legacy_target: bool = False,
    legacy_task: bool = False,
    legacy_settings: bool = False,
) -> str:
    """``--study``, else ``<space>-<task>-<target>``: the task's and a profile path's file names
    only (a name holds no path separator: it names files, and ``--study`` refuses one), then each
    setting a resume must repeat (``SearchSetup.IDENTITY``) that differs from its default, so
    that another search of the same space is another study: the latency shape (``-8x1024``), the
    objectives (``-accuracy+decode_latency``), ``-ctx8192``, ``-b8``. How older versions named
    studies: ``legacy_target``, the target as given (before target paths were cut to their file
    name); ``legacy_task``, a ``npz:path=FILE`` task as ``npz`` (before path= files were named:
    every file given that way shared one name); ``legacy_settings``, without those settings."""
    if config.study:
        return config.study
    named = None if legacy_task else task_file(task_spec)
    task_part = (named or task_spec.split(":", 1)[0]).replace("\\", "/").rsplit("/", 1)[-1]
    target = config.target if legacy_target else config.target.replace("\\", "/").rsplit("/", 1)[-1]
    settings = () if legacy_settings else _named_settings(config)
    return "-".join((space.name, task_part, target, *settings))


def _named_settings(config: SearchConfig) -> tuple[str, ...]:
    """The parts of a default study name for the settings ``config`` changes from their defaults
    (``+`` joins the objectives: a name's characters stay ones a shell and a file name take as
    they are); a study with default settings keeps the name it always had."""
    from nas.latency import parse_shape

    parts = []
    if (shape := str(parse_shape(config.latency_shape))) != str(parse_shape(SearchConfig.latency_shape)):
        parts.append(shape)
    if (objectives := parse_objectives(config.objectives)) != DEFAULT_OBJECTIVES:
        parts.append("+".join(objectives))
    if config.context is not None:
        parts.append(f"ctx{config.context}")
    if config.decode_batch != 1:
        parts.append(f"b{config.decode_batch}")
    return tuple(parts)


def resumed_name(
    config: SearchConfig, space: SearchSpace, task_spec: str, shape: LatencyShape, objectives: tuple[str, ...]
) -> str:
    """The study's name (``study_name``), or the name an older version gave a study of this run's
    settings, which keeps resuming under it."""
    name = study_name(config, space, task_spec)
    if recorded_setup(name, config.storage) is None:
        # a study an older version named (its target path whole, its path= file as "npz", or both;
        # its settings never) keeps resuming under its name, if it has this run's settings: one
        # with others is another study (the default one, say, when this run asks for decoding)
        settings = (str(shape), objectives, config.context, config.decode_batch)
        for old_target, old_task in ((False, False), (False, True), (True, False), (True, True)):
            legacy = study_name(
                config, space, task_spec, legacy_target=old_target, legacy_task=old_task, legacy_settings=True
            )
            old = recorded_setup(legacy, config.storage) if legacy != name else None
            if old is not None and (old.latency_shape, old.objectives, old.context, old.decode_batch) == settings:
                name = legacy
                break
    return name


def open_study(
    name: str,
    storage: str,
    *,
    sampler: optuna.samplers.BaseSampler | None = None,
    create: bool = True,
    on_create: Callable[[optuna.Study], None] | None = None,
    objectives: Sequence[str] = DEFAULT_OBJECTIVES,
) -> optuna.Study:
    """Load study ``name``, or (with ``create``) make it with the directions and metric names of
    ``objectives`` (``nas.search.objectives`` names).

    ``on_create`` runs once, in the one process whose ``create_study`` made the study (the
    storage refuses a second creator, which joins instead): what a study must receive exactly
    once, such as its baselines, goes there. An existing study is only read here: a refused
    resume must leave its storage byte-identical. Without ``create`` the storage must exist
    (nothing is created) and a journal is opened for reading only (``open_storage``).
    """
    store = open_storage(storage, write=create)
    try:
        study = optuna.load_study(study_name=name, storage=store, sampler=sampler)
    except KeyError:
        if not create:
            known = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
            raise SearchError(f"no study named {name!r} in {storage}; studies there: {known}") from None
        names = metrics(objectives)
        directions = [BY_METRIC[m].direction for m in names]
        try:
            study = optuna.create_study(study_name=name, storage=store, sampler=sampler, directions=directions)
        except optuna.exceptions.DuplicatedStudyError:  # another process started it a moment ago: join it
            return open_study(name, storage, sampler=sampler, create=False)
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in practice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(names))
        if on_create is not None:
            on_create(study)
        return study
    found = [d.name.lower() for d in study.directions]
    names = study.metric_names or list(METRICS)  # studies of early releases did not name their metrics
    ours = len(names) == len(found) and all(
        m in BY_METRIC and BY_METRIC[m].direction == d for m, d in zip(names, found, strict=True)
    )
    if not ours:
        raise SearchError(
            f"study {name!r} in {storage} was not created by nas search (its objectives are "
            f"{list(study.metric_names or [])} with directions {found})"
        )
    return study
