"""The task contract: fixed, seeded train/test tensors plus the loss and metric that score them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["IGNORE_INDEX", "MAX_SEQ_LEN", "MAX_TASK_TOKENS", "MAX_VOCAB", "Task", "TaskError"]

IGNORE_INDEX = -100  # target value of an unscored position (cross-entropy ignore_index)
# Upper bounds on a task's sizes, for data files and generators alike (docs/spaces.md lists them):
# the vocabulary (max token + 1) and the number of outputs: the model's embedding table and output
# layer have that many rows, so one stray id of 2^31 - 1 would ask for hundreds of gigabytes;
MAX_VOCAB = 1_048_576
# tokens per row (every candidate trains and is scored at this length; docs/spaces.md's long-context
# work trains at up to 8K, decode contexts are --context, not rows);
MAX_SEQ_LEN = 65_536
# tokens in all rows, train and test (x and y then hold 8 GiB as int32).
MAX_TASK_TOKENS = 2**30


class TaskError(ValueError):
    """A task name, parameter or data file is wrong; the message names what and why."""


@dataclass(frozen=True, eq=False)
class Task:
    """A supervised sequence task, generated once and held as tensors.

    x_*: int32 tokens ``[N, T]`` in ``[0, vocab_size)``.
    y_*: int32 targets ``[N, T]`` (``readout == "token"``, IGNORE_INDEX = unscored) or
    ``[N]`` class labels (``readout == "last"``) in ``[0, n_out)``.
    Stored as int32, half of int64's bytes (a long-context MQAR set is gigabytes); ``batch``
    hands the model and the loss int64 rows.
    ``config`` is enough to regenerate the task: ``{"name": ..., "seed": ..., **params}``.

    A length curriculum (optional): ``x_stage1``, ``y_stage1`` are training rows of a shorter
    sequence length, and ``stage1_frac`` the share of the training steps (the first ones) drawn
    from them; the rest, and every evaluation, use the full-length rows.
    """

    name: str
    config: dict[str, Any]
    vocab_size: int
    n_out: int
    readout: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    description: str = field(default="")
    x_stage1: torch.Tensor | None = None
    y_stage1: torch.Tensor | None = None
    stage1_frac: float = 0.0

    @property
    def seq_len(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def scored_targets(self) -> int:
        """The test split's scored targets, what accuracy counts hits over: one per row
        (``readout == "last"``), else every position not ``IGNORE_INDEX`` (MQAR's queries, a text
        file's next tokens). Accuracy moves in steps of 1 / this."""
        if self.readout == "last":
            return int(self.y_test.shape[0])
        return int((self.y_test != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str) -> Task:
        """The same task with its tensors on ``device`` (generated once, moved once)."""
        move = {k: getattr(self, k).to(device) for k in ("x_train", "y_train", "x_test", "y_test")}
        stage1 = {k: getattr(self, k) for k in ("x_stage1", "y_stage1")}
        stage1 = {k: v if v is None else v.to(device) for k, v in stage1.items()}
        return Task(
            self.name,
            self.config,
            self.vocab_size,
            self.n_out,
            self.readout,
            **move,
            description=self.description,
            **stage1,
            stage1_frac=self.stage1_frac,
        )

    def stage1_steps(self, steps: int) -> int:
        """How many of ``steps`` training steps draw from the curriculum's short rows (0 without)."""
        return round(steps * self.stage1_frac) if self.x_stage1 is not None else 0

    def batch(self, rows: torch.Tensor | slice, *, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """int64 (x ``[B, T]``, y ``[B, T]`` or ``[B]``) of ``rows`` of ``split`` ("train" or "test"):
        ``rows`` is an index tensor ``[B]`` or a slice; only those rows are gathered and widened."""
        assert split in ("train", "test", "stage1"), split
        x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
        return x[rows].long(), y[rows].long()

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over scored positions. logits ``[N, T, C]`` or ``[N, C]``. A batch
        with no scored position has loss 0 and no gradient (torch's mean would be 0/0 = NaN, read
        as a diverged trial); with some, it is torch's mean: the same sum divided by the same count
        (bit for bit on the CPU, tests/tasks; a CUDA reduction may round its last bit otherwise)."""
        y = y.reshape(-1)
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y, ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return total / (y != IGNORE_INDEX).sum().clamp(min=1)

    @staticmethod
    def correct(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(number correct, number scored) as 0-dim tensors; no host sync."""
        scored = y != IGNORE_INDEX
        hits = (logits.argmax(-1) == y) & scored
        return hits.sum(), scored.sum()
