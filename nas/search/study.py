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
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from hardware_profiles import HardwareProfile, ProfileError, list_profiles, load_profile, parse_profile
from kernels.device import DeviceError, gpu_name, is_cuda, resolve
from nas.search import faults, interrupt, record
from nas.search.baselines import baselines
from nas.search.objective import Budgets, TrialContext, evaluate
from nas.search.objectives import BY_METRIC, DEFAULT_OBJECTIVES, metrics, needs_context, parse_objectives
from nas.search.pruning import CostAwarePruner
from nas.search.setup import MAX_BATCH, MAX_CONTEXT, MAX_TRIALS, SAMPLERS, SearchSetup, StudyBudgets
from nas.search.storage import DEFAULT_STORAGE, check_artifact_dir, claim_lock, open_artifact_store, open_storage
from nas.space import SearchSpace, load_space, parse_space_text
from nas.tasks import Task, TaskError, load_task, task_file, task_moved

__all__ = [
    "DIRECTIONS",
    "METRICS",
    "SAMPLERS",
    "SearchConfig",
    "SearchError",
    "make_sampler",
    "n_complete",
    "n_infeasible",
    "n_pruned",
    "n_truncated",
    "open_study",
    "prepare",
    "recover_stale_trials",
    "run_search",
    "worker_config",
]

logger = logging.getLogger(__name__)

METRICS = tuple(record.OBJECTIVES)  # the objectives a study of nas search records, in value order
DIRECTIONS = record.DIRECTIONS
MAX_FAILURES_IN_A_ROW = 20  # a space where nothing trains should stop, not spin
# candidates in a row that were not trained (they break a hard budget, or repeat a configuration
# already tried): each costs a sample and a latency score, so a space with too few feasible (or
# too few distinct) candidates stops with a message instead of sampling forever
MAX_UNTRAINED_IN_A_ROW = 100
POLL_SECONDS = 1.0  # while other workers finish the last trials of the budget


class SearchError(ValueError):
    """A search cannot start as asked (bad study/config combination); the message says why."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything that defines a search run. ``study`` None derives a name from space/task/target.
    ``space_yaml`` (the space file's text, as a study records it) takes precedence over ``space``;
    ``worker`` labels this worker's progress lines (sampling depends on trial numbers only)."""

    space: str = "hybrid_small"
    task: str | None = None  # None: the space's default task
    trials: int = 20
    timeout: float | None = None
    study: str | None = None
    storage: str = DEFAULT_STORAGE
    sampler: str | None = None  # None: what the study recorded ("tpe" for a new one)
    target: str = "auto"
    latency_shape: str = "1x256"
    max_latency_ms: float | None = None
    max_params: int | None = None
    max_memory_mb: float | None = None
    trial_timeout: float | None = None
    seed: int | None = None  # None: what the study recorded (0 for a new one)
    device: str = "auto"
    space_yaml: str | None = None
    worker: int = 0
    joins: bool = False  # a worker: the task is the study's as recorded, whatever its path names here
    data: str | None = None  # a worker: the study's data file at another path here (the same bytes)
    # Latency: True = measure the candidates' kernels on this GPU, False = predict from the profile,
    # None = measure when the search runs on a CUDA device and targets it (--target auto, or the
    # profile of the local GPU), otherwise predict.
    measure: bool | None = None
    # Early stopping on known costs (nas.search.pruning): None = what the study recorded (off for a new one)
    prune: bool | None = None
    # Queue the reference architectures (nas.search.baselines) when this run creates the study
    baselines: bool = True
    # What the study optimises (nas.search.objectives names); the generation objectives are
    # measured for decode_batch sequences at context tokens each
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    context: int | None = None
    decode_batch: int = 1
    # the training's wall-clock guard in seconds instead of the space's max_train_seconds (the
    # study records it for its workers, as it does the budgets)
    max_train_seconds: float | None = None
    # a resume re-queues the study's truncated trials, to train them in full on top of ``trials``
    retrain_truncated: bool = False


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
        self._inner = _seeded_sampler(self._name, _trial_seed(self._seed, trial.number))
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


TPE_STARTUP = 5  # trials TPE draws at random before it models the history (baselines count)


def _seeded_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """A seeded sampler; all of them read the constraints set by ``trial.set_constraint``."""
    if name == "tpe":
        # group=True: the per-layer parameters exist only for some depths/mixers; grouping models
        # each co-occurring set jointly (benchmarks/search_quality.py: higher front hypervolume)
        with warnings.catch_warnings():  # multivariate/group are marked experimental in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # 5 random trials before the model (Optuna's default: 10): at 40 trials on the
            # benchmark's space, 1.22x random's hypervolume at equal wall-clock (p 0.006) against
            # 1.16x (p 0.07) with 10 (docs/benchmarks.md, search quality)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=TPE_STARTUP)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        # per-layer parameters are conditional by design; GP samples those independently
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise SearchError(f"unknown sampler {name!r}; choose one of {list(SAMPLERS)}")


