"""One latency number and what it belongs to (device, dtype, shape), predicted or measured."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hardware_profiles import DTYPES

from ._shape import LatencyShape, parse_shape

if TYPE_CHECKING:
    from nas.spec import ArchSpec

__all__ = ["LATENCY_KINDS", "SOURCES", "STORED_NOTE", "UNPRICED", "Latency", "shared_labels", "unpriced_precision"]

SOURCES = ("predicted", "measured")
# what was timed: the forward over ``shape`` (batch x tokens), or one decoding step of ``shape.batch``
# sequences that hold ``shape.seq_len`` tokens each (their KV cache / state at that context)
LATENCY_KINDS = ("forward", "decode")
# the note naming an architecture's precision fields that a latency does not price (``unpriced_precision``)
UNPRICED = "unpriced precision"
# the note on a decode step predicted at an architecture's stored dtypes with costs fitted at full precision
STORED_NOTE = "stored precision"


@dataclass(frozen=True)
class Latency:
    """Latency of one model at one shape: a forward, or one decoding step (``kind``).

    ``iqr_ms`` is 0 for a prediction. ``device`` is the profile name (predicted) or the GPU
    name (measured). ``breakdown`` holds ``(op name, ms)`` pairs in execution order and
    ``versions`` ``(package, version)`` pairs of a measurement; tuples keep the value
    hashable, ``to_dict`` turns them into dicts. ``versions`` and ``notes`` are mappings, so
    they are kept sorted by key: a latency read back from JSON (which may reorder keys) is
    equal to the one written. ``breakdown`` keeps its execution order.

    A prediction carries ``interval``, the relative half-width of its uncertainty (0.06: the
    measured latency lies within ±6 % for 95 % of the architectures its calibration was checked
    on), and ``basis``, what it rests on: ``"h200, calibrated 2026-12-01"``, ``"transferred from
    h200"`` or ``"uncalibrated"``. ``label()`` puts them into words. Both default to empty, so a
    dict written before they existed reads back.
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
    interval: float = 0.0  # relative half-width of a prediction's interval (0.06 = ±6 %)
    basis: str = ""  # what a prediction rests on, e.g. "h200, calibrated 2026-12-01"
    kind: str = "forward"  # see LATENCY_KINDS

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Latency.source {self.source!r} is not one of {list(SOURCES)}")
        if self.kind not in LATENCY_KINDS:
            raise ValueError(f"Latency.kind {self.kind!r} is not one of {list(LATENCY_KINDS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Latency.dtype {self.dtype!r} is not one of {list(DTYPES)}")
        if not (self.median_ms >= 0 and self.iqr_ms >= 0):
            raise ValueError(f"Latency median_ms and iqr_ms must be >= 0, got {self.median_ms!r} and {self.iqr_ms!r}")
        if not self.interval >= 0:
            raise ValueError(f"Latency.interval must be >= 0, got {self.interval!r}")
        object.__setattr__(self, "interval", float(self.interval))
        object.__setattr__(self, "basis", str(self.basis))
        object.__setattr__(self, "breakdown", tuple((str(k), float(v)) for k, v in self.breakdown))
        object.__setattr__(self, "versions", tuple(sorted((str(k), str(v)) for k, v in self.versions)))
        object.__setattr__(self, "notes", tuple(sorted((str(k), str(v)) for k, v in self.notes)))

    @property
    def predicted(self) -> bool:
        return self.source == "predicted"

    @property
    def low_ms(self) -> float:
        """Lower end of the interval (the median for a measurement)."""
        return self.median_ms * max(0.0, 1.0 - self.interval)

    @property
    def high_ms(self) -> float:
        return self.median_ms * (1.0 + self.interval)

    def label(self) -> str:
        """``predicted (h200, calibrated 2026-12-01, ±6 %)``, ``predicted (transferred from h200,
        ±15 %)``, ``predicted (uncalibrated, ±70 %)`` or ``measured (NVIDIA H200)``; with ``not
        priced at kv fp8`` inside the brackets for a latency of the kernels' own dtypes where the
        architecture stores something narrower (``unpriced_precision``), or ``stored dtypes at
        full-precision costs`` for a decode step predicted at them (``STORED_NOTE``)."""
        notes = dict(self.notes)
        unpriced = notes.get(UNPRICED)
        caveat = f"not priced at {unpriced}" if unpriced else ""
        if not self.predicted:
            return f"measured ({self.device}{f', {caveat}' if caveat else ''})"
        if STORED_NOTE in notes:
            caveat = "stored dtypes at full-precision costs"
        parts = [p for p in (self.basis, caveat, f"±{self.interval * 100:.0f} %" if self.interval else "") if p]
        return f"predicted ({', '.join(parts)})" if parts else "predicted"

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
            "interval": self.interval,
            "basis": self.basis,
            "kind": self.kind,
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
            interval=float(data.get("interval", 0.0)),
            basis=str(data.get("basis", "")),
            kind=str(data.get("kind", "forward")),
        )


def unpriced_precision(latency: Latency, arch: ArchSpec) -> Latency:
    """A forward ``latency`` of ``arch`` marked, when its precision fields store something narrower
    than the forward kernels do (``ArchSpec.full_precision``): no forward kernel of the library
    stores an fp8 KV cache, a bf16 state or fp8 weights yet, so what was timed or predicted is the
    forward at the kernels' own dtypes (a decode step is priced at them: ``StoredDecoder``). The
    note (``UNPRICED``) names the fields and ``label()`` says they are not priced, so the number is
    not read as the narrower deployment's."""
    if arch.full_precision:
        return latency
    return replace(latency, notes=(*latency.notes, (UNPRICED, arch.precision_text())))


def shared_labels(latencies: Iterable[Latency]) -> list[str]:
    """How many trials' latencies were obtained, for a caption or an axis that says it once: each
    distinct ``label()`` without its ``not priced at`` caveat, then one caveat where some trial had
    it. Label by label, the caveat (a trial's own dtypes) made one basis a line per combination of
    dtypes, and per-layer choices multiply those; each row names its dtypes in its architecture.
    Decode steps predicted at stored dtypes (``STORED_NOTE``) are said once per basis, with their
    (wider) intervals: ``predicted (h200, calibrated …) where a trial stores narrower dtypes: ±48 %,
    priced at full-precision costs``."""
    found = list(latencies)
    plain = [lat for lat in found if STORED_NOTE not in dict(lat.notes)]
    labels = sorted({replace(lat, notes=tuple(n for n in lat.notes if n[0] != UNPRICED)).label() for lat in plain})
    stored: dict[str, set[float]] = {}
    for lat in found:
        if STORED_NOTE in dict(lat.notes):
            base = replace(lat, notes=tuple(n for n in lat.notes if n[0] not in (UNPRICED, STORED_NOTE)), interval=0.0)
            stored.setdefault(base.label(), set()).add(lat.interval)
    for base, intervals in sorted(stored.items()):
        widths = ", ".join(f"±{i * 100:.0f} %" for i in sorted(intervals))
        labels.append(f"{base} where a trial stores narrower dtypes: {widths}, priced at full-precision costs")
    if any(UNPRICED in dict(lat.notes) for lat in found):
        labels.append("not priced at the narrower precision a trial stores (the kernels' own dtypes)")
    return labels
