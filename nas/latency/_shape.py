"""The input shape a latency belongs to: ``BATCHxSEQ_LEN`` tokens, e.g. ``8x1024``."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LatencyShape", "parse_shape"]

_SHAPE = re.compile(r"([0-9]+)x([0-9]+)")


@dataclass(frozen=True)
class LatencyShape:
    """``batch`` sequences of ``seq_len`` tokens each (the context length of the forward)."""

    batch: int
    seq_len: int

    def __post_init__(self) -> None:
        for field in ("batch", "seq_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LatencyShape.{field} must be a positive integer, got {value!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def __str__(self) -> str:
        return f"{self.batch}x{self.seq_len}"


def parse_shape(text: str) -> LatencyShape:
    """``"8x1024"`` -> ``LatencyShape(batch=8, seq_len=1024)``; ValueError on anything else."""
    match = _SHAPE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"invalid shape {text!r}: expected BATCHxSEQ_LEN with positive integers, e.g. '8x1024'")
    return LatencyShape(int(match[1]), int(match[2]))
