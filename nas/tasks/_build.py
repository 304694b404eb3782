"""What every generator shares: parameter checks, independent seeded streams, packing into a Task."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nas.tasks.base import MAX_SEQ_LEN, MAX_TASK_TOKENS, MAX_VOCAB, Task, TaskError

__all__ = ["pack", "require", "require_sizes", "streams"]


def require(ok: bool, task: str, msg: str) -> None:
    """Raise ``TaskError("<task>: <msg>")`` unless ``ok`` (user mistakes, not internal invariants)."""
    if not ok:
        raise TaskError(f"{task}: {msg}")


def require_sizes(task: str, vocab_size: int, seq_len: int, rows: int) -> None:
    """A generator's sizes within ``MAX_VOCAB``, ``MAX_SEQ_LEN`` and ``MAX_TASK_TOKENS`` (``rows``:
    train + test), checked before anything is generated."""
    require(vocab_size <= MAX_VOCAB, task, f"vocab_size={vocab_size} is above the maximum of {MAX_VOCAB:,}")
    require(seq_len <= MAX_SEQ_LEN, task, f"seq_len={seq_len} is above the maximum of {MAX_SEQ_LEN:,}")
    require(
        rows * seq_len <= MAX_TASK_TOKENS,
        task,
        f"{rows:,} rows of {seq_len:,} tokens (n_train + n_test) are above the maximum of {MAX_TASK_TOKENS:,} tokens",
    )


def streams(task: str, seed: int, n_train: int, n_test: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent train and test generators for ``seed``: the test split never depends on
    ``n_train`` (or the other way round), and the two never share a draw."""
    require(seed >= 0, task, f"seed must be >= 0, got {seed}")
    require(n_train >= 1 and n_test >= 1, task, f"n_train and n_test must be >= 1, got {n_train} and {n_test}")
    return np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])


def pack(
    name: str,
    config: dict[str, Any],
    vocab_size: int,
    n_out: int,
    readout: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    description: str,
) -> Task:
    """A Task from numpy (x, y) pairs; tensors become int32 (``Task``'s storage) and own their memory."""
    xtr, ytr = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)) for a in train)
    xte, yte = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)) for a in test)
    return Task(name, config, vocab_size, n_out, readout, xtr, ytr, xte, yte, description=description)
