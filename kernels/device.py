"""Devices, named in one place: which device a run uses, whether it is a CUDA GPU, and what that
GPU is. Every other module (the kernels' input checks and configs, the trainer, latency
measurement, the workers) asks here instead of spelling ``"cuda"`` itself.
"""

from __future__ import annotations

import torch

__all__ = [
    "CUDA",
    "DeviceError",
    "cuda_available",
    "gpu_name",
    "is_cuda",
    "l2_bytes",
    "resolve",
    "sm_count",
    "worker_device",
]

CUDA = "cuda"  # torch's device type of NVIDIA GPUs


class DeviceError(ValueError):
    """A device string that is not usable here; the message names it and the allowed forms."""


def cuda_available() -> bool:
    return torch.cuda.is_available()


def is_cuda(device: torch.device | str | None) -> bool:
    """Whether ``device`` (a torch.device, a string, or None for the CPU) is a CUDA GPU."""
    return device is not None and torch.device(device).type == CUDA


def resolve(device: str | torch.device) -> torch.device:
    """``auto`` → the current CUDA GPU if there is one, else the CPU; ``cpu``, ``cuda``, ``cuda:N``
    → that device (``cuda`` is given its index, so later calls on it name the same GPU).
    Raises DeviceError for a malformed string or a GPU this machine does not have."""
    if isinstance(device, str) and device == "auto":
        return resolve(CUDA) if cuda_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {device!r} is not a torch device (use auto, cpu, cuda, cuda:N)") from None
    if dev.type != CUDA:
        return dev
    if not cuda_available():
        raise DeviceError(f"device {str(device)!r} asked for CUDA but no CUDA device is available")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(CUDA, index)


def worker_device(gpu: str | None) -> str:
    """The ``--device`` a worker process is started with: ``cuda`` (its only visible GPU, set by
    ``CUDA_VISIBLE_DEVICES``) or ``cpu``."""
    return "cpu" if gpu is None else CUDA


def gpu_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` of ``device`` (e.g. ``NVIDIA H200``)."""
    return torch.cuda.get_device_name(device)


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def l2_bytes(device: torch.device, default: int = 50 * 2**20) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size or default
