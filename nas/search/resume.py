"""A resume checked against what its study recorded: the sampler and seed, the space, the task and
its data file, the hardware profile; and the truncated trials a resume may queue again."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from hardware_profiles import HardwareProfile, ProfileError, list_profiles, parse_profile
from nas.search import record
from nas.search.config import SearchConfig, SearchError
from nas.search.setup import SearchSetup
from nas.space import SearchSpace, parse_space_text
from nas.tasks import Task, TaskError, load_task, task_file, task_moved

__all__ = [
    "check_recorded_space",
    "not_retrained",
    "recorded_profile",
    "recorded_task",
    "requeue_truncated",
    "resumed_profile",
    "resumed_task_spec",
    "sampler_and_seed",
]

# one logger for the study's lines, whichever module of it writes them (``nas -v`` shows its name)
logger = logging.getLogger("nas.search.study")


def sampler_and_seed(config: SearchConfig, name: str, stored: SearchSetup | None) -> tuple[str, int]:
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


def check_recorded_space(name: str, stored: SearchSetup, space: SearchSpace) -> None:
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


def recorded_task(
    name: str, stored: SearchSetup, elsewhere: str | None = None, *, config_joins: bool = False
) -> Task | None:
    """The task study ``name`` was created with, rebuilt from its record (a data file by the path
    resolved at creation, and only from the same bytes), or None for a study that recorded none.
    A resume or a worker in another folder, or after the file was replaced, must not train on
    other data than the trials already in the study.

    ``elsewhere`` (a resume's ``--task`` path, a worker's ``--data``): where the file is on this
    host when the recorded path does not hold it (moved, or mounted elsewhere); it is used only
    if it holds the recorded bytes. A worker's ``--data`` (``config_joins``) is read first and
    refused without them; a resume's ``--task`` is compared as a task by ``resumed_task_spec``."""
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


def recorded_profile(name: str, stored: SearchSetup) -> HardwareProfile | None:
    """The hardware profile study ``name`` was created with, from the text it recorded (None for
    a study from before profiles were recorded)."""
    if not stored.profile_yaml:
        return None
    try:
        return parse_profile(stored.profile_yaml, f"profile {stored.profile} (as recorded in study {name!r})")
    except ProfileError as e:  # a profile this version refuses (e.g. a copied calibration)
        raise SearchError(f"{e}; start another study with --study NEW_NAME") from None


def resumed_profile(name: str, target: str, recorded: HardwareProfile, asked: HardwareProfile) -> HardwareProfile:
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


def resumed_task_spec(name: str, stored: SearchSetup, recorded: Task, task_spec: str, seed: int) -> str:
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
