"""One latency number and what it belongs to (device, dtype, shape), predicted or measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hardware_profiles import DTYPES

from ._shape import LatencyShape, parse_shape

__all__ = ["SOURCES", "Latency"]

SOURCES = ("predicted", "measured")


@dataclass(frozen=True)
class Latency:
    """Forward latency of one model at one shape.

    ``iqr_ms`` is 0 for a prediction. ``device`` is the profile name (predicted) or the GPU
    name (measured). ``breakdown`` holds ``(op name, ms)`` pairs in execution order and
    ``versions`` ``(package, version)`` pairs of a measurement; tuples keep the value
    hashable, ``to_dict`` turns them into dicts. ``versions`` and ``notes`` are mappings, so
    they are kept sorted by key: a latency read back from JSON (which may reorder keys) is
    equal to the one written. ``breakdown`` keeps its execution order.
    """

    median_ms: float
    iqr_ms: float
    source: str
    device: str
    dtype: str
    shape: LatencyShape
    breakdown: tuple[tuple[str, float], ...] = ()
    versions: tuple[tuple[str, str], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()  # how a measurement went, e.g. ("remeasured", "spread 3.1% > 2%")

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Latency.source {self.source!r} is not one of {list(SOURCES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Latency.dtype {self.dtype!r} is not one of {list(DTYPES)}")
        if not (self.median_ms >= 0 and self.iqr_ms >= 0):
            raise ValueError(f"Latency median_ms and iqr_ms must be >= 0, got "
                             f"{self.median_ms!r} and {self.iqr_ms!r}")
        object.__setattr__(self, "breakdown", tuple((str(k), float(v)) for k, v in self.breakdown))
        object.__setattr__(self, "versions", tuple(sorted((str(k), str(v)) for k, v in self.versions)))
        object.__setattr__(self, "notes", tuple(sorted((str(k), str(v)) for k, v in self.notes)))

    @property
    def predicted(self) -> bool:
        return self.source == "predicted"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict; the shape is written as ``"BATCHxSEQ_LEN"``."""
        return {
            "median_ms": self.median_ms,
            "iqr_ms": self.iqr_ms,
            "source": self.source,
            "device": self.device,
            "dtype": self.dtype,
            "shape": str(self.shape),
            "breakdown": dict(self.breakdown),
            "versions": dict(self.versions),
            "notes": dict(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Latency:
        """Inverse of ``to_dict`` (reads study user_attrs and the measurement cache)."""
        return cls(
            median_ms=float(data["median_ms"]),
            iqr_ms=float(data["iqr_ms"]),
            source=data["source"],
            device=data["device"],
            dtype=data["dtype"],
            shape=parse_shape(data["shape"]),
            breakdown=tuple(data.get("breakdown", {}).items()),
            versions=tuple(data.get("versions", {}).items()),
            notes=tuple(data.get("notes", {}).items()),
        )
