"""Fault injection, so tests can make a trial fail each way a real candidate can — on a CPU.

``NAS_FAULT=<kind>[@<n>[,<n>...]]`` injects ``kind`` into trials numbered ``n`` (every trial when
no number is given). Kinds:

- ``oom``: CUDA out-of-memory raised at the third training step;
- ``nan``: a weight set to NaN before the second step, so the loss goes non-finite;
- ``compile``: a Triton compilation error while the candidate's kernels are prepared for timing;
- ``mismatch``: the candidate's kernel output disagrees with the torch reference;
- ``timeout``: the trial's deadline is already past when training starts, so the trainer stops
  it at its first check exactly as ``--trial-timeout`` would (no sleeping: the test does not
  depend on how fast the machine is);
- ``slow``: the training's wall-clock guard (``max_train_seconds``) is already spent after the
  first step, as on a machine too busy to train the candidate in time: the trial is recorded
  truncated with its steps and kept off the front (a baseline has no guard to spend).

A malformed value is a ``FaultError`` (one line, exit 2); ``check()`` raises it before a search
opens its study, so a typo never leaves a trial behind.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nas import settings

__all__ = ["ENV", "KINDS", "FaultError", "check", "check_scoring", "parse", "planned", "step_hook", "training_budget"]

ENV = "NAS_FAULT"
KINDS = ("oom", "nan", "compile", "mismatch", "timeout", "slow")


class FaultError(ValueError):
    """``NAS_FAULT`` is malformed."""


def parse(spec: str) -> tuple[str, frozenset[int] | None] | None:
    """``KIND[@N,...]`` -> (kind, trial numbers, None for every trial); None for an empty spec."""
    if not spec:
        return None
    kind, at, numbers = spec.partition("@")
    kind = kind.strip()
    if kind not in KINDS:
        raise FaultError(f"{ENV}={spec!r}: kind {kind!r} is not one of {list(KINDS)}")
    if not at:
        return kind, None
    parts = [n.strip() for n in numbers.split(",")]
    if not all(n.isdigit() and n.isascii() for n in parts):
        raise FaultError(f"{ENV}={spec!r}: trial numbers must be integers >= 0, e.g. {kind}@0,3")
    return kind, frozenset(int(n) for n in parts)


def check() -> None:
    """Raise FaultError now if ``NAS_FAULT`` is malformed (a search calls it before opening its study)."""
    parse(settings.get().fault)


def planned(trial_number: int) -> str | None:
    """The fault to inject into this trial, if any."""
    parsed = parse(settings.get().fault)
    if parsed is None:
        return None
    kind, targets = parsed
    return kind if targets is None or trial_number in targets else None


def step_hook(kind: str | None, model: torch.nn.Module) -> Callable[[int], None] | None:
    """A per-step callback for ``train`` that injects a training-time fault."""
    if kind == "oom":

        def hook(step: int) -> None:
            if step == 3:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by NAS_FAULT=oom)")
    elif kind == "nan":

        def hook(step: int) -> None:
            if step == 2:
                with torch.no_grad():
                    next(model.parameters()).fill_(float("nan"))
    else:
        return None
    return hook


def training_budget(
    kind: str | None, max_seconds: float | None, deadline: float | None, now: float
) -> tuple[float | None, float | None]:
    """The (wall-clock guard, deadline) a trial trains under, with ``slow`` / ``timeout`` applied
    (``slow`` spends a guard the trial has: a baseline, trained without one, is not cut short)."""
    if kind == "slow":
        return (None if max_seconds is None else 0.0), deadline
    if kind == "timeout":
        return max_seconds, now
    return max_seconds, deadline


def check_scoring(kind: str | None) -> None:
    """Raise the scoring-time fault, as the measured-latency path would report it."""
    from nas.latency import KernelCompileError, KernelMismatchError

    if kind == "compile":
        raise KernelCompileError("triton compilation failed: out of resource: shared memory (injected)")
    if kind == "mismatch":
        raise KernelMismatchError(
            "triton forward differs from the torch reference: max |err| 3.1e-01 > 2e-02 (injected)"
        )
