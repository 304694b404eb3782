"""Optuna glue: open or resume a study, and evaluate candidates until N trials have completed.

Objectives: maximize accuracy, minimize latency_ms, minimize memory_mb. Hard budgets become
Optuna constraints (feasible when ≤ 0); latency is scored before training so a candidate that
breaks a budget is recorded without being trained. A trial left RUNNING by a dead process is
failed and its parameters are queued again, so a killed search resumes where it stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import optuna
import torch
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from safetensors.torch import save_file
from optuna.trial import FrozenTrial, TrialState

from hardware_profiles import HardwareProfile, load_profile
from nas.latency import Latency, LatencyShape, count_params, memory, predict
from nas.models import build
from nas.spec import Candidate, arch_hash
from nas.storage import open_artifact_store, open_storage
from nas.tasks import Task, load_task
from nas.train import Budget, TrainingDiverged, train
from search_spaces import SearchSpace, load_space

__all__ = ["DIRECTIONS", "METRICS", "SAMPLERS", "SearchConfig", "SearchError", "make_sampler",
           "n_complete", "open_study", "prepare", "recover_stale_trials", "run_search"]

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "latency_ms", "memory_mb")
DIRECTIONS = ("maximize", "minimize", "minimize")
SAMPLERS = ("tpe", "nsga2", "gp", "random")
MAX_FAILURES_IN_A_ROW = 20  # a space where nothing trains should stop, not spin


class SearchError(ValueError):
    """A search cannot start as asked (bad study/config combination); the message says why."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything that defines a search run. ``study`` None derives a name from space/task/target."""

    space: str = "hybrid_small"
    task: str | None = None  # None: the space's default task
    trials: int = 20
    timeout: float | None = None
    study: str | None = None
    storage: str = "runs/studies.journal"
    sampler: str = "tpe"
    target: str = "auto"
    latency_shape: str = "1x256"
    max_latency_ms: float | None = None
    max_params: int | None = None
    max_memory_mb: float | None = None
    seed: int = 0
    device: str = "auto"


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """A seeded sampler; all of them read the constraints set by ``trial.set_constraint``."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
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


def _constraints(config: SearchConfig, lat: Latency, mem_mb: float, params: int) -> dict[str, float]:
    """Constraint values (≤ 0 is feasible) for the budgets that were set."""
    out = {}
    if config.max_latency_ms is not None:
        out["latency_ms"] = lat.median_ms - config.max_latency_ms
    if config.max_params is not None:
        out["params"] = float(params - config.max_params)
    if config.max_memory_mb is not None:
        out["memory_mb"] = mem_mb - config.max_memory_mb
    return out


@dataclass
class _Context:
    config: SearchConfig
    space: SearchSpace
    task: Task
    profile: HardwareProfile
    shape: LatencyShape
    device: torch.device
    artifacts: FileSystemArtifactStore


def _evaluate(ctx: _Context, trial: optuna.Trial) -> tuple[TrialState, list[float] | None]:
    """Run one trial; returns the state and values to ``tell``."""
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("host", socket.gethostname())
    cand: Candidate = ctx.space.sample(trial, ctx.task)
    arch = cand.arch
    params = count_params(arch)
    lat = predict(arch, ctx.shape, ctx.profile)
    mem = memory(arch, ctx.shape)
    for key, value in {"arch": arch.to_dict(), "train": cand.train.to_dict(), "arch_summary": arch.summary(),
                       "params": params, "latency": lat.to_dict(), "latency_source": lat.source,
                       "latency_device": lat.device, "memory": mem.to_dict()}.items():
        trial.set_user_attr(key, value)
    cons = _constraints(ctx.config, lat, mem.total_mb, params)
    for key, value in cons.items():
        trial.set_constraint(key, value)
    broken = [k for k, v in cons.items() if v > 0]
    if broken:
        trial.set_user_attr("skipped_training", f"breaks the hard budget on {', '.join(broken)}")
        return TrialState.COMPLETE, [0.0, lat.median_ms, mem.total_mb]
    model = build(arch, ctx.task, seed=cand.train.seed)
    try:
        result = train(model, ctx.task, cand.train, device=ctx.device,
                       budget=Budget(max_seconds=ctx.space.max_train_seconds))
    except TrainingDiverged as e:
        trial.set_user_attr("failure", f"diverged: {e}")
        return TrialState.FAIL, None
    trial.set_user_attr("curve", [list(p) for p in result.curve])
    trial.set_user_attr("train_seconds", round(result.seconds, 3))
    trial.set_user_attr("steps_done", result.steps)
    trial.set_user_attr("stopped", result.stopped)
    trial.set_user_attr("test_loss", result.test_loss)
    trial.set_user_attr("weights_artifact", _upload_weights(ctx, trial, model))
    return TrialState.COMPLETE, [result.accuracy, lat.median_ms, mem.total_mb]


def _upload_weights(ctx: _Context, trial: optuna.Trial, model: torch.nn.Module) -> str:
    """Store the trained weights as a safetensors artifact of ``trial``; returns the artifact id."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"trial{trial.number}.safetensors")
        save_file(state, path, metadata={"arch_hash": arch_hash(model.arch)})
        return upload_artifact(artifact_store=ctx.artifacts, file_path=path, study_or_trial=trial,
                               mimetype="application/octet-stream")


