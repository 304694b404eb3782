"""Several worker processes on one study: one per GPU (or per CPU slot), each a ``nas worker``.

The parent prepares the study (so every worker reads the same recorded settings), starts the
workers with ``CUDA_VISIBLE_DEVICES`` set to their GPU, and watches progress in storage. The
budget is counted in storage, so workers on other hosts (``nas worker``) can join the same study.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from kernels.device import worker_device
from nas.search import gpu_share
from nas.search.setup import MAX_WORKERS

__all__ = ["Slot", "WorkerError", "check_cpu_workers", "parse_gpus", "plan_slots", "run_workers"]

logger = logging.getLogger(__name__)


class WorkerError(ValueError):
    """The worker layout asked for is impossible here; the message says why."""


@dataclass(frozen=True)
class Slot:
    """One worker process: its GPU (None: CPU) and its index (labels its progress lines)."""

    gpu: str | None
    index: int


def parse_gpus(text: str) -> list[str]:
    """``"0,1"`` → ``["0", "1"]``; each must be a visible CUDA device index."""
    import torch

    gpus = [g.strip() for g in text.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise WorkerError(f"--gpus {text!r} must be distinct device indices such as 0,1")
    available = torch.cuda.device_count()
    missing = [g for g in gpus if int(g) >= available]
    if missing:
        raise WorkerError(f"--gpus {text!r}: no CUDA device {missing[0]} (this machine has {available})")
    return gpus


def plan_slots(gpus: list[str] | None, per_gpu: int | None, workers: int | None) -> list[Slot]:
    """The worker processes to start: ``per_gpu`` on each of ``gpus``, else ``workers`` on the CPU
    (None: the flag was not given, 1). A flag the other choice makes moot is refused rather than
    ignored."""
    if gpus and workers is not None:
        raise WorkerError("--workers counts CPU processes; with --gpus, set processes per GPU with --trials-per-gpu")
    if not gpus and per_gpu is not None:
        raise WorkerError("--trials-per-gpu needs --gpus (on the CPU, start processes with --workers)")
    per_gpu = 1 if per_gpu is None else per_gpu
    workers = 1 if workers is None else workers
    if per_gpu < 1 or workers < 1:
        raise WorkerError("--trials-per-gpu and --workers must be >= 1")
    total, what = (
        (len(gpus) * per_gpu, f"{len(gpus)} GPU(s) x --trials-per-gpu {per_gpu}") if gpus else (workers, "--workers")
    )
    if total > MAX_WORKERS:
        raise WorkerError(f"{what} asks for {total:,} worker processes; at most {MAX_WORKERS}")
    if gpus:
        return [Slot(g, i) for i, g in enumerate(g for g in gpus for _ in range(per_gpu))]
    return [Slot(None, i) for i in range(workers)]


def check_cpu_workers(slots: list[Slot], device: str, cuda: bool) -> None:
    """Refuse several CPU worker processes (``--workers N`` without ``--gpus``) where the search
    was asked to train on a GPU: ``--device`` naming one, or ``auto`` on a machine that has one
    (``cuda``). Those processes train on the CPU, so such a search ran many times slower than the
    user meant without a word beyond its first line."""
    if len(slots) < 2 or any(s.gpu is not None for s in slots) or device == "cpu":
        return
    if device == "auto" and not cuda:
        return
    asked = (
        "this machine has a GPU (--device auto takes it)" if device == "auto" else f"--device {device} asks for a GPU"
    )
    index = device.partition(":")[2] or "0"  # cuda:1 -> --gpus 1
    raise WorkerError(
        f"--workers {len(slots)} starts CPU processes, but {asked}: train on it with "
        f"--gpus {index} --trials-per-gpu {len(slots)}, or on the CPU with --device cpu"
    )


def _command(
    study: str, storage: str, trials: int, slot: Slot, timeout: float | None, verbose: int, data: str | None = None
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "nas",
        *["-v"] * verbose,
        "worker",
        "--study",
        study,
        "--storage",
        storage,
        "--trials",
        str(trials),
        "--worker-index",
        str(slot.index),
        "--device",
        worker_device(slot.gpu),
    ]
    return cmd + (["--timeout", str(timeout)] if timeout else []) + (["--data", data] if data else [])


def run_workers(
    study: optuna.Study,
    storage: str,
    trials: int,
    slots: list[Slot],
    *,
    timeout: float | None = None,
    on_poll: Callable[[optuna.Study], None] | None = None,
    poll_seconds: float = 1.0,
    verbose: int = 0,
    data: str | None = None,
) -> list[int]:
    """Run one ``nas worker`` per slot until all exit; returns their exit codes. Their stdout
    (a line per trial) is dropped: ``on_poll`` reports progress from storage; errors and ``-v``
    logs (``verbose``) go to stderr. ``data``: the data file this run found the study's bytes at
    (``nas worker --data``: it may have moved since the study recorded its path).

    Ctrl-C (SIGINT) is passed on to the workers, which record their running trial as interrupted.
    """
    procs = []
    for slot in slots:
        env = dict(os.environ)
        env.pop(gpu_share.ENV, None)  # only workers that share a GPU take turns, and only with each other
        if slot.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot.gpu
            if sum(s.gpu == slot.gpu for s in slots) > 1:  # measurements pause the GPU's other workers
                env[gpu_share.ENV] = gpu_share.lock_prefix(slot.gpu)
        # Share the cores: every worker's intra-op pool defaults to all of them, and several pools
        # spinning on the same cores slow each other down many times over (GPU workers too: their
        # host-side work is small, launch-bound CPU ops).
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // len(slots))))
        procs.append(
            subprocess.Popen(
                _command(study.study_name, storage, trials, slot, timeout, verbose, data),
                env=env,
                stdout=subprocess.DEVNULL,
            )
        )
        logger.info("worker %d started (pid %d, gpu %s)", slot.index, procs[-1].pid, slot.gpu)
    try:
        while any(p.poll() is None for p in procs):
            if on_poll is not None:
                on_poll(study)
            time.sleep(poll_seconds)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    if on_poll is not None:
        on_poll(study)
    return [p.returncode for p in procs]
