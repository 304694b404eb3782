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
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from nas import settings

__all__ = ["ENV", "GpuShare", "current", "lock_prefix"]

ENV = "NAS_GPU_SHARE"
logger = logging.getLogger(__name__)


def lock_prefix(gpu: str, directory: str | None = None) -> str:
    """The lock files' prefix for GPU ``gpu`` (as ``nas search --gpus`` names it), per user: in a
    shared temp directory another user's files would be read-only to us."""
    import tempfile

    return str(Path(directory or tempfile.gettempdir()) / f"hybrid-nas-{os.getuid()}-gpu{gpu}")


class GpuShare:
    """The turn-taking of the workers on this process's GPU (see the module docstring)."""

    def __init__(self, prefix: str | None = None) -> None:
        prefix = prefix if prefix is not None else settings.get().gpu_share
        self.enabled = bool(prefix)
        self._holding = False
        if self.enabled:
            try:
                self._gate = os.open(f"{prefix}.gate", os.O_RDWR | os.O_CREAT, 0o600)
                self._gpu = os.open(f"{prefix}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:  # an unusable lock must not stop the search: it only costs accuracy of timing
                logger.warning("GPU turn-taking off (%s): latency may be measured while neighbours train", e)
                self.enabled = False

    def acquire_shared(self) -> float:
        """Before a training window: wait out any measurement that is running or waiting.
        Returns the seconds spent waiting (the trainer does not count them as training time)."""
        if not self.enabled or self._holding:
            return 0.0
        start = time.perf_counter()
        fcntl.flock(self._gate, fcntl.LOCK_SH)
        try:
            fcntl.flock(self._gpu, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._holding = True
        return time.perf_counter() - start

    def release_shared(self, sync: bool = True) -> None:
        """After a training window: finish this process's GPU work, then let a measurement in."""
        if not self.enabled or not self._holding:
            return
        if sync:
            import torch

            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 — a broken context: the caller's own error says why
                pass
        fcntl.flock(self._gpu, fcntl.LOCK_UN)
        self._holding = False

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[float]:
        """The GPU to this process alone (the other workers' windows drained and paused); yields
        the seconds it waited for that."""
        if not self.enabled:
            yield 0.0
            return
        self.release_shared()
        start = time.perf_counter()
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._gpu, fcntl.LOCK_EX)
            try:
                yield time.perf_counter() - start
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