def n_complete(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def prepare(config: SearchConfig) -> tuple[_Context, optuna.Study]:
    """Validate everything a search needs and open (or resume) its study; nothing is trained yet."""
    if config.trials <= 0:
        raise SearchError(f"--trials must be >= 1, got {config.trials}")
    if config.timeout is not None and config.timeout <= 0:
        raise SearchError(f"--timeout must be > 0 seconds, got {config.timeout}")
    for flag, value in (("--max-latency-ms", config.max_latency_ms), ("--max-params", config.max_params),
                        ("--max-memory-mb", config.max_memory_mb)):
        if value is not None and value <= 0:
            raise SearchError(f"{flag} must be > 0, got {value}")
    from nas.latency import parse_shape

    try:
        shape = parse_shape(config.latency_shape)
    except ValueError as e:
        raise SearchError(f"--latency-shape: {e}") from None
    space = load_space(config.space)
    task_spec = config.task or space.task
    task = load_task(task_spec, seed=config.seed)
    profile = resolve_target(config.target)
    device = resolve_device(config.device)
    sampler = make_sampler(config.sampler, config.seed)
    name = study_name(config, space, task_spec)
    study = open_study(name, config.storage, sampler=sampler)
    setup = {"space": space.name, "space_source": space.source, "task": task_spec, "task_config": task.config,
             "target": config.target, "profile": profile.name, "latency_shape": str(shape)}
    stored = study.user_attrs.get("search")
    if stored is None:
        study.set_user_attr("search", setup)
    else:
        for key in ("space", "task", "target", "latency_shape"):
            if stored.get(key) != setup[key]:
                raise SearchError(f"study {name!r} was created with {key}={stored.get(key)!r}, not {setup[key]!r}; "
                                  f"use the same settings or another --study name")
    budgets = {"max_latency_ms": config.max_latency_ms, "max_params": config.max_params,
               "max_memory_mb": config.max_memory_mb}
    if study.user_attrs.get("budgets") != budgets:
        study.set_user_attr("budgets", budgets)  # the latest run's budgets, drawn in the report
    return _Context(config, space, task, profile, shape, device, open_artifact_store(config.storage)), study


def run_search(config: SearchConfig, *, on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
               ctx_study: tuple[_Context, optuna.Study] | None = None) -> optuna.Study:
    """Evaluate trials until ``config.trials`` have completed in storage (or the timeout passes)."""
    ctx, study = ctx_study or prepare(config)
    recover_stale_trials(study)
    start, failures = time.monotonic(), 0
    while n_complete(study) < config.trials:
        if config.timeout is not None and time.monotonic() - start > config.timeout:
            logger.info("timeout reached after %d completed trials", n_complete(study))
            break
        trial = study.ask()
        try:
            state, values = _evaluate(ctx, trial)
        except KeyboardInterrupt:
            trial.set_user_attr("failure", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
            raise
        except torch.cuda.OutOfMemoryError:
            trial.set_user_attr("failure", "out of memory")
            state, values = TrialState.FAIL, None
        frozen = study.tell(trial, values, state=state) if values else study.tell(trial, state=state)
        failures = failures + 1 if state == TrialState.FAIL else 0
        if on_trial is not None:
            on_trial(study, frozen)
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SearchError(f"{failures} trials in a row failed (last: {frozen.user_attrs.get('failure')}); "
                              "check the space's lr ranges and the task")
    return study

