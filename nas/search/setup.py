"""The vocabulary of a run's options, importable without torch or optuna (the CLI's parser and
``nas --help`` use it; the modules that act on an option import it from here)."""

from __future__ import annotations

__all__ = ["PICKS", "SAMPLERS"]

SAMPLERS = ("tpe", "nsga2", "gp", "random")  # --sampler
PICKS = ("knee", "accuracy", "latency")  # nas export --pick
