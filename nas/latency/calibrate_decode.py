"""Calibration of the decode-step cost model on a real GPU (``nas profiles calibrate --decode``).

``calibrate_decode(profile)`` on a CUDA machine whose GPU the profile lists measures one decoding
step (``measure_decode``: the ``TritonDecoder`` checked against the torch model, then replayed
from a CUDA graph) of random architectures (``calibrate.random_arch``, readout ``token``) at
``DECODE_SHAPES`` — batch 1-16, contexts 1K-32K, so the weights, the KV cache and the launches
each dominate somewhere — and fits ``nas.latency._decode``'s model by non-negative least squares
on relative error: µs per launch plus µs per MiB of weights, KV cache (per head dim; a head dim
seen in fewer than ``MIN_ARCHS_PER_KV_CLASS`` architectures shares its neighbour's cost) and
state, and µs per launch and per MiB of weights again on rows of a width off a multiple of 16.
Its interval is the 95th percentile of |measured / predicted - 1| over cross-validation by
architecture (5 folds: an architecture is never predicted by a fit that saw it at another shape),
as for the forward. The result goes into the ``calibrated.decode_model`` entry of the profile,
with the decode kernels' fingerprint (``decode_fingerprint``), GPU and date; the forward's
calibration is left as it was.

``fit_decode`` and the writing are CPU functions over the timing rows, so a saved set of rows can
be refitted anywhere.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hardware_profiles import HardwareProfile, load_profile
from nas.spec import ArchSpec

from ._decode import DECODE_FEATURES, KV_HEAD_DIMS, decode_work
from ._model import finite_interval, interval_widths, nnls_relative, quantile, relative_errors
from .calibrate import (
    CV_FOLDS,
    INTERVAL_QUANTILE,
    CalibrationError,
    budget_cut,
    check_summary,
    environment,
    random_arch,
    require_gpu,
    write_calibration,
)

__all__ = [
    "DECODE_SHAPES",
    "calibrate_decode",
    "decode_archs",
    "decode_section",
    "fit_decode",
    "measure_decodes",
    "write_decode",
]

# a KV-cache class (head dim) seen in fewer architectures than this shares its neighbour's cost
MIN_ARCHS_PER_KV_CLASS = 3
_KV = range(2, 2 + len(KV_HEAD_DIMS))  # the KV-cache classes' columns in DECODE_FEATURES

# (batch, context): one sequence at short, medium and long context, and batches where the KV cache
# traffic grows past the weights'
DECODE_SHAPES = ((1, 1024), (1, 8192), (1, 32768), (8, 4096), (16, 16384))


def decode_archs(seed: int, n: int) -> list[ArchSpec]:
    """``n`` random architectures that generate (readout ``token``), as the forward's calibration draws them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        arch = random_arch(rng)
        out.append(ArchSpec(arch.d_model, arch.layers, arch.vocab_size, arch.n_out, "token"))
    return out


def measure_decodes(
    models: Iterable[tuple[ArchSpec, int, int]],
    *,
    on_row: Callable[[dict], None] | None = None,
    deadline: float = math.inf,
) -> list[dict]:
    """``{"arch", "batch", "context", "ms", "iqr_ms"}`` (or ``"error"``) per (arch, batch, context),
    by ``measure_decode`` with a private cache (every number here is fresh)."""
    from nas.models import build

    from ._measure import LatencyCache
    from ._measure_decode import measure_decode

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = LatencyCache(Path(tmp) / "latency.json")
        for arch, batch, context in models:
            if time.monotonic() > deadline:
                break
            row: dict[str, Any] = {"arch": arch.to_dict(), "batch": batch, "context": context}
            try:
                lat = measure_decode(build(arch, seed=0), batch, context, cache=cache)
                row.update(ms=lat.median_ms, iqr_ms=lat.iqr_ms)
            except Exception as e:  # noqa: BLE001 - a candidate the kernels refuse is recorded, not fatal
                text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                row["error"] = f"{type(e).__name__}: {text}"
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _features(row: dict) -> tuple[float, ...]:
    return decode_work(ArchSpec.from_dict(row["arch"]), row["context"], row["batch"]).features()


def _predict(coef: Sequence[float], row: dict) -> float:
    """ms of one step by the model ``coef`` (µs per feature unit)."""
    return sum(c * x for c, x in zip(coef, _features(row), strict=True)) * 1e-3


def kv_groups(X: Sequence[Sequence[float]], archs: Sequence[str]) -> list[list[int]]:
    """The KV-cache classes (indices into ``KV_HEAD_DIMS``) fitted with one cost each: a class with
    bytes in at least ``MIN_ARCHS_PER_KV_CLASS`` architectures stands alone, one with fewer joins
    the nearest that does (the larger head dim on a tie), so a head dim the rows barely saw is
    not fitted to noise or left free; if none does, every class shares one cost."""
    seen = [len({a for x, a in zip(X, archs, strict=True) if x[col] > 0}) for col in _KV]
    alone = [k for k, n in enumerate(seen) if n >= MIN_ARCHS_PER_KV_CLASS]
    if not alone:
        return [list(range(len(KV_HEAD_DIMS)))]
    groups: dict[int, list[int]] = {k: [] for k in alone}
    for k in range(len(KV_HEAD_DIMS)):
        groups[min(alone, key=lambda a: (abs(a - k), -a))].append(k)
    return [groups[k] for k in alone]


