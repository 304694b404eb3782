"""Fault injection, so tests can make a trial fail each way a real candidate can — on a CPU.

``NAS_FAULT=<kind>[@<n>[,<n>...]]`` injects ``kind`` into trials numbered ``n`` (every trial when
no number is given). Kinds:

- ``oom``: CUDA out-of-memory raised at the third training step;
- ``nan``: a weight set to NaN before the second step, so the loss goes non-finite;
- ``compile``: a Triton compilation error while the candidate's kernels are prepared for timing;
- ``mismatch``: the candidate's kernel output disagrees with the torch reference;
- ``timeout``: every training step sleeps 0.2 s, so the trial outlives ``--trial-timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from nas import settings

__all__ = ["ENV", "KINDS", "FaultError", "planned", "step_hook", "check_scoring"]

ENV = "NAS_FAULT"
KINDS = ("oom", "nan", "compile", "mismatch", "timeout")


class FaultError(ValueError):
    """``NAS_FAULT`` is malformed."""


def planned(trial_number: int) -> str | None:
    """The fault to inject into this trial, if any."""
    spec = settings.get().fault
    if not spec:
        return None
    kind, _, numbers = spec.partition("@")
    if kind not in KINDS:
        raise FaultError(f"{ENV}={spec!r}: kind {kind!r} is not one of {list(KINDS)}")
    try:
        targets = {int(n) for n in numbers.split(",")} if numbers else None
    except ValueError:
        raise FaultError(f"{ENV}={spec!r}: trial numbers must be integers, e.g. oom@0,3") from None
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
    elif kind == "timeout":
        def hook(step: int) -> None:
            time.sleep(0.2)
    else:
        return None
    return hook


def check_scoring(kind: str | None) -> None:
    """Raise the scoring-time fault, as the measured-latency path would report it."""
    from nas.latency import KernelCompileError, KernelMismatchError

    if kind == "compile":
        raise KernelCompileError("triton compilation failed: out of resource: shared memory (injected)")
    if kind == "mismatch":
        raise KernelMismatchError("triton forward differs from the torch reference: max |err| 3.1e-01 > 2e-02 "
                                  "(injected)")
