"""Starting a search: every check of its settings, then its study opened (created, with its
baselines queued, or resumed as recorded); nothing is trained here. Every check runs before the
study is opened, so a refused command writes nothing."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import TYPE_CHECKING

import optuna
import torch

from hardware_profiles import HardwareProfile, load_profile
from kernels.device import DeviceError, gpu_name, is_cuda, resolve
from nas.search import faults, record
from nas.search.baselines import baselines
from nas.search.config import SearchConfig, SearchError
from nas.search.objective import TrialContext
from nas.search.objectives import needs_context, parse_objectives
from nas.search.pruning import CostAwarePruner
from nas.search.resume import (
    check_recorded_space,
    recorded_profile,
    recorded_task,
    requeue_truncated,
    resumed_profile,
    resumed_task_spec,
    sampler_and_seed,
)
from nas.search.sampler import make_sampler
from nas.search.setup import MAX_BATCH, MAX_CONTEXT, MAX_TRIALS, SearchSetup, StudyBudgets
from nas.search.storage import check_artifact_dir, open_artifact_store
from nas.search.studies import open_study, recorded_setup, resumed_name
from nas.space import SearchSpace, load_space, parse_space_text
from nas.tasks import Task, TaskError, load_task, task_file

if TYPE_CHECKING:
    from nas.latency import LatencyShape

__all__ = [
    "FP8_CAPABILITY",
    "check_fp8",
    "device_capability",
    "prepare",
    "resolve_device",
    "resolve_measure",
    "resolve_target",
]

# one logger for the study's lines, whichever module of it writes them (``nas -v`` shows its name)
logger = logging.getLogger("nas.search.study")


def resolve_device(device: str) -> torch.device:
    try:
        return resolve(device)
    except DeviceError as e:
        raise SearchError(f"--{e}") from None


def resolve_target(target: str) -> HardwareProfile:
    """The profile latency is predicted for: ``auto`` is the local GPU's profile, else the shipped
    calibration of the kernels this checkout runs (``reference_profile``; h200 if none is)."""
    if target == "auto":
        from hardware_profiles import detect_profile
        from nas.latency import reference_profile

        return detect_profile() or reference_profile() or load_profile("h200")
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


# the first CUDA compute capability with fp8 tensor cores (Ada, sm_89; Hopper is 9.0)
FP8_CAPABILITY = (8, 9)


def check_fp8(space: SearchSpace, capability: tuple[int, int] | None, what: str = "this device") -> None:
    """SearchError when ``space`` can store KV caches or weights in fp8 and ``what`` (the study's
    device, or the GPU its latency is predicted for) is a GPU of compute ``capability`` below
    ``FP8_CAPABILITY`` (None: not a CUDA device, or a profile that does not say, where nothing is
    refused): a candidate picked for fp8 could not run so on it."""
    if capability is None or tuple(capability) >= FP8_CAPABILITY or not space.offers_fp8():
        return
    major, minor = capability
    raise SearchError(
        f"{space.source}: fp8 needs a GPU of compute capability "
        f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or newer (Ada, Hopper); {what} is {major}.{minor}: "
        f"drop fp8 from the space's precision choices, or search on (or --target) such a GPU"
    )


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device`` (9.0 for an H100), None for a CPU."""
    return tuple(torch.cuda.get_device_capability(device)) if is_cuda(device) else None


def _load_space(config: SearchConfig) -> SearchSpace:
    if config.space_yaml is not None:  # a file without `name:` was recorded under its file name
        return parse_space_text(config.space_yaml, f"{config.space} (as recorded in the study)", config.space)
    return load_space(config.space)


def prepare(config: SearchConfig) -> tuple[TrialContext, optuna.Study]:
    """Validate everything a search needs and open (or resume) its study; nothing is trained yet.
    Every check runs before the study is opened, so a refused command writes nothing."""
    faults.check()  # a malformed NAS_FAULT is refused here, not at the first trial
    _check_flags(config)
    shape = _check_shape(config)
    objectives = _check_objectives(config)
    space = _load_space(config)
    space.check_measurable()  # measured or predicted, latency is of the kernels: they must run every candidate
    task_spec = config.task or space.task
    name = resumed_name(config, space, task_spec, shape, objectives)
    check_artifact_dir(config.storage)  # a file in its place would fail the first trial, after the study is written
    stored = recorded_setup(name, config.storage)
    if stored is None:
        _check_new_study(config, space, objectives)
    sampler_name, seed = sampler_and_seed(config, name, stored)
    if stored is not None:
        check_recorded_space(name, stored, space)
    task, task_spec = _task(config, name, stored, space, task_spec, seed, objectives)
    profile, device, measure = _latency(config, name, stored)
    check_fp8(space, device_capability(device))
    if not measure:  # predicted for the profile's GPU: it must run what it prices
        check_fp8(space, profile.compute_capability, f"the latency target {profile.name}")
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
    _record_setup(study, name, stored, setup)
    # re-queued truncated trials are trained on top of --trials: each was counted once already
    retrained = requeue_truncated(study) if config.retrain_truncated and stored is not None else ()
    budgets = replace(config.budgets, trials=config.trials + len(retrained))
    _record_budgets(study, name, budgets)
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


