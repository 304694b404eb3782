"""What a run asks for and what a study records about how it searches, typed and importable
without torch or optuna (the CLI's parser and ``nas --help`` use the option vocabulary here).

``SearchSetup`` is written into the study once, when ``nas search`` creates it, and read back by
every resume and worker (``nas worker`` needs nothing else); ``StudyBudgets`` holds the hard
budgets and trial count of the latest run. Both are versioned dicts in the study's user
attributes, written and read through ``nas.search.record``; studies written before versions
existed read with defaults for what they lack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from nas.search.objectives import DEFAULT_OBJECTIVES

__all__ = [
    "DEFAULT_PICK",
    "MAX_BATCH",
    "MAX_CONTEXT",
    "MAX_WORKERS",
    "MAX_TRIALS",
    "PICKS",
    "SAMPLERS",
    "SETUP_VERSION",
    "SearchSetup",
    "StudyBudgets",
]

SAMPLERS = ("tpe", "nsga2", "gp", "random")  # --sampler
# nas export --pick; the default: the cheapest trial level (within ε) with the most accurate one
DEFAULT_PICK = "cheapest-best"
PICKS = (DEFAULT_PICK, "knee", "accuracy", "latency")
SETUP_VERSION = 3  # 2: objectives, context, decode_batch; 3: profile_yaml
# Upper bounds on a run's sizes (the CLI's argument types and ``prepare`` check them; docs/cli.md
# lists them): past them a number is a typo, not a request, and would only cost hours or memory.
MAX_BATCH = 4096  # sequences: --latency-shape BATCH, --decode-batch
MAX_CONTEXT = 1_048_576  # tokens per sequence latency is scored at: --latency-shape SEQ, --context (1M)
MAX_WORKERS = 256  # worker processes one nas search starts: --workers, --gpus x --trials-per-gpu
MAX_TRIALS = 1_000_000  # trained trials one nas search runs to: --trials (each is a trained model)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class SearchSetup:
    """How a study searches: fixed when it is created; a resume must agree on ``IDENTITY``."""

    space: str  # the space's name
    space_yaml: str  # the space file's text: workers on other hosts rebuild the space from it
    task: str  # the task spec (e.g. "mqar:seq_len=64", a data file path)
    target: str  # --target as given ("auto" or a profile)
    profile: str  # the profile it resolved to
    latency_shape: str  # "BATCHxSEQ"
    sampler: str = "tpe"
    seed: int = 0
    measure: bool = False  # latencies measured on a GPU (else predicted)
    prune: bool = False  # early stopping on known costs (nas.search.pruning); studies before it: off
    space_source: str = ""  # where the space was read from
    test_size: int | None = None  # test rows (what studies before test_targets kept as the resolution)
    test_targets: int | None = None  # scored test targets (Task.scored_targets): accuracy's step is 1 / this
    # rebuilds the task: resumes and workers train on it (a data file only from the same bytes), export retrains on it
    task_config: Mapping[str, Any] | None = field(default=None, compare=False)
    # what the study optimises (nas.search.objectives names, in value order); studies before it: the default
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    context: int | None = None  # tokens a sequence holds for the generation objectives (--context)
    decode_batch: int = 1  # sequences decoded together (--decode-batch)
    # the profile's YAML text: resumes and workers predict with it, whatever --target means where they run
    profile_yaml: str = ""
    version: int = SETUP_VERSION

    IDENTITY = ("space", "task", "target", "latency_shape", "objectives", "context", "decode_batch")

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(self.objectives))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["objectives"] = list(self.objectives)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSetup:
        return cls(**{"version": 0, **_known(cls, data)})

    def differs(self, other: SearchSetup) -> tuple[str, Any, Any] | None:
        """The first identity field on which ``other`` (this run's) differs: (field, ours, theirs)."""
        for name in self.IDENTITY:
            if getattr(self, name) != getattr(other, name):
                return name, getattr(self, name), getattr(other, name)
        return None


@dataclass(frozen=True)
class StudyBudgets:
    """The trial count and hard budgets a run asks for: the study records the latest run's (its
    workers and report read them), and each trial checks the hard ones (a candidate over a limit
    is recorded, infeasible, without being trained)."""

    max_latency_ms: float | None = None
    max_params: int | None = None
    max_memory_mb: float | None = None
    trial_timeout: float | None = None  # seconds for the whole trial; past it the trial fails
    trials: int = 20
    # the wall-clock guard on each training, in seconds, instead of the space's max_train_seconds
    # (--max-train-seconds; None: the space's)
    max_train_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyBudgets:
        return cls(**_known(cls, data))

    def changes(self, new: StudyBudgets) -> list[str]:
        """``trials 10 -> 20``-style lines for each field ``new`` changes."""
        return [
            f"{name} {getattr(self, name)} -> {getattr(new, name)}"
            for name in self.to_dict()
            if getattr(self, name) != getattr(new, name)
        ]