def resolve_device(device: str) -> torch.device:
    try:
        return resolve(device)
    except DeviceError as e:
        raise SearchError(f"--{e}") from None


def resolve_target(target: str) -> HardwareProfile:
    """The profile latency is predicted for: ``auto`` is the local GPU's profile, else h200."""
    if target == "auto":
        from hardware_profiles import detect_profile

        return detect_profile() or load_profile("h200")
    return load_profile(target)


def resolve_measure(measure: bool | None, target: str, profile: HardwareProfile, device: torch.device) -> bool:
    """Whether trials measure latency on this GPU (see ``SearchConfig.measure``)."""
    if measure is None:
        if not is_cuda(device):
            return False
        if target == "auto":
            return True
        from hardware_profiles import detect_profile

        local = detect_profile(gpu_name(device))
        return local is not None and local.name == profile.name
    if measure and not is_cuda(device):
        raise SearchError(
            "--measure times the candidates' kernels on a CUDA device; none is in use here "
            "(drop --measure to predict latency from a hardware profile)"
        )
    return measure


def _recorded_setup(name: str, storage: str) -> SearchSetup | None:
    """The ``search`` setup study ``name`` recorded, or None (no such study yet: nothing is created)."""
    try:
        existing = open_study(name, storage, create=False)
    except ValueError:
        return None
    return record.study_setup(existing)


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A worker records its pid and host right after it takes a trial (``record.write_start``): a
# RUNNING trial still without them this long after its start lost its process in between (a kill
# in that window), and nothing else would ever fail it (a resume then waited on it for good).
UNCLAIMED_GRACE_S = 60.0


