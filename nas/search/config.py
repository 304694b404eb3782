"""What a search run is asked to do (``SearchConfig``, parsed once at the edge by
``SearchConfig.parse``: from the CLI's flags, or from a study's record under a worker's flags),
and the error for a search that cannot start as asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nas.search.objectives import DEFAULT_OBJECTIVES
from nas.search.setup import StudyBudgets
from nas.search.storage import DEFAULT_STORAGE

__all__ = ["SearchConfig", "SearchError"]


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

    @property
    def budgets(self) -> StudyBudgets:
        """The trial count and hard budgets this run asks for (what its study records)."""
        return StudyBudgets(**{f.name: getattr(self, f.name) for f in fields(StudyBudgets)})

    @classmethod
    def parse(cls, *sources: object, **given: Any) -> SearchConfig:
        """The request from named values: the CLI's flags (its argparse namespace), or a study's
        record (its ``SearchSetup`` and ``StudyBudgets``) under a worker's flags. A later source
        overrides an earlier one, ``given`` last. A name that is no field here is no part of the
        request (the CLI's ``--gpus``, the record's ``profile``), and a None is a value not given
        (a flag left out: the default here, or what an earlier source says); both are skipped."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for source in (*sources, given):
            named = source if isinstance(source, Mapping) else vars(source)
            values.update({k: v for k, v in named.items() if k in names and v is not None})
        return cls(**values)
