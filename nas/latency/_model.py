"""The calibrated per-kernel cost model: fitting (``fit_kernels``, ``fit_forwards``) and evaluation.

Two stages, both non-negative least squares on *relative* error (each row divided by its
measured time, so a microsecond kernel counts as much as a millisecond one):

1. per kernel class, ``t(launch) = c · x`` over the launch features of ``nas.latency._launches``
   (isolated kernels timed on a grid of shapes, each in a CUDA graph of back-to-back launches,
   so ``c[launch]`` holds the per-launch graph gap too) — the *prior*;
2. the same coefficients refitted on whole forwards measured with ``nas.latency.measure``. A
   forward's time is linear in the coefficients: ``t = Σ_class c_class · Σ_launches x + gap ·
   launches + plain_gap · plain starts + intercept + per_ktoken · tokens/1000`` (a plain start: a
   kernel that programmatic dependent launch cannot overlap with the one before,
   ``Launch.plain``), so every class is fitted on what it costs *inside* a forward (inputs hot in
   L2 from the previous kernel, weights cold, the autotuner's pick for that shape), not on an
   isolated timing scaled by one factor per family. The stage-1 fit is the prior: each
   coefficient is pulled toward it in proportion to how much of the forwards' time its feature
   carries (``strength``), so a class few forwards exercise keeps its kernel-grid cost. The token
   term is what the launch features miss at larger activations (L2 misses between kernels); it
   generalises to shapes the fit never saw, unlike an intercept per shape.

``cross_validate`` gives held-out residuals (folds over architectures, never splitting one
architecture's shapes) for the interval. ``transfer`` rescales a fit to another GPU by datasheet
ratios (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ._launches import FEATURES, FEATURES_ADDED, KINDS, Launch, family

__all__ = ["DEFAULT_STRENGTH", "KernelModel", "cross_validate", "fit_forwards", "fit_kernels", "nnls_relative"]

# stage 2's pull toward the kernel-grid fit (see fit_forwards); chosen by 5-fold cross-validation
# over architectures on the H200 rows (benchmarks/results/predictor_rows_h200.json): 1e-3 to 1e-2
# give the same held-out error, 1.0 (close to the kernel grid) is clearly worse
DEFAULT_STRENGTH = 3e-3


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
    """Coefficients (µs per feature unit) per kernel class, the per-launch graph gap, the extra
    gap of a plain start (``Launch.plain``), a per-forward intercept and a per-forward cost per
    1000 tokens (µs); fitted with kernels ``sm_count`` SMs wide (features are recomputed with the
    target's SM count when predicting). A calibration written before plain starts were priced
    reads ``plain_gap_us`` 0: its predictions are unchanged."""

    coefficients: tuple[tuple[str, tuple[float, ...]], ...]
    gap_us: float = 0.0
    plain_gap_us: float = 0.0
    intercept_us: float = 0.0
    per_ktoken_us: float = 0.0

    def coefficient(self, cls: str) -> tuple[float, ...]:
        found = dict(self.coefficients).get(cls)
        if found is None:
            raise KeyError(f"the calibration has no kernel class {cls!r}; it has {sorted(dict(self.coefficients))}")
        return found

    def kernel_us(self, launch: Launch) -> float:
        """Time of one launch by its class's coefficients (no graph gap)."""
        return sum(c * v for c, v in zip(self.coefficient(launch.cls), launch.x, strict=True))

    def launch_us(self, launch: Launch) -> float:
        """Time of one launch inside a forward (the graph gaps included)."""
        return self.kernel_us(launch) + self.gap_us + self.plain_gap_us * launch.plain

    def overhead_us(self, tokens: int) -> float:
        """The per-forward cost outside the launches at ``tokens`` = batch × sequence length."""
        return self.intercept_us + self.per_ktoken_us * tokens / 1e3

    def forward_us(self, launches: Iterable[Launch], tokens: int) -> float:
        return self.overhead_us(tokens) + sum(self.launch_us(launch) for launch in launches)

    def covers(self, launches: Iterable[Launch]) -> bool:
        known = dict(self.coefficients)
        return all(launch.cls in known for launch in launches)

    def to_dict(self) -> dict:
        """The YAML form (``calibrated.kernel_model`` of a profile): plain lists and floats."""
        return {
            "coefficients": {cls: [float(f"{c:.6g}") for c in coef] for cls, coef in self.coefficients},
            "gap_us": float(f"{self.gap_us:.6g}"),
            "plain_gap_us": float(f"{self.plain_gap_us:.6g}"),
            "intercept_us": float(f"{self.intercept_us:.6g}"),
            "per_ktoken_us": float(f"{self.per_ktoken_us:.6g}"),
        }

    @classmethod
    def from_dict(cls, data: dict) -> KernelModel:
        coefficients = dict(data.get("coefficients") or {})
        for name, coef in coefficients.items():
            fam = family(str(name))
            missing = len(FEATURES.get(fam, ())) - len(coef)
            if fam not in FEATURES or missing not in (0, *FEATURES_ADDED.get(fam, ())):
                raise ValueError(
                    f"kernel_model.coefficients.{name}: expected {len(FEATURES.get(fam, ()))} numbers "
                    f"for family {fam!r}, got {coef!r}"
                )
            coefficients[name] = [*coef, *[0.0] * missing]  # written before those features: not priced
        return cls(
            coefficients=tuple((str(k), tuple(float(c) for c in v)) for k, v in coefficients.items()),
            gap_us=float(data.get("gap_us", 0.0)),
            plain_gap_us=float(data.get("plain_gap_us", 0.0)),
            intercept_us=float(data.get("intercept_us", 0.0)),
            per_ktoken_us=float(data.get("per_ktoken_us", 0.0)),
        )

    def transfer(self, ratios: dict[str, float]) -> KernelModel:
        """This fit on another GPU: each coefficient multiplied by the ratio of its feature's
        kind (``_launches.KINDS``): ``launch`` and ``wave`` by the ratio of nominal launch
        overheads, ``tensor`` by (SMs / bf16 peak) target over source (features are per-SM
        work), ``vector`` likewise with the fp32 peak, ``bytes`` by source over target bandwidth.
        The gaps and the per-forward terms scale like ``launch``."""
        coefficients = tuple(
            (cls, tuple(c * ratios[KINDS[name]] for c, name in zip(coef, FEATURES[family(cls)], strict=True)))
            for cls, coef in self.coefficients
        )
        return replace(
            self,
            coefficients=coefficients,
            gap_us=self.gap_us * ratios["launch"],
            plain_gap_us=self.plain_gap_us * ratios["launch"],
            intercept_us=self.intercept_us * ratios["launch"],
            per_ktoken_us=self.per_ktoken_us * ratios["launch"],
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


def _forward_columns(model: KernelModel, launches: Sequence[Launch], tokens: int) -> list[float]:
    """One forward's row of the stage-2 system: per class of ``model`` (in its order) the summed
    features of its launches, then launches, plain starts, 1 and tokens / 1000."""
    import numpy as np

    offsets, width = {}, 0
    for cls, coef in model.coefficients:
        offsets[cls] = width
        width += len(coef)
    row = np.zeros(width + 4)
    for launch in launches:
        start = offsets[launch.cls]
        row[start : start + len(launch.x)] += launch.x
    row[width:] = (len(launches), sum(launch.plain for launch in launches), 1.0, tokens / 1e3)
    return row.tolist()


def fit_forwards(
    prior: KernelModel, rows: Iterable[tuple[Sequence[Launch], int, float]], *, strength: float = DEFAULT_STRENGTH
) -> KernelModel:
    """Stage 2: every class's coefficients, the graph gaps, the intercept and the token term from
    (launches of a forward, tokens, measured µs) rows, each coefficient pulled toward ``prior``'s.

    Minimises ``Σ_rows ((a·c − t)/t)² + strength · n · Σ_j (s_j (c_j − p_j))²`` over ``c ≥ 0``,
    where ``s_j`` is the mean share of a forward's time one unit of ``c_j`` buys (the column mean
    of ``a/t``): a deviation from the prior costs what the same relative error on every forward
    would. A class no forward launches has ``s_j = 0`` and keeps the prior exactly. Every
    launch's class must be one of ``prior``'s (``prior.covers``)."""
    import numpy as np
    from scipy.optimize import nnls

    data = [(_forward_columns(prior, launches, tokens), us) for launches, tokens, us in rows]
    if not data:
        raise ValueError("fit_forwards: no forward rows")
    X = np.asarray([r for r, _ in data], dtype=float)
    t = np.asarray([us for _, us in data], dtype=float)
    if not (t > 0).all():
        raise ValueError("fit_forwards: every measured time must be > 0")
    p = np.asarray([c for _, coef in prior.coefficients for c in coef], dtype=float)
    k = len(p)
    A = X / t[:, None]
    share = A[:, :k].mean(axis=0)
    penalty = np.zeros((k, A.shape[1]))
    penalty[np.arange(k), np.arange(k)] = math.sqrt(strength * len(t)) * share
    system = np.vstack([A, penalty])
    target = np.concatenate([np.ones(len(t)), penalty[:, :k] @ p])
    scale = np.linalg.norm(system, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(system / scale, target, maxiter=50 * system.shape[1])
    coef = coef / scale
    idle = share == 0  # no forward launches it: the prior, exactly
    coef[:k][idle] = p[idle]
    coefficients, i = [], 0
    for cls, prior_coef in prior.coefficients:
        coefficients.append((cls, tuple(float(c) for c in coef[i : i + len(prior_coef)])))
        i += len(prior_coef)
    return KernelModel(
        tuple(coefficients),
        gap_us=float(coef[k]),
        plain_gap_us=float(coef[k + 1]),
        intercept_us=float(coef[k + 2]),
        per_ktoken_us=float(coef[k + 3]),
    )


def cross_validate(
    prior: KernelModel,
    rows: Sequence[tuple[Sequence[Launch], int, float]],
    groups: Sequence[str],
    *,
    folds: int = 5,
    strength: float = DEFAULT_STRENGTH,
    seed: int = 0,
) -> list[float]:
    """Held-out relative errors (predicted / measured − 1) of ``fit_forwards``, one per row: the
    groups (architectures) are dealt into ``folds`` folds at random (``seed``), and each fold is
    predicted by the fit on the others, so no architecture is ever predicted by a fit that saw it
    at another shape."""
    import random

    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    fold_of = {g: i % folds for i, g in enumerate(names)}
    errors = [math.nan] * len(rows)
    for f in range(min(folds, len(names))):
        train = [row for row, g in zip(rows, groups, strict=True) if fold_of[g] != f]
        model = fit_forwards(prior, train, strength=strength)
        for i, ((launches, tokens, us), g) in enumerate(zip(rows, groups, strict=True)):
            if fold_of[g] == f:
                errors[i] = model.forward_us(launches, tokens) / us - 1.0
    return errors


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [p / m - 1.0 for p, m in zip(predicted, measured, strict=True)]


def interval_widths(errors: Sequence[float]) -> list[float]:
    """For each relative error ``e`` (predicted / measured - 1), the half-width ``i`` a prediction's
    interval ``predicted x (1 ± i)`` (``Latency.low_ms`` / ``high_ms``) needs to hold its
    measurement: ``|measured / predicted - 1|``. An underestimate by 30 % needs ±43 %, so an
    interval read from ``|e|`` itself covers fewer rows than its quantile says. A prediction of
    zero (e = -1) needs an unbounded one."""
    return [abs(e) / (1.0 + e) if e > -1.0 else math.inf for e in errors]


def finite_interval(width: float) -> float:
    """``width``, an interval read from held-out rows, once it is finite: an infinite one (a row
    predicted at 0 ms) is refused rather than written into a profile."""
    if not math.isfinite(width):
        raise ValueError(
            "calibration: a held-out row is predicted at 0 ms, so no interval covers it; refit on more rows"
        )
    return width


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    if pos == lo or s[hi] == s[lo]:  # no interpolation: an infinite neighbour times 0 is NaN
        return s[lo]
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