def _fit(X: Sequence[Sequence[float]], t: Sequence[float], archs: Sequence[str]) -> list[float]:
    """``nnls_relative`` with the KV-cache columns pooled by ``kv_groups``, expanded back to
    ``DECODE_FEATURES`` order (each class of a group gets the group's cost)."""
    groups = kv_groups(X, archs)
    first, last = _KV[0], _KV[-1] + 1

    def pooled(x: Sequence[float]) -> list[float]:
        return [*x[:first], *(sum(x[first + k] for k in g) for g in groups), *x[last:]]

    c = nnls_relative([pooled(x) for x in X], t)
    kv = [0.0] * len(KV_HEAD_DIMS)
    for g, cost in zip(groups, c[first : first + len(groups)], strict=True):
        for k in g:
            kv[k] = cost
    return [*c[:first], *kv, *c[first + len(groups) :]]


def fit_decode(rows: Sequence[dict], *, folds: int = CV_FOLDS, seed: int = 0) -> tuple[list[float], dict[str, Any]]:
    """The decode model's coefficients (``DECODE_FEATURES``: µs per launch, per MiB of weights,
    of KV cache by head dim, of state) from timing rows (rows with an error are skipped) and its
    report: the fit's own errors, the cross-validated held-out errors by architecture
    (``check_summary`` overall and per context), and ``interval``, the 95th percentile of
    |held-out error|."""
    good = [r for r in rows if "ms" in r and r["ms"] > 0]
    if len(good) < len(DECODE_FEATURES):
        raise ValueError(f"fit_decode: need at least {len(DECODE_FEATURES)} timed rows, got {len(good)}")
    X = [_features(r) for r in good]
    t = [r["ms"] * 1e3 for r in good]
    archs = [json.dumps(r["arch"], sort_keys=True) for r in good]
    coef = _fit(X, t, archs)
    report: dict[str, Any] = {
        "rows": len(good),
        "fit": check_summary([_predict(coef, r) for r in good], [r["ms"] for r in good]),
    }
    names = sorted(set(archs))
    if len(names) >= folds:
        random.Random(seed).shuffle(names)
        fold_of = {a: i % folds for i, a in enumerate(names)}
        predicted = [math.nan] * len(good)
        for f in range(folds):
            train = [i for i, a in enumerate(archs) if fold_of[a] != f]
            c = _fit([X[i] for i in train], [t[i] for i in train], [archs[i] for i in train])
            for i, a in enumerate(archs):
                if fold_of[a] == f:
                    predicted[i] = _predict(c, good[i])
        measured = [r["ms"] for r in good]
        report["cv"] = {"all": check_summary(predicted, measured)}
        for context in sorted({r["context"] for r in good}):
            idx = [i for i, r in enumerate(good) if r["context"] == context]
            report["cv"][str(context)] = check_summary([predicted[i] for i in idx], [measured[i] for i in idx])
        widths = interval_widths(relative_errors(predicted, measured))
        report["interval"] = finite_interval(quantile(widths, INTERVAL_QUANTILE))
    return coef, report


def decode_section(coef: Sequence[float], report: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The ``calibrated.decode_model`` entry: coefficients in ``DECODE_FEATURES`` order, interval,
    the decode kernels' fingerprint, GPU, date, the number of rows and the held-out check."""
    from ._measure import decode_fingerprint

    def rounded(v: Any) -> Any:
        if isinstance(v, float):
            return float(f"{v:.4g}")
        return {k: rounded(x) for k, x in v.items()} if isinstance(v, dict) else v

    if "interval" not in report:
        raise ValueError("decode_section: the fit has no held-out interval (too few architectures)")
    return {
        "coefficients": [float(f"{c:.4g}") for c in coef],
        "interval": rounded(report["interval"]),
        "kernels_fingerprint": decode_fingerprint(),
        "date": env["date"],
        "gpu": env["gpu"],
        "rows": report["rows"],
        "check": rounded(report.get("cv", {})),
    }


def write_decode(profile: HardwareProfile, section: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """The profile with its ``calibrated.decode_model`` set to ``section`` (the rest kept)."""
    return write_calibration(profile, {"decode_model": section}, out)


def calibrate_decode(
    profile_name: str | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    archs: int = 36,
    seed: int = 7,
    budget_s: float = 240.0,
    rows_out: str | os.PathLike[str] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Measure, fit and write the decode model (module docstring); returns the path and report.
    ``rows_out``: also write the timing rows there (JSON) to refit later."""
    from hardware_profiles import detect_profile

    say = on_progress or (lambda _: None)
    import torch

    if not torch.cuda.is_available():
        raise CalibrationError("calibrate needs a CUDA GPU; this machine has none")
    profile = load_profile(profile_name) if profile_name is not None else detect_profile()
    if profile is None:
        raise CalibrationError(f"no shipped profile lists this GPU ({torch.cuda.get_device_name()!r}); pass --profile")
    require_gpu(profile)
    deadline = time.monotonic() + budget_s
    models = [(a, b, n) for a in decode_archs(seed, archs) for b, n in DECODE_SHAPES]
    say(f"measuring {len(models)} decode steps")
    rows = measure_decodes(models, deadline=deadline)
    env = environment()
    if rows_out is not None:
        Path(rows_out).write_text(json.dumps({**env, "seed": seed, "decode_rows": rows}, indent=1, default=str))
    coef, report = fit_decode(rows)
    left_out = budget_cut({"decode steps": (models, rows)})
    if left_out:
        report["left_out"] = left_out
        n, total = left_out["decode steps"]
        say(f"the {budget_s:.0f} s budget left out {n} of {total} decode steps: the fit used the rest")
    path = write_decode(profile, decode_section(coef, report, env), out or profile.path)
    return path, report
