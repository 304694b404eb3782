"""Worker processes sharing one GPU take turns with it while one of them measures latency.

``--trials-per-gpu N`` runs N workers on a GPU to keep it busy with small candidates; but a
latency measured while a neighbour trains would time the neighbour too. So the workers of a GPU
share two lock files (``fcntl.flock``: released by the kernel when a process dies, so a killed
worker never leaves the GPU locked):

- training holds the *gpu* lock shared, one window of steps at a time (between the trainer's
  batched NaN checks), and synchronizes the device before letting go;
- measuring takes the *gate* lock exclusively, then the *gpu* lock exclusively: a trainer takes
  the gate (shared, momentarily) before each window, so once a measurement is waiting no new
  window starts, the windows in flight drain, and the measurement has the GPU to itself.

``run_workers`` sets ``NAS_GPU_SHARE`` to the lock files' path prefix for workers that share a
GPU; without it (one worker per GPU, CPU runs) every method here is a no-op.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ENV", "GpuShare", "current", "lock_prefix"]

ENV = "NAS_GPU_SHARE"


def lock_prefix(gpu: str, directory: str | None = None) -> str:
    """The lock files' prefix for physical GPU ``gpu`` (its index before CUDA_VISIBLE_DEVICES)."""
    import tempfile

    return str(Path(directory or tempfile.gettempdir()) / f"hybrid-nas-gpu{gpu}")


class GpuShare:
    """The turn-taking of the workers on this process's GPU (see the module docstring)."""

    def __init__(self, prefix: str | None = None) -> None:
        prefix = prefix if prefix is not None else os.environ.get(ENV)
        self.enabled = bool(prefix)
        self._holding = False
        if self.enabled:
            self._gate = os.open(f"{prefix}.gate", os.O_RDWR | os.O_CREAT, 0o666)
            self._gpu = os.open(f"{prefix}.lock", os.O_RDWR | os.O_CREAT, 0o666)

    def acquire_shared(self) -> None:
        """Before a training window: wait out any measurement that is running or waiting."""
        if not self.enabled or self._holding:
            return
        fcntl.flock(self._gate, fcntl.LOCK_SH)
        try:
            fcntl.flock(self._gpu, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._holding = True

    def release_shared(self, sync: bool = True) -> None:
        """After a training window: finish this process's GPU work, then let a measurement in."""
        if not self.enabled or not self._holding:
            return
        if sync:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        fcntl.flock(self._gpu, fcntl.LOCK_UN)
        self._holding = False

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The GPU to this process alone (the other workers' windows drained and paused)."""
        if not self.enabled:
            yield
            return
        self.release_shared()
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._gpu, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._gpu, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """A stretch of GPU work (evaluation) that a measurement must not overlap."""
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    def close(self) -> None:
        if self.enabled:
            os.close(self._gate)
            os.close(self._gpu)
            self.enabled = False


_share: GpuShare | None = None


def current() -> GpuShare:
    """This process's GpuShare, from ``NAS_GPU_SHARE`` at first use."""
    global _share
    if _share is None:
        _share = GpuShare()
    return _share
