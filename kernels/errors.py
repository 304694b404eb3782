"""Why a candidate's kernels could not be used: raised by the model's kernel wrappers and by
latency measurement, these fail the trial with their message (`nas.latency` re-exports them)."""

from __future__ import annotations

__all__ = ["KernelError", "KernelCompileError", "KernelLaunchError", "KernelMismatchError"]


class KernelError(RuntimeError):
    """A candidate's kernels cannot be used for timing."""


class KernelCompileError(KernelError):
    """Triton could not compile a kernel for this candidate (e.g. out of shared memory)."""


class KernelLaunchError(KernelError):
    """A kernel wrapper refused this candidate's shapes or failed to launch (a bug to report)."""


class KernelMismatchError(KernelError):
    """The Triton forward disagrees with the torch reference beyond the dtype's tolerance."""
