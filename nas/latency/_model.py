"""The calibrated per-kernel cost model: fitting (``fit_kernels``, ``fit_whole``) and evaluation.

Two stages, both non-negative least squares on *relative* error (each row divided by its
measured time, so a 5 µs kernel counts as much as a 5 ms one):

1. per kernel class, ``t(launch) = c · x`` over the launch features of ``nas.latency._launches``
   (isolated kernels timed on a grid of shapes, each in a CUDA graph of back-to-back launches,
   so ``c[launch]`` holds the per-launch graph gap too);
2. per whole model, ``t = Σ_group s_group · Σ t(launch) + gap · launches + intercept`` over
   random architectures measured with ``nas.latency.measure``: what a kernel costs inside a
   forward (its inputs hot in L2 from the previous kernel, the weights cold) differs from the
   isolated timing by a few per cent per family, and the forward adds graph overhead.

``transfer`` rescales a fit to another GPU by datasheet ratios (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ._launches import FEATURES, KINDS, Launch, family

__all__ = ["GROUPS", "KernelModel", "fit_kernels", "fit_whole", "nnls_relative"]

GROUPS = (
    "linear.tma",
    "linear.short_k",
    "linear.small_m",
    "linear.long_k",
    "attention",
    "linear_attention",
    "norm",
    "conv",
    "embed",
    "copy",
)


def nnls_relative(
    rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float] | None = None
) -> list[float]:
    """Non-negative ``c`` minimising ``Σ w·((x·c − t)/t)²``; columns are scaled to unit norm
    before the solve (conditioning) and the coefficients scaled back."""
    import numpy as np
    from scipy.optimize import nnls

    X = np.asarray(rows, dtype=float)
    t = np.asarray(targets, dtype=float)
    if X.ndim != 2 or len(X) != len(t) or len(t) == 0:
        raise ValueError(
            f"nnls_relative: need a [rows, features] matrix and one target per row, got {X.shape}, {t.shape}"
        )
    if not (t > 0).all():
        raise ValueError("nnls_relative: every target time must be > 0")
    w = np.sqrt(np.asarray(weights, dtype=float)) if weights is not None else np.ones_like(t)
    A = X / t[:, None] * w[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, w, maxiter=50 * X.shape[1])
    return [float(c) for c in coef / scale]


@dataclass(frozen=True)
class KernelModel:
    """Coefficients (µs per feature unit) per kernel class, whole-model scales per group, the
    per-launch graph gap and a per-forward intercept (µs); fitted with kernels ``sm_count`` SMs
    wide (features are recomputed with the target's SM count when predicting)."""

    coefficients: tuple[tuple[str, tuple[float, ...]], ...]
    scales: tuple[tuple[str, float], ...] = ()
    gap_us: float = 0.0
    intercept_us: float = 0.0

    def coefficient(self, cls: str) -> tuple[float, ...]:
        found = dict(self.coefficients).get(cls)
        if found is None:
            raise KeyError(f"the calibration has no kernel class {cls!r}; it has {sorted(dict(self.coefficients))}")
        return found

    def kernel_us(self, launch: Launch) -> float:
        """Isolated time of one launch (stage 1)."""
        return sum(c * v for c, v in zip(self.coefficient(launch.cls), launch.x, strict=True))

    def launch_us(self, launch: Launch) -> float:
        """Time of one launch inside a forward (stage 2 scale and gap applied)."""
        return dict(self.scales).get(launch.group, 1.0) * self.kernel_us(launch) + self.gap_us

    def forward_us(self, launches: Iterable[Launch]) -> float:
        return self.intercept_us + sum(self.launch_us(launch) for launch in launches)

    def covers(self, launches: Iterable[Launch]) -> bool:
        known = dict(self.coefficients)
        return all(launch.cls in known for launch in launches)

    def to_dict(self) -> dict:
        """The YAML form (``calibrated.kernel_model`` of a profile): plain lists and floats."""
        return {
            "coefficients": {cls: [float(f"{c:.6g}") for c in coef] for cls, coef in self.coefficients},
            "scales": {g: float(f"{s:.6g}") for g, s in self.scales},
            "gap_us": float(f"{self.gap_us:.6g}"),
            "intercept_us": float(f"{self.intercept_us:.6g}"),
        }

    @classmethod
    def from_dict(cls, data: dict) -> KernelModel:
        coefficients = data.get("coefficients") or {}
        for name, coef in coefficients.items():
            fam = family(str(name))
            if fam not in FEATURES or len(coef) != len(FEATURES[fam]):
                raise ValueError(
                    f"kernel_model.coefficients.{name}: expected {len(FEATURES.get(fam, ()))} numbers "
                    f"for family {fam!r}, got {coef!r}"
                )
        return cls(
            coefficients=tuple((str(k), tuple(float(c) for c in v)) for k, v in coefficients.items()),
            scales=tuple((str(k), float(v)) for k, v in (data.get("scales") or {}).items()),
            gap_us=float(data.get("gap_us", 0.0)),
            intercept_us=float(data.get("intercept_us", 0.0)),
        )

    def transfer(self, ratios: dict[str, float]) -> KernelModel:
        """This fit on another GPU: each coefficient multiplied by the ratio of its feature's
        kind (``_launches.KINDS``): ``launch`` and ``wave`` by the ratio of nominal launch
        overheads, ``tensor`` by (SMs / bf16 peak) target over source (features are per-SM
        work), ``vector`` likewise with the fp32 peak, ``bytes`` by source over target bandwidth.
        The gap and intercept scale like ``launch``."""
        coefficients = tuple(
            (cls, tuple(c * ratios[KINDS[name]] for c, name in zip(coef, FEATURES[family(cls)], strict=True)))
            for cls, coef in self.coefficients
        )
        return replace(
            self,
            coefficients=coefficients,
            gap_us=self.gap_us * ratios["launch"],
            intercept_us=self.intercept_us * ratios["launch"],
        )


def fit_kernels(rows: Iterable[tuple[Launch, float]]) -> KernelModel:
    """Stage 1: one NNLS per kernel class over (launch, measured µs) rows."""
    by_class: dict[str, list[tuple[Launch, float]]] = {}
    for launch, us in rows:
        by_class.setdefault(launch.cls, []).append((launch, us))
    coefficients = []
    for cls, data in sorted(by_class.items()):
        coef = nnls_relative([launch.x for launch, _ in data], [us for _, us in data])
        coefficients.append((cls, tuple(coef)))
    return KernelModel(tuple(coefficients))


@dataclass(frozen=True)
class _WholeRow:
    per_group: dict[str, float] = field(default_factory=dict)
    launches: int = 0


def fit_whole(model: KernelModel, rows: Iterable[tuple[Sequence[Launch], float]]) -> KernelModel:
    """Stage 2: group scales, per-launch gap and intercept from (launches of a forward, measured
    µs) rows, with the stage-1 coefficients fixed. A group absent from every row keeps scale 1."""
    data = []
    for launches, us in rows:
        per_group: dict[str, float] = {}
        for launch in launches:
            per_group[launch.group] = per_group.get(launch.group, 0.0) + model.kernel_us(launch)
        data.append((_WholeRow(per_group, len(launches)), us))
    groups = [g for g in GROUPS if any(r.per_group.get(g, 0.0) > 0 for r, _ in data)]
    X = [[r.per_group.get(g, 0.0) for g in groups] + [r.launches, 1.0] for r, _ in data]
    coef = nnls_relative(X, [us for _, us in data])
    scales = tuple((g, coef[i]) for i, g in enumerate(groups))
    return replace(model, scales=scales, gap_us=coef[-2], intercept_us=coef[-1])


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [p / m - 1.0 for p, m in zip(predicted, measured, strict=True)]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