def _check_flags(config: SearchConfig) -> None:
    """SearchError naming the flag for a trial count, study name, seed or budget out of its range."""
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
        if value is not None and not 0 < value < math.inf:  # an infinite budget is no budget: leave it out
            raise SearchError(f"{flag} must be a finite number > 0, got {value}")


def _check_shape(config: SearchConfig) -> LatencyShape:
    """``--latency-shape`` parsed, within ``MAX_BATCH`` x ``MAX_CONTEXT`` (SearchError otherwise)."""
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
    return shape


def _check_new_study(config: SearchConfig, space: SearchSpace, objectives: tuple[str, ...]) -> None:
    """The checks only a new study gets (a resume of a study recorded otherwise keeps working):
    the generation flags need a generation objective, and the space must hold ``--trials``
    distinct configurations (a resumed study may hold repeats enqueued on purpose, which do train)."""
    flags = (("--context", config.context is not None), ("--decode-batch", config.decode_batch != 1))
    given = [flag for flag, on in flags if on]
    if given and not needs_context(objectives):
        flags = " and ".join(given)
        raise SearchError(
            f"{flags}: only the generation objectives (prefill_latency, decode_latency, cache_memory) use "
            f"{'them' if len(given) > 1 else 'it'}, and --objectives {','.join(objectives)} has none: add one "
            f"(e.g. --objectives accuracy,latency,decode_latency), or drop {flags}"
        )
    if (distinct := space.configurations()) is not None and config.trials > distinct:
        raise SearchError(
            f"--trials {config.trials:,}: space {space.name} holds {distinct:,} distinct configuration(s), and a "
            f"configuration is trained once; use --trials {distinct:,} or less, or widen the space"
        )


def _task(
    config: SearchConfig,
    name: str,
    stored: SearchSetup | None,
    space: SearchSpace,
    task_spec: str,
    seed: int,
    objectives: tuple[str, ...],
) -> tuple[Task, str]:
    """The task the study trains on (a resume's: the recorded one, from the same bytes) and the
    spec it is recorded under; SearchError when it cannot have the objectives' decoding costs."""
    elsewhere = config.data if config.joins else task_file(task_spec)
    task = recorded_task(name, stored, elsewhere, config_joins=config.joins) if stored is not None else None
    if task is not None and not config.joins:
        task_spec = resumed_task_spec(name, stored, task, task_spec, seed)
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
    return task, task_spec


def _latency(config: SearchConfig, name: str, stored: SearchSetup | None) -> tuple[HardwareProfile, torch.device, bool]:
    """The profile latency is predicted for, the device, and whether latency is measured on it: a
    resume keeps its study's profile and kind of latency (SearchError where this GPU cannot)."""
    recorded = recorded_profile(name, stored) if stored is not None else None
    # a worker predicts with the study's profile: its --target may be a path that means another
    # file (or none) where it runs, and "auto" another GPU's profile
    joined = recorded is not None and config.joins
    profile = recorded if joined else resolve_target(config.target)
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
    if recorded is not None and not joined:
        profile = resumed_profile(name, config.target, recorded, profile)
    return profile, device, measure


def _record_setup(study: optuna.Study, name: str, stored: SearchSetup | None, setup: SearchSetup) -> None:
    """Record a new study's setup; SearchError when a resume's differs from the recorded one."""
    if stored is None:
        record.write_study_setup(study, setup)
        return
    if (differs := stored.differs(setup)) is not None:
        key, was, now = differs
        raise SearchError(
            f"study {name!r} was created with {key}={was!r}, not {now!r}; use the same settings or another --study name"
        )
    if stored.measure != setup.measure:
        was, now = ("measured", "predicted") if stored.measure else ("predicted", "measured")
        raise SearchError(
            f"study {name!r} holds {was} latencies and this run would record {now} ones "
            f"({'pass --measure on a CUDA device' if was == 'measured' else 'pass --predict'} "
            f"to match, or use another --study name)"
        )


def _record_budgets(study: optuna.Study, name: str, budgets: StudyBudgets) -> None:
    """Record this run's budgets in the study, ``budgets.trials`` the trained trials to reach."""
    before = record.study_budgets(study)
    if before != budgets:
        # a resume that changes a hard budget says so: they are the study's, not this run's; more
        # (or fewer) --trials alone is how a study is extended and changes no trial's standing
        changes = before.changes(budgets) if before is not None else []
        if any(not line.startswith("trials ") for line in changes):
            logger.warning(
                "study %r: recorded budgets changed (%s); workers, the front, the report and nas export use the "
                "new ones, for the trials trained before too (the stored constraints and the hypervolume keep "
                "the budgets each trial was scored under)",
                name,
                ", ".join(changes),
            )
        record.write_study_budgets(study, budgets)  # the latest run's budgets: workers and the report read them


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
