"""Optuna glue: open or resume a study, and evaluate candidates until N trials have completed.

Objectives: maximize accuracy, minimize latency_ms, minimize memory_mb. Hard budgets become
Optuna constraints (feasible when ≤ 0); latency is scored before training so a candidate that
breaks a budget is recorded without being trained (``nas.search.objective``). Several workers may share
a study: the trial budget is counted in storage. A trial left RUNNING by a dead process is failed
and its parameters are queued again (same host: by pid; RDB: by Optuna's heartbeat), so a killed
search resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import torch
import yaml
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from hardware_profiles import HardwareProfile, load_profile
from nas.search import interrupt
from nas.search.objective import Budgets, TrialContext, evaluate
from nas.search.storage import DEFAULT_STORAGE, open_artifact_store, open_storage
from nas.tasks import load_task
from nas.space import SearchSpace, load_space, parse_space

__all__ = ["DIRECTIONS", "METRICS", "SAMPLERS", "SearchConfig", "SearchError", "make_sampler", "n_complete",
           "open_study", "prepare", "recover_stale_trials", "run_search", "worker_config"]

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "latency_ms", "memory_mb")
DIRECTIONS = ("maximize", "minimize", "minimize")
SAMPLERS = ("tpe", "nsga2", "gp", "random")
MAX_FAILURES_IN_A_ROW = 20  # a space where nothing trains should stop, not spin
POLL_SECONDS = 1.0  # while other workers finish the last trials of the budget


class SearchError(ValueError):
    """A search cannot start as asked (bad study/config combination); the message says why."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything that defines a search run. ``study`` None derives a name from space/task/target.
    ``space_yaml`` (the space file's text, as a study records it) takes precedence over ``space``;
    ``worker`` offsets the sampler seed so parallel workers do not propose the same candidates."""

    space: str = "hybrid_small"
    task: str | None = None  # None: the space's default task
    trials: int = 20
    timeout: float | None = None
    study: str | None = None
    storage: str = DEFAULT_STORAGE
    sampler: str = "tpe"
    target: str = "auto"
    latency_shape: str = "1x256"
    max_latency_ms: float | None = None
    max_params: int | None = None
    max_memory_mb: float | None = None
    trial_timeout: float | None = None
    seed: int = 0
    device: str = "auto"
    space_yaml: str | None = None
    worker: int = 0
    # Latency: True = measure the candidates' kernels on this GPU, False = predict from the profile,
    # None = measure when the search runs on a CUDA device and targets it (--target auto, or the
    # profile of the local GPU), otherwise predict.
    measure: bool | None = None


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """A seeded sampler; all of them read the constraints set by ``trial.set_constraint``."""
    if name == "tpe":
        # group=True: the per-layer parameters exist only for some depths/mixers; grouping models
        # each co-occurring set jointly (benchmarks/search_quality.py: higher front hypervolume)
        with warnings.catch_warnings():  # multivariate/group are marked experimental in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        # per-layer parameters are conditional by design; GP samples those independently
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise SearchError(f"unknown sampler {name!r}; choose one of {list(SAMPLERS)}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SearchError(f"--device {device!r} is not a torch device (use auto, cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SearchError(f"--device {device!r} asked for CUDA but no CUDA device is available")
    return dev


def resolve_target(target: str) -> HardwareProfile:
    """The profile latency is predicted for: ``auto`` is the local GPU's profile, else h200."""
    if target == "auto":
        from hardware_profiles import detect_profile

        return detect_profile() or load_profile("h200")
    return load_profile(target)


def resolve_measure(measure: bool | None, target: str, profile: HardwareProfile, device: torch.device) -> bool:
    """Whether trials measure latency on this GPU (see ``SearchConfig.measure``)."""
    if measure is None:
        if device.type != "cuda":
            return False
        if target == "auto":
            return True
        from hardware_profiles import detect_profile

        local = detect_profile(torch.cuda.get_device_name(device))
        return local is not None and local.name == profile.name
    if measure and device.type != "cuda":
        raise SearchError("--measure times the candidates' kernels on a CUDA device; none is in use here "
                          "(drop --measure to predict latency from a hardware profile)")
    return measure


def _recorded_setup(name: str, storage: str) -> dict | None:
    """The ``search`` setup study ``name`` recorded, or None (no such study yet: nothing is created)."""
    try:
        existing = open_study(name, storage, create=False)
    except ValueError:
        return None
    return existing.user_attrs.get("search")


def study_name(config: SearchConfig, space: SearchSpace, task_spec: str) -> str:
    if config.study:
        return config.study
    task_part = task_spec.split(":", 1)[0].rsplit("/", 1)[-1]
    return f"{space.name}-{task_part}-{config.target}"


def open_study(name: str, storage: str, *, sampler: optuna.samplers.BaseSampler | None = None,
               create: bool = True) -> optuna.Study:
    """Load study ``name``, or (with ``create``) make it with our directions and metric names.

    An existing study is only read here: a refused resume must leave its storage byte-identical.
    """
    store = open_storage(storage)
    try:
        study = optuna.load_study(study_name=name, storage=store, sampler=sampler)
    except KeyError:
        if not create:
            known = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
            raise SearchError(f"no study named {name!r} in {storage}; studies there: {known}") from None
        study = optuna.create_study(study_name=name, storage=store, sampler=sampler, directions=list(DIRECTIONS))
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in practice
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(METRICS))
        return study
    if [d.name.lower() for d in study.directions] != list(DIRECTIONS):
        raise SearchError(f"study {name!r} in {storage} was not created by nas search (its directions are "
                          f"{[d.name.lower() for d in study.directions]})")
    return study


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker process on this host is gone and re-queue their params.

    Returns the numbers of the trials that were failed. Trials of live processes, or of other
    hosts (covered by RDB heartbeats), are left alone.
    """
    host, recovered = socket.gethostname(), []
    storage = study._storage  # noqa: SLF001 — Optuna exposes no public way to fail another trial
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid, t_host = t.user_attrs.get("pid"), t.user_attrs.get("host")
        if t_host != host or pid is None or _pid_alive(int(pid)):
            continue
        storage.set_trial_user_attr(t._trial_id, "failure", f"worker died (pid {pid}); parameters re-queued")  # noqa: SLF001
        if storage.set_trial_state_values(t._trial_id, TrialState.FAIL):  # noqa: SLF001
            study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
            recovered.append(t.number)
    if recovered:
        logger.warning("re-queued trials of dead workers: %s", recovered)
    return recovered


def n_complete(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _n_running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def _load_space(config: SearchConfig) -> SearchSpace:
    if config.space_yaml is not None:
        return parse_space(yaml.safe_load(config.space_yaml), f"{config.space} (as recorded in the study)")
    return load_space(config.space)


def prepare(config: SearchConfig) -> tuple[TrialContext, optuna.Study]:
    """Validate everything a search needs and open (or resume) its study; nothing is trained yet.
    Every check runs before the study is opened, so a refused command writes nothing."""
    if config.trials <= 0:
        raise SearchError(f"--trials must be >= 1, got {config.trials}")
    for flag, value in (("--timeout", config.timeout), ("--trial-timeout", config.trial_timeout),
                        ("--max-latency-ms", config.max_latency_ms), ("--max-params", config.max_params),
                        ("--max-memory-mb", config.max_memory_mb)):
        if value is not None and value <= 0:
            raise SearchError(f"{flag} must be > 0, got {value}")
    from nas.latency import parse_shape

    try:
        shape = parse_shape(config.latency_shape)
    except ValueError as e:
        raise SearchError(f"--latency-shape: {e}") from None
    space = _load_space(config)
    task_spec = config.task or space.task
    task = load_task(task_spec, seed=config.seed)
    profile = resolve_target(config.target)
    device = resolve_device(config.device)
    name = study_name(config, space, task_spec)
    stored = _recorded_setup(name, config.storage)
    requested = config.measure
    if requested is None and stored is not None:  # no flag: a resumed study keeps its kind of latency
        requested = bool(stored.get("measure", False))
        if requested and device.type != "cuda":
            raise SearchError(f"study {name!r} measures latency on a GPU ({stored.get('profile')}); run this on a "
                              f"CUDA device (--device cuda), or start another study with --predict")
    measure = resolve_measure(requested, config.target, profile, device)
    if measure:
        space.check_measurable()
        if stored is not None and stored.get("measure") and stored.get("profile") != profile.name:
            raise SearchError(f"study {name!r} holds latencies measured on {stored.get('profile')}; this GPU is "
                              f"{profile.name}: join it from that kind of GPU, or use another --study name")
    sampler = make_sampler(config.sampler, config.seed + config.worker)
    study = open_study(name, config.storage, sampler=sampler)
    space_yaml = config.space_yaml if config.space_yaml is not None else Path(space.source).read_text()
    setup = {"space": space.name, "space_source": space.source, "space_yaml": space_yaml, "task": task_spec,
             "task_config": task.config, "target": config.target, "profile": profile.name,
             "latency_shape": str(shape), "sampler": config.sampler, "seed": config.seed,
             "measure": measure}
    if stored is not None:
        for key in ("space", "task", "target", "latency_shape"):
            if stored.get(key) != setup[key]:
                raise SearchError(f"study {name!r} was created with {key}={stored.get(key)!r}, not {setup[key]!r}; "
                                  f"use the same settings or another --study name")
        if bool(stored.get("measure", False)) != measure:
            was, now = (("measured", "predicted") if stored.get("measure") else ("predicted", "measured"))
            raise SearchError(f"study {name!r} holds {was} latencies and this run would record {now} ones "
                              f"({'pass --measure on a CUDA device' if was == 'measured' else 'pass --predict'} "
                              f"to match, or use another --study name)")
    else:
        study.set_user_attr("search", setup)
    budgets = Budgets(config.max_latency_ms, config.max_params, config.max_memory_mb, config.trial_timeout)
    recorded = {"max_latency_ms": budgets.max_latency_ms, "max_params": budgets.max_params,
                "max_memory_mb": budgets.max_memory_mb, "trial_timeout": budgets.trial_timeout,
                "trials": config.trials}
    if study.user_attrs.get("budgets") != recorded:
        study.set_user_attr("budgets", recorded)  # the latest run's budgets: workers and the report read them
    return TrialContext(space, task, profile, shape, device, budgets, open_artifact_store(config.storage),
                        measure=measure), study


def worker_config(study: str, storage: str, *, trials: int | None = None, device: str = "auto",
                  worker: int | None = None, timeout: float | None = None) -> SearchConfig:
    """The SearchConfig a worker joining ``study`` runs with, read back from what the study recorded."""
    existing = open_study(study, storage, create=False)
    setup, budgets = existing.user_attrs.get("search"), existing.user_attrs.get("budgets", {})
    if setup is None or "space_yaml" not in setup:
        raise SearchError(f"study {study!r} in {storage} was not started by nas search; start it with nas search")
    return SearchConfig(space=setup["space"], space_yaml=setup["space_yaml"], task=setup["task"],
                        trials=trials or budgets.get("trials", 20), timeout=timeout, study=study, storage=storage,
                        sampler=setup.get("sampler", "tpe"), target=setup["target"],
                        latency_shape=setup["latency_shape"], max_latency_ms=budgets.get("max_latency_ms"),
                        max_params=budgets.get("max_params"), max_memory_mb=budgets.get("max_memory_mb"),
                        trial_timeout=budgets.get("trial_timeout"), seed=setup.get("seed", 0), device=device,
                        measure=setup.get("measure", False),
                        worker=os.getpid() if worker is None else worker)


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


def _surplus(study: optuna.Study, trial: optuna.Trial, trials: int) -> bool:
    """True when earlier-numbered trials already fill the budget (another worker got there first)."""
    ahead = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
             if t.number < trial.number]
    return len(ahead) >= trials


def run_search(config: SearchConfig, *, on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
               ctx_study: tuple[TrialContext, optuna.Study] | None = None) -> optuna.Study:
    """Evaluate trials until ``config.trials`` have completed in storage (or the timeout passes).

    Safe to run in several processes on one study: a worker starts a trial only while completed
    plus running trials are below the budget, and gives a trial back (pruned, ``surplus``) when a
    race let earlier trials fill it.
    """
    ctx, study = ctx_study or prepare(config)
    start, failures = time.monotonic(), 0
    while True:
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
        with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for optimize(); we beat by hand
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask()
        if _surplus(study, trial, config.trials):
            trial.set_user_attr("surplus", "the budget was filled by other workers")
            study.tell(trial, state=TrialState.PRUNED)
            continue
        try:
            with _heartbeat(study, trial):
                state, values = evaluate(ctx, trial)
        except BaseException as exc:  # noqa: BLE001 - only Ctrl-C is handled here; the rest re-raised as is
            if not interrupt.is_interrupt(exc):
                raise
            trial.set_user_attr("failure", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from exc  # Ctrl-C surfaced wrapped (e.g. inside an import)
        frozen = study.tell(trial, values, state=state) if values else study.tell(trial, state=state)
        failures = failures + 1 if state == TrialState.FAIL else 0
        if on_trial is not None:
            on_trial(study, frozen)
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SearchError(f"{failures} trials in a row failed (last: {frozen.user_attrs.get('failure')}); "
                              "check the space's lr ranges and the task")
    return study
