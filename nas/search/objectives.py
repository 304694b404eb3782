"""The objectives a study can optimise, by name: what ``--objectives`` takes, what a study stores.

A study of ``nas search`` optimises 2-4 of them, accuracy among them, fixed when it is created:
Optuna keeps one value per objective in this order, under the objective's metric name
(``latency_ms``, ...), so optuna-dashboard and the optuna CLI label them too. Three are the
forward's costs at ``--latency-shape`` (the default ``accuracy,latency,memory``); three belong to
generation at ``--context N`` with ``--decode-batch B`` sequences:

- ``prefill_latency``: the forward over B sequences of N tokens (the prompt);
- ``decode_latency``: one generated token for each of B sequences that already hold N tokens:
  attention reads its KV cache of N rows, linear attention updates its D×D state (ms per step);
- ``cache_memory``: what decoding keeps resident at context N: KV cache + recurrent state (and
  short-convolution windows) for B sequences, plus the weights (MiB).

Importable without torch or optuna: the CLI's parser uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "BY_METRIC",
    "CATALOGUE",
    "DEFAULT_OBJECTIVES",
    "Objective",
    "metrics",
    "needs_context",
    "objectives_for",
    "parse_objectives",
]


@dataclass(frozen=True)
class Objective:
    """name: what ``--objectives`` takes; metric: the study's metric name (its value's key);
    label: axis and column title; unit: of the value; context: measured at ``--context``."""

    name: str
    metric: str
    direction: str  # "maximize" | "minimize"
    label: str
    unit: str = ""
    context: bool = False
    time: bool = False  # a latency: what ``--pick latency`` minimises

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def format(self, value: float) -> str:
        """``0.991``, ``1.234 ms``, ``56.1 MiB``."""
        if self.unit == "":
            return f"{value:.3f}"
        return f"{value:.4g} {self.unit}"


CATALOGUE: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("accuracy", "accuracy", "maximize", "accuracy"),
        Objective("latency", "latency_ms", "minimize", "latency (ms)", "ms", time=True),
        Objective("memory", "memory_mb", "minimize", "memory (MiB)", "MiB"),
        Objective("prefill_latency", "prefill_latency_ms", "minimize", "prefill latency (ms)", "ms", True, True),
        Objective("decode_latency", "decode_latency_ms", "minimize", "decode latency (ms/token)", "ms", True, True),
        Objective("cache_memory", "cache_memory_mb", "minimize", "cache memory (MiB)", "MiB", True),
    )
}
BY_METRIC: dict[str, Objective] = {o.metric: o for o in CATALOGUE.values()}
DEFAULT_OBJECTIVES = ("accuracy", "latency", "memory")
MIN_OBJECTIVES, MAX_OBJECTIVES = 2, 4


def parse_objectives(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"accuracy,decode_latency"`` (or a sequence of names) → the names, validated: 2-4 distinct
    names from ``CATALOGUE``, accuracy among them; ValueError with one line otherwise."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [str(n).strip() for n in text]
    unknown = [n for n in names if n not in CATALOGUE]
    if unknown:
        raise ValueError(f"--objectives: unknown objective(s) {unknown}; choose from {list(CATALOGUE)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--objectives: each objective once, got {names}")
    if not MIN_OBJECTIVES <= len(names) <= MAX_OBJECTIVES:
        raise ValueError(
            f"--objectives: choose {MIN_OBJECTIVES}-{MAX_OBJECTIVES} objectives (a front needs two), got {len(names)}"
        )
    if "accuracy" not in names:  # costs alone are lowest for the smallest model, so it alone made the front
        fixed = ",".join(("accuracy", *names[: MAX_OBJECTIVES - 1]))
        raise ValueError(
            f"--objectives: {','.join(names)} leaves out accuracy, so the front would be the smallest model "
            f"alone (every candidate is trained all the same); add it: --objectives {fixed}"
        )
    return tuple(names)


def needs_context(names: Iterable[str]) -> bool:
    """Whether any of the objectives is measured at a context length (``--context``)."""
    return any(CATALOGUE[n].context for n in names)


def metrics(names: Iterable[str]) -> tuple[str, ...]:
    """The study's metric names for objective names, in order."""
    return tuple(CATALOGUE[n].metric for n in names)


def objectives_for(metric_names: Iterable[str]) -> tuple[Objective, ...]:
    """The objectives of a study from its metric names (a study nas search did not create, whose
    names are unknown, raises KeyError naming them)."""
    unknown = [m for m in metric_names if m not in BY_METRIC]
    if unknown:
        raise KeyError(f"unknown objective metric(s) {unknown}")
    return tuple(BY_METRIC[m] for m in metric_names)