def _now() -> datetime.datetime:
    return datetime.datetime.now()  # naive local time, as Optuna stamps datetime_start


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker process on this host is gone and re-queue their params.

    Returns the numbers of the trials that were failed. Trials of live processes, or of other
    hosts (covered by RDB heartbeats), are left alone; so is a trial not yet claimed (no pid),
    until ``UNCLAIMED_GRACE_S`` after its start (a guard: it is logged when it fires).
    """
    host, recovered = socket.gethostname(), []
    now = _now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        r = record.record(study, t)
        if r.pid is None and r.host is None:
            started = t.datetime_start
            if started is None or (now - started).total_seconds() < UNCLAIMED_GRACE_S:
                continue
            reason = f"no worker claimed it within {UNCLAIMED_GRACE_S:.0f} s of its start (its process died first)"
            if record.fail_stale(study, t, f"{reason}; parameters re-queued"):
                logger.warning("trial %d: %s", t.number, reason)
                recovered.append(t.number)
            continue
        if r.host != host or r.pid is None or _pid_alive(int(r.pid)):
            continue
        if record.fail_stale(study, t, f"worker died (pid {r.pid}); parameters re-queued"):
            recovered.append(t.number)
    if recovered:
        logger.warning("re-queued trials of dead workers: %s", recovered)
    return recovered


def n_complete(study: optuna.Study) -> int:
    """Completed trials that trained their candidate: what ``--trials`` counts."""
    return sum(r.trained for r in record.records(study, (TrialState.COMPLETE,)))


def n_infeasible(study: optuna.Study) -> int:
    """Completed trials recorded without training (they break a hard budget); not counted by --trials."""
    return sum(not r.trained for r in record.records(study, (TrialState.COMPLETE,)))


def n_pruned(study: optuna.Study) -> int:
    """Trials early stopping stopped at a rung (PRUNED, partly trained); not counted by --trials."""
    return sum(r.pruned_at is not None for r in record.records(study, (TrialState.PRUNED,)))


def n_truncated(study: optuna.Study) -> int:
    """Trained trials whose training the wall-clock guard stopped early (kept off the front)."""
    return sum(r.truncated for r in record.records(study, (TrialState.COMPLETE,)))


def _n_running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def _load_space(config: SearchConfig) -> SearchSpace:
    if config.space_yaml is not None:  # a file without `name:` was recorded under its file name
        return parse_space_text(config.space_yaml, f"{config.space} (as recorded in the study)", config.space)
    return load_space(config.space)


def prepare(config: SearchConfig) -> tuple[TrialContext, optuna.Study]:
    """Validate everything a search needs and open (or resume) its study; nothing is trained yet.
    Every check runs before the study is opened, so a refused command writes nothing."""
    faults.check()  # a malformed NAS_FAULT is refused here, not at the first trial
    if not 1 <= config.trials <= MAX_TRIALS:
        raise SearchError(f"--trials must be between 1 and {MAX_TRIALS:,}, got {config.trials:,}")
    if config.study is not None and not config.study.strip():
        raise SearchError("--study must be a non-empty name (leave it out for <space>-<task>-<target>)")
    if config.study is not None and (
        any(c in config.study for c in "/\\") or config.study in (".", "..") or not config.study.isprintable()
    ):
        raise SearchError(
            f"--study {config.study!r}: a study name cannot hold a path separator or control characters "
            "(it names the report's and exports' default files)"
        )
    if config.seed is not None and not 0 <= config.seed < 2**32:  # the samplers' and numpy's seed range
        raise SearchError(f"--seed must be in [0, 2**32 - 1], got {config.seed}")
    for flag, value in (
        ("--timeout", config.timeout),
        ("--trial-timeout", config.trial_timeout),
        ("--max-train-seconds", config.max_train_seconds),
        ("--max-latency-ms", config.max_latency_ms),
        ("--max-params", config.max_params),
        ("--max-memory-mb", config.max_memory_mb),
    ):
        if value is not None and value <= 0:
            raise SearchError(f"{flag} must be > 0, got {value}")
    from nas.latency import parse_shape

    try:
        shape = parse_shape(config.latency_shape)
    except ValueError as e:
        raise SearchError(f"--latency-shape: {e}") from None
    if shape.batch > MAX_BATCH or shape.seq_len > MAX_CONTEXT:
        raise SearchError(
            f"--latency-shape {shape}: at most {MAX_BATCH:,} sequences of {MAX_CONTEXT:,} tokens, got "
            f"{shape.batch:,} of {shape.seq_len:,}"
        )
    objectives = _check_objectives(config)
    space = _load_space(config)
    space.check_measurable()  # measured or predicted, latency is of the kernels: they must run every candidate
    task_spec = config.task or space.task
    name = study_name(config, space, task_spec)
    if _recorded_setup(name, config.storage) is None:
        # a study an older version named (its target path whole, its path= file as "npz", or both;
        # its settings never) keeps resuming under its name, if it has this run's settings: one
        # with others is another study (the default one, say, when this run asks for decoding)
        settings = (str(shape), objectives, config.context, config.decode_batch)
        for old_target, old_task in ((False, False), (False, True), (True, False), (True, True)):
            legacy = study_name(
                config, space, task_spec, legacy_target=old_target, legacy_task=old_task, legacy_settings=True
            )
            old = _recorded_setup(legacy, config.storage) if legacy != name else None
            if old is not None and (old.latency_shape, old.objectives, old.context, old.decode_batch) == settings:
                name = legacy
                break
    check_artifact_dir(config.storage)  # a file in its place would fail the first trial, after the study is written
    stored = _recorded_setup(name, config.storage)
    flags = (("--context", config.context is not None), ("--decode-batch", config.decode_batch != 1))
    given = [flag for flag, on in flags if on]
    if stored is None and given and not needs_context(objectives):  # a resume of a study recorded so keeps working
        flags = " and ".join(given)
        raise SearchError(
            f"{flags}: only the generation objectives (prefill_latency, decode_latency, cache_memory) use "
            f"{'them' if len(given) > 1 else 'it'}, and --objectives {','.join(objectives)} has none: add one "
            f"(e.g. --objectives accuracy,latency,decode_latency), or drop {flags}"
        )
    if stored is None and (distinct := space.configurations()) is not None and config.trials > distinct:
        # a new study only: a resumed one may hold repeats enqueued on purpose, which do train
        raise SearchError(
            f"--trials {config.trials:,}: space {space.name} holds {distinct:,} distinct configuration(s), and a "
            f"configuration is trained once; use --trials {distinct:,} or less, or widen the space"
        )
    sampler_name, seed = _sampler_and_seed(config, name, stored)
    if stored is not None:
        _check_recorded_space(name, stored, space)
    elsewhere = config.data if config.joins else task_file(task_spec)
    task = _recorded_task(name, stored, elsewhere, config_joins=config.joins) if stored is not None else None
    if task is not None and not config.joins:
        task_spec = _resumed_task_spec(name, stored, task, task_spec, seed)
    try:
        task = task or load_task(task_spec, seed=seed)
    except TaskError as e:
        if config.task is not None:
            raise
        raise SearchError(f"{space.source}: task: {e}") from None  # the space's default task: name its file
    if task.readout != "token" and {"decode_latency", "prefill_latency", "cache_memory"} & set(objectives):
        raise SearchError(
            f"--objectives {','.join(objectives)}: task {task.name} scores one label per sequence (readout "
            f"{task.readout!r}); its models do not generate tokens, so they have no decoding costs"
        )
    _note_batch_clipping(space, task)
    recorded_profile = _recorded_profile(name, stored) if stored is not None else None
    # a worker predicts with the study's profile: its --target may be a path that means another
    # file (or none) where it runs, and "auto" another GPU's profile
    joined = recorded_profile is not None and config.joins
    profile = recorded_profile if joined else resolve_target(config.target)
    device = resolve_device(config.device)
    requested = config.measure
    if requested is None and stored is not None:  # no flag: a resumed study keeps its kind of latency
        requested = stored.measure
        if requested and not is_cuda(device):
            raise SearchError(
                f"study {name!r} measures latency on a GPU ({stored.profile}); run this on a "
                f"CUDA device (--device cuda), or start another study with --predict"
            )
    measure = resolve_measure(requested, config.target, profile, device)
    if measure:
        here = gpu_name(device) if joined else profile.name  # joined: the profile is the recorded one
        if stored is not None and stored.measure and not (profile.lists(here) if joined else here == stored.profile):
            raise SearchError(
                f"study {name!r} holds latencies measured on {stored.profile}; this GPU is "
                f"{here}: join it from that kind of GPU, or use another --study name"
            )
    if recorded_profile is not None and not joined:
        profile = _resumed_profile(name, config.target, recorded_profile, profile)
    prune = bool(stored.prune if config.prune is None and stored is not None else config.prune)
    if stored is not None and stored.prune != prune:
        raise SearchError(
            f"study {name!r} was created with early stopping {'on' if stored.prune else 'off'}; "
            f"drop --{'no-' if stored.prune else ''}prune to resume it, or use another --study name"
        )
    sampler = make_sampler(sampler_name, seed)

    def enqueue_baselines(new: optuna.Study) -> None:
        for baseline in baselines(space) if config.baselines else ():
            record.enqueue_baseline(new, baseline.label, baseline.params)

    study = open_study(name, config.storage, sampler=sampler, on_create=enqueue_baselines, objectives=objectives)
    space_yaml = config.space_yaml if config.space_yaml is not None else space.text
    setup = SearchSetup(
        space=space.name,
        space_yaml=space_yaml,
        task=task_spec,
        target=config.target,
        profile=profile.name,
        profile_yaml=profile.text,
        latency_shape=str(shape),
        sampler=sampler_name,
        seed=seed,
        measure=measure,
        prune=prune,
        space_source=space.source,
        task_config=task.config,
        test_size=len(task.x_test),
        test_targets=task.scored_targets,
        objectives=objectives,
        context=config.context,
        decode_batch=config.decode_batch,
    )
    if stored is not None:
        if (differs := stored.differs(setup)) is not None:
            key, was, now = differs
            raise SearchError(
                f"study {name!r} was created with {key}={was!r}, not {now!r}; "
                f"use the same settings or another --study name"
            )
        if stored.measure != measure:
            was, now = ("measured", "predicted") if stored.measure else ("predicted", "measured")
            raise SearchError(
                f"study {name!r} holds {was} latencies and this run would record {now} ones "
                f"({'pass --measure on a CUDA device' if was == 'measured' else 'pass --predict'} "
                f"to match, or use another --study name)"
            )
    else:
        record.write_study_setup(study, setup)
    budgets = Budgets(
        config.max_latency_ms, config.max_params, config.max_memory_mb, config.trial_timeout, config.max_train_seconds
    )
    # re-queued truncated trials are trained on top of --trials: each was counted once already
    retrained = requeue_truncated(study) if config.retrain_truncated and stored is not None else ()
    recorded = StudyBudgets(
        trials=config.trials + len(retrained),
        max_latency_ms=budgets.max_latency_ms,
        max_params=budgets.max_params,
        max_memory_mb=budgets.max_memory_mb,
        trial_timeout=budgets.trial_timeout,
        max_train_seconds=budgets.max_train_seconds,
    )
    before = record.study_budgets(study)
    if before != recorded:
        if before is not None:  # a resume that changes them says so: they are the study's, not this run's
            changes = ", ".join(before.changes(recorded))
            logger.warning(
                "study %r: recorded budgets changed (%s); workers, the front, the report and nas export use the "
                "new ones, for the trials trained before too (the stored constraints and the hypervolume keep "
                "the budgets each trial was scored under)",
                name,
                changes,
            )
        record.write_study_budgets(study, recorded)  # the latest run's budgets: workers and the report read them
    pruner = CostAwarePruner(start_of=task.stage1_steps) if prune else None
    if pruner is not None:
        study.pruner = pruner  # what Trial.should_prune would ask (optuna-native tools see it)
    return TrialContext(
        space,
        task,
        profile,
        shape,
        device,
        budgets,
        open_artifact_store(config.storage),
        measure=measure,
        objectives=record.objectives_of(study),
        pruner=pruner,
        context=config.context,
        decode_batch=config.decode_batch,
        retrained=retrained,
        seed=seed,
    ), study


def _retraining(study: optuna.Study) -> tuple[list[record.TrialRecord], list[record.TrialRecord]]:
    """(truncated trials no trial retrains, truncated trials whose retrain waits or runs).

    A retrain is the truncated trial's parameters queued again (``requeued_from``), and may itself
    be interrupted and queued again, or cut short again: trials are grouped by the trial their
    chain of ``requeued_from`` starts at. A group is done when one of its trials trained in full,
    and pending while one waits or runs; otherwise its latest truncated trial needs a retrain."""
    every = record.records(study)
    by_number = {r.number: r for r in every}

    def root(r: record.TrialRecord) -> int:
        seen = set()
        while r.requeued_from is not None and r.requeued_from in by_number and r.number not in seen:
            seen.add(r.number)
            r = by_number[r.requeued_from]
        return r.number

    cut = {root(r): r for r in every if r.complete and r.truncated}  # the latest per group (trial order)
    running = (TrialState.WAITING, TrialState.RUNNING)
    done = {root(r) for r in every if r.trained and not r.truncated}
    waiting = {root(r) for r in every if r.state in running} & (cut.keys() - done)
    return [r for key, r in cut.items() if key not in done | waiting], [cut[key] for key in sorted(waiting)]


def not_retrained(study: optuna.Study) -> list[int]:
    """The truncated trials nothing retrains: none of their retrains trained in full, none waits."""
    return [r.number for r in _retraining(study)[0]]


def requeue_truncated(study: optuna.Study) -> tuple[int, ...]:
    """Queue the parameters of every truncated trial nothing retrains (``not_retrained``) again, to
    be trained in full (``--retrain-truncated``; a baseline keeps its label). Returns the truncated
    trials whose retrain is queued now: those queued here, and those an earlier run queued that
    have not run (the caller adds them all to the trials to reach, so that they do)."""
    needed, pending = _retraining(study)
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    for r in needed:
        record.requeue(study, frozen[r.number])
    return tuple(sorted(r.number for r in needed + pending))


def _sampler_and_seed(config: SearchConfig, name: str, stored: SearchSetup | None) -> tuple[str, int]:
    """The sampler and seed this run uses: those a resumed study recorded (a flag asking for
    others is refused: the study's trials continue one seeded sequence), else the flags'."""
    if stored is None:
        return config.sampler or "tpe", config.seed or 0
    for flag, asked, recorded in (("sampler", config.sampler, stored.sampler), ("seed", config.seed, stored.seed)):
        if asked is not None and asked != recorded:
            raise SearchError(
                f"study {name!r} was created with --{flag} {recorded}, not {asked}; drop --{flag} to resume it, "
                f"or start another study with --study NEW_NAME"
            )
    return stored.sampler, stored.seed


def _check_recorded_space(name: str, stored: SearchSetup, space: SearchSpace) -> None:
    """SearchError unless ``space`` samples and trains as the one study ``name`` was created with
    (another space of the same ``name:`` would mix two searches in one study, or crash Optuna on
    a parameter whose choices changed)."""
    if not stored.space_yaml or stored.space != space.name:  # another name: the identity check says so
        return
    recorded = parse_space_text(stored.space_yaml, f"{stored.space} (as recorded in study {name!r})", stored.space)
    if changed := recorded.differences(space):
        raise SearchError(
            f"study {name!r} was created with another version of space {space.name!r} ({'; '.join(changed)}); "
            f"resume it with the recorded space, or start another study with --study NEW_NAME (or another "
            f"name: in the space file)"
        )


def _recorded_task(
    name: str, stored: SearchSetup, elsewhere: str | None = None, *, config_joins: bool = False
) -> Task | None:
    """The task study ``name`` was created with, rebuilt from its record (a data file by the path
    resolved at creation, and only from the same bytes), or None for a study that recorded none.
    A resume or a worker in another folder, or after the file was replaced, must not train on
    other data than the trials already in the study.

    ``elsewhere`` (a resume's ``--task`` path, a worker's ``--data``): where the file is on this
    host when the recorded path does not hold it (moved, or mounted elsewhere); it is used only
    if it holds the recorded bytes. A worker's ``--data`` (``config_joins``) is read first and
    refused without them; a resume's ``--task`` is compared as a task by ``_resumed_task_spec``."""
    if not stored.task_config:
        return None
    try:
        task, moved = task_moved(dict(stored.task_config), elsewhere, explicit=config_joins)
    except TaskError as e:
        raise SearchError(
            f"study {name!r} must train on the data it was created with: {e}; restore that file (or name "
            f"where it is now: a resume's --task, nas worker --data), or start another study with --study NEW_NAME"
        ) from None
    if moved is not None:
        logger.warning("study %r: %s; training on %s, which holds the same bytes", name, moved, task.config["path"])
    return task


def _recorded_profile(name: str, stored: SearchSetup) -> HardwareProfile | None:
    """The hardware profile study ``name`` was created with, from the text it recorded (None for
    a study from before profiles were recorded)."""
    if not stored.profile_yaml:
        return None
    try:
        return parse_profile(stored.profile_yaml, f"profile {stored.profile} (as recorded in study {name!r})")
    except ProfileError as e:  # a profile this version refuses (e.g. a copied calibration)
        raise SearchError(f"{e}; start another study with --study NEW_NAME") from None


def _resumed_profile(name: str, target: str, recorded: HardwareProfile, asked: HardwareProfile) -> HardwareProfile:
    """The profile a resume of study ``name`` predicts with: the one it was created with, so one
    study's latencies rest on one profile. SearchError when ``--target`` names a profile file
    whose fields now differ (an edit the user would expect to take effect, and which would mix
    two profiles' numbers on one front) or another profile; a shipped profile that changed since
    (a newer calibration) or ``auto`` resolving to another GPU here is only noted."""
    changed = [
        f.name
        for f in dataclasses.fields(HardwareProfile)
        if f.compare
        # text, and the device memory (only compared with the memory objectives): not what a prediction reads
        and f.name not in ("description", "sources", "memory_gb")
        and getattr(asked, f.name) != getattr(recorded, f.name)
    ]
    if not changed:
        return recorded
    if asked.name != recorded.name and target != "auto":
        raise SearchError(
            f"study {name!r} was created with hardware profile {recorded.name!r}; --target {target} is "
            f"{asked.name!r}: use the same profile, or start another study with --study NEW_NAME"
        )
    if target != "auto" and target not in list_profiles():
        raise SearchError(
            f"study {name!r} was created with another version of profile {recorded.name!r} ({target} now "
            f"differs in {', '.join(changed)}): its latencies rest on the recorded one; restore the file, or start "
            f"another study with --study NEW_NAME"
        )
    logger.warning(
        "study %r predicts latency with the profile it was created with (%s); --target %s here is %s, which "
        "differs in %s: start another study to use it",
        name,
        recorded.name,
        target,
        asked.name,
        ", ".join(changed),
    )
    return recorded


def _resumed_task_spec(name: str, stored: SearchSetup, recorded: Task, task_spec: str, seed: int) -> str:
    """The task spec a resume of study ``name`` compares with the recorded one: the recorded spec
    when ``task_spec`` names the same task in other words (``./d.npz`` for ``d.npz``, an absolute
    path, the same parameters in another order or at their defaults), else ``task_spec`` itself
    (the identity check then refuses it). SearchError when ``task_spec`` is spelled as recorded
    but names another data file here (a ``d.npz`` in another folder, with other bytes): the
    study trains on its own file, and training on it silently would not be what was asked for."""
    same_words = task_spec == stored.task
    if same_words and not _names_another_file(task_spec, recorded):
        return task_spec
    try:
        asked = load_task(task_spec, seed=seed)
    except TaskError as e:
        if same_words:  # a file here by the recorded name, which is not a data file
            raise SearchError(
                f"study {name!r} trains on {_data_text(recorded.config)}; --task {task_spec} here: {e}"
            ) from None
        raise SearchError(f"--task {task_spec}: {e}") from None
    if _without_path(asked.config) == _without_path(recorded.config):  # a data file: the same bytes, anywhere
        return stored.task
    if "sha256" in asked.config and asked.config["sha256"] != recorded.config.get("sha256"):  # other data
        raise SearchError(
            f"study {name!r} trains on {_data_text(recorded.config)}; --task {task_spec} here is "
            f"{_data_text(asked.config)}: pass the study's file, or start another study with --study NEW_NAME"
        )
    return task_spec


def _names_another_file(task_spec: str, recorded: Task) -> bool:
    """Whether ``task_spec`` names a data file that exists here and is not ``recorded``'s."""
    path, named = recorded.config.get("path"), task_file(task_spec)
    if not isinstance(path, str) or named is None:
        return False
    here = Path(named).expanduser()
    return here.is_file() and str(here.resolve()) != path


def _without_path(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "path"}


def _data_text(config: Mapping[str, Any]) -> str:
    """``/data/d.npz (sha256 0123456789ab…)``: a data file task's file, for one line."""
    if "sha256" not in config:
        return f"task {config.get('name')!r}"
    return f"{config.get('path')} (sha256 {str(config['sha256'])[:12]}…)"


def _check_objectives(config: SearchConfig) -> tuple[str, ...]:
    """The objectives asked for, with the context they need (SearchError naming the flag)."""
    try:
        objectives = parse_objectives(config.objectives)
    except ValueError as e:
        raise SearchError(str(e)) from None
    for flag, value, most in (
        ("--context", config.context, MAX_CONTEXT),
        ("--decode-batch", config.decode_batch, MAX_BATCH),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SearchError(f"{flag} must be a positive number of tokens/sequences, got {value!r}")
        if value is not None and value > most:
            raise SearchError(f"{flag} must be at most {most:,}, got {value:,}")
    if needs_context(objectives) and config.context is None:
        raise SearchError(
            f"--objectives {','.join(objectives)}: prefill_latency, decode_latency and cache_memory are "
            f"measured at a context: pass --context N (tokens per sequence, e.g. --context 32768)"
        )
    return objectives


def _note_batch_clipping(space: SearchSpace, task: Task) -> None:
    """One line when the space asks for batches larger than the task's training split (they are
    clipped to it: a batch is drawn with replacement, so more rows only repeat rows)."""
    rows, largest = task.x_train.shape[0], max(space.train["batch_size"].values())
    if largest > rows:
        logger.warning(
            "train.batch_size: %d is more than the %d training rows of task %s; batches are clipped to %d",
            largest,
            rows,
            task.name,
            rows,
        )


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
    """The SearchConfig a worker joining ``study`` runs with, read back from what the study recorded
    (``data``: the study's data file at another path on this host)."""
    existing = open_study(study, storage, create=False)
    setup, budgets = record.study_setup(existing), record.study_budgets(existing) or StudyBudgets()
    if setup is None:
        raise SearchError(f"study {study!r} in {storage} was not started by nas search; start it with nas search")
    return SearchConfig(
        space=setup.space,
        space_yaml=setup.space_yaml,
        task=setup.task,
        joins=True,
        data=data,
        trials=trials or budgets.trials,
        timeout=timeout,
        study=study,
        storage=storage,
        sampler=setup.sampler,
        target=setup.target,
        latency_shape=setup.latency_shape,
        max_latency_ms=budgets.max_latency_ms,
        max_params=budgets.max_params,
        max_memory_mb=budgets.max_memory_mb,
        trial_timeout=budgets.trial_timeout,
        max_train_seconds=budgets.max_train_seconds,
        seed=setup.seed,
        device=device,
        measure=setup.measure,
        prune=setup.prune,
        worker=os.getpid() if worker is None else worker,
        objectives=setup.objectives,
        context=setup.context,
        decode_batch=setup.decode_batch,
    )


@contextlib.contextmanager
def _heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record Optuna heartbeats for ``trial`` while it runs (RDB storages with heartbeat on), so
    another worker can tell this trial from one whose worker died."""
    storage = study._storage  # noqa: SLF001
    interval = storage.get_heartbeat_interval() if isinstance(storage, RDBStorage) else None
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
            stop.wait(interval)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _recover(study: optuna.Study) -> None:
    recover_stale_trials(study)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # RDB heartbeats; a no-op elsewhere


def _finished_elsewhere(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether ``trial``, which this process is running, was finished by another one: on a
    storage that handed it to two processes, or failed as stale by a worker that missed its
    heartbeats. Writing to it then fails (``UpdateFinishedTrialError``, "Cannot tell a COMPLETE
    trial"), and what the other process recorded stands."""
    return study._storage.get_trial(trial._trial_id).state.is_finished()  # noqa: SLF001 - no public single-trial read


def _surplus(study: optuna.Study, trial: optuna.Trial, trials: int) -> bool:
    """True when earlier-numbered trials already fill the budget (another worker got there first)."""
    ahead = [
        r
        for r in record.records(study, (TrialState.COMPLETE, TrialState.RUNNING))
        if r.number < trial.number and (r.state == TrialState.RUNNING or r.trained)
    ]
    return len(ahead) >= trials


def run_search(
    config: SearchConfig,
    *,
    on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    ctx_study: tuple[TrialContext, optuna.Study] | None = None,
) -> optuna.Study:
    """Evaluate trials until ``config.trials`` have been trained in storage (or the timeout passes).

    Safe to run in several processes on one study: a worker starts a trial only while trained
    plus running trials are below the budget, and gives a trial back (pruned, ``surplus``) when a
    race let earlier trials fill it. Candidates that break a hard budget, or repeat a configuration
    already tried (pruned, ``duplicate_of``), are recorded without training and not counted, nor
    are trials early stopping stopped at a rung (pruned, ``pruned_at``); after
    ``MAX_UNTRAINED_IN_A_ROW`` of them in a row the search stops with a SearchError.
    """
    ctx, study = ctx_study or prepare(config)
    start, failures, untrained = time.monotonic(), 0, 0
    failed_here: BaseException | None = None  # the error a trial was failed with in this process
    while True:
        with claim_lock(config.storage):
            _recover(study)
        done = n_complete(study)
        if done >= config.trials:
            break
        if config.timeout is not None and time.monotonic() - start > config.timeout:
            logger.info("timeout reached after %d completed trials", done)
            break
        if done + _n_running(study) >= config.trials:
            time.sleep(POLL_SECONDS)  # the rest of the budget is running elsewhere; it may still fail
            continue
        # Optuna warns that heartbeats are meant for optimize(); we beat by hand
        with claim_lock(config.storage), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask()
        try:
            record.write_start(trial)  # at once: a trial without its pid is recovered only after a grace
            if _surplus(study, trial, config.trials):
                record.write_surplus(trial, "the budget was filled by other workers")
                study.tell(trial, state=TrialState.PRUNED)
                continue
            try:
                with _heartbeat(study, trial):
                    state, values = evaluate(ctx, trial)
            except BaseException as exc:  # noqa: BLE001 - only Ctrl-C is handled here; the rest re-raised
                finished = isinstance(exc, optuna.exceptions.UpdateFinishedTrialError | ValueError)
                if finished and _finished_elsewhere(study, trial):
                    raise  # another process finished it while this one evaluated: handled below
                if not interrupt.is_interrupt(exc):
                    # an error no trial outcome covers (a bug): the trial is recorded as failed with
                    # it, not left RUNNING for a resume to re-queue into the same error, then raised
                    with contextlib.suppress(Exception):  # storage gone too: the error itself still surfaces
                        record.write_failure(trial, f"error: {type(exc).__name__}: {exc}"[:500])
                        study.tell(trial, state=TrialState.FAIL)
                    failed_here = exc  # told FAIL here: not "finished by another process" below
                    raise
                # a resume trains it again, as it does a dead worker's trial (a baseline was lost for good)
                record.write_failure(trial, "interrupted; parameters re-queued" if trial.params else "interrupted")
                record.requeue(study, study.tell(trial, state=TrialState.FAIL))
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise KeyboardInterrupt from exc  # Ctrl-C surfaced wrapped (e.g. inside an import)
            frozen = study.tell(trial, values, state=state) if values else study.tell(trial, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if exc is failed_here or not _finished_elsewhere(study, trial):
                raise
            logger.warning("trial %d was finished by another process; its record there stands", trial.number)
            if interrupt.requested():  # a Ctrl-C while writing it still stops the search
                raise KeyboardInterrupt from exc
            continue
        failures = failures + 1 if state == TrialState.FAIL else 0
        done = record.record(study, frozen)
        if done.trained:
            untrained = 0
        elif state != TrialState.FAIL:
            untrained += 1
        if on_trial is not None:
            on_trial(study, frozen)
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SearchError(
                f"{failures} trials in a row failed (last: {done.failure}); check the space's lr ranges and the task"
            )
        if untrained >= MAX_UNTRAINED_IN_A_ROW:
            raise SearchError(_untrained_message(untrained, done, n_complete(study), config.trials))
    return study


def _untrained_message(count: int, last: record.TrialRecord, trained: int, trials: int) -> str:
    if last.pruned_at is not None:
        return (
            f"{count} candidates in a row were not trained to the end (the last stopped early: "
            f"{last.prune_reason}); {trained} of {trials} trained so far: the front may be out of reach of "
            f"this space's remaining candidates (ask for fewer --trials, or run with --no-prune)"
        )
    if last.duplicate_of is not None:
        return (
            f"{count} candidates in a row repeated configurations already tried; the space seems exhausted "
            f"after {trained} of {trials} trained trials (widen the space or ask for fewer --trials)"
        )
    return (
        f"{count} candidates in a row broke a hard budget (last: {last.skipped_training}); "
        f"the space has too few feasible candidates ({trained} of {trials} trained so far): loosen the "
        f"budget or narrow the space"
    )
