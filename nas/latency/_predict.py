"""Latency prediction: the calibrated per-kernel cost model, with an interval; roofline without one.

``predict`` picks, in order:

1. **calibrated** — the profile's own ``calibrated.kernel_model`` (written by ``nas profiles
   calibrate`` on that GPU, ``nas.latency.calibrate``): the forward's kernel launches
   (``_launches``) costed by the fitted model (``_model``). Interval: the calibration's own,
   the 95th percentile of |measured / predicted - 1| on architectures the fit never saw. Label
   ``predicted (h200, calibrated 2026-12-01, ±N %)``.
2. **transferred** — a profile never calibrated on its own GPU borrows the model of a calibrated
   shipped profile (``reference_profile``: one fitted on the kernels this checkout runs),
   rescaled by datasheet ratios (``KernelModel.transfer``: launch overhead, SM count, bf16 and
   fp32 peaks, bandwidth) with features recomputed for its SM count. Tile choices, occupancy and
   achieved fractions differ between GPU generations in ways ratios do not capture, so the
   interval is widened (``transfer_interval``): to the error a
   transfer was measured to make between two GPUs of the same compute capability
   (``MEASURED_TRANSFER_INTERVAL``; basis ``checked within sm_90``), and where none was measured,
   by ``TRANSFER_WIDENING`` (at least ``TRANSFER_MIN_INTERVAL``; basis ``unchecked``).
   Label ``predicted (transferred from h200, unchecked, ±N %)``.
3. **uncalibrated** — no model anywhere, or a dtype the model was not fitted for (it is fitted
   for 16-bit activations): per-op roofline ``max(compute, memory) + launches`` with the
   profile's fractions (below), interval ``UNCALIBRATED_INTERVAL``.

A calibration whose ``kernels_fingerprint`` differs from the current kernels' is still used, with
a warning naming both fingerprints and the interval multiplied by ``FINGERPRINT_WIDENING`` — but
for a transfer measured between exactly these fingerprints (``MEASURED_TRANSFER_KERNELS``), whose
measured interval already holds the staleness: only a note names them.

An interval holds where it was checked. A shape past the calibration's checked range (the
forward: a longer sequence or more tokens than its cross-validation shapes, e.g. a prefill at 32K
against checks up to 8×1024; decode: a longer context than its checked contexts) is still
predicted, with the interval multiplied by ``EXTRAPOLATION_WIDENING`` at the edge of the range
plus ``EXTRAPOLATION_WIDENING_PER_DOUBLING`` for each doubling past it (``_extrapolation``),
``extrapolated`` in the basis and a note naming the checked range.

Precision fields (fp8 KV cache, bf16 state, fp8 weights): a decode step is predicted at them
(``decode_work`` counts the stored bytes and the fp8 linears' quantize launches, as
``StoredDecoder`` runs them), with costs per byte and per launch fitted on full-precision steps, so
the interval is multiplied by ``STORED_WIDENING`` and a note says so until calibration rows are
timed at those dtypes. A forward is predicted at the kernels' own dtypes (no forward kernel stores
them narrower) and says so (``unpriced_precision``: a note, and ``not priced at kv fp8`` in its label).

Roofline details: each op of ``op_costs`` takes ``max(flops / (peak · f_flops), bytes /
(bandwidth · f_bw)) + kernels · launch_overhead``; matmul ops use the dtype's tensor-core peak,
the others the fp32 vector peak; the fractions come from the profile's ``calibrated:`` section
or default to ``DEFAULT_FLOPS_FRACTION`` / ``DEFAULT_BANDWIDTH_FRACTION``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import warnings

from hardware_profiles import HardwareProfile, list_profiles, load_profile
from nas.spec import ArchSpec

from ._costs import op_costs
from ._decode import ALIGNED_DECODE_FEATURES, DECODE_FEATURES, DECODE_KINDS, decode_work, expand_coefficients
from ._launches import launches
from ._model import KernelModel
from ._result import STORED_NOTE, Latency, unpriced_precision
from ._shape import LatencyShape, parse_shape

__all__ = [
    "reference_profile",
    "DEFAULT_BANDWIDTH_FRACTION",
    "DEFAULT_FLOPS_FRACTION",
    "FINGERPRINT_WIDENING",
    "TRANSFER_MIN_INTERVAL",
    "TRANSFER_WIDENING",
    "MEASURED_TRANSFER_INTERVAL",
    "MEASURED_TRANSFER_KERNELS",
    "UNCALIBRATED_INTERVAL",
    "EXTRAPOLATION_WIDENING",
    "EXTRAPOLATION_WIDENING_PER_DOUBLING",
    "CalibrationWarning",
    "PredictionStatus",
    "predict",
    "prediction_status",
    "predict_decode",
    "transfer_interval",
    "measured_as_is",
    "transfer_ratios",
]

log = logging.getLogger(__name__)

# Uncalibrated guesses: large well-tuned GEMMs reach roughly 60-75 % of datasheet tensor peak,
# streaming kernels roughly 80-90 % of datasheet bandwidth. Replaced by measured fractions.
DEFAULT_FLOPS_FRACTION = 0.6
DEFAULT_BANDWIDTH_FRACTION = 0.8
# The roofline's error on the H200 (docs/benchmarks.md, predictor: the "uncalibrated"
# baseline: 95th percentile of |predicted / measured - 1| over the held-out architectures).
UNCALIBRATED_INTERVAL = 0.75
TRANSFER_WIDENING = 3.0  # a guess for a transfer no one measured: see the module docstring
TRANSFER_MIN_INTERVAL = 0.25
# A transfer's measured error between two GPUs of one compute capability, per (major, minor): the
# 95th percentile of |measured / predicted - 1| over held-out rows timed on one GPU and predicted
# from the other's calibration ("forward", "decode"; benchmarks/results/predictor_<gpu>.json,
# "transferred"). Between capabilities nothing has been measured: TRANSFER_WIDENING's guess.
# sm_90: the H200's calibration predicting 2100 forwards timed on nine H100 leases, the largest
# per-shape 95th percentile (held_out_rows of predictor_rows_h100.json and _lease2, 3, 4, 5, 7, 9,
# 10 and 11.json), and 800 decode steps of the first seven of them (their held_out_decode_rows: the
# two later leases' steps lower the pooled percentile, which would then cover under 90 % of the
# first two leases' steps, so it is not narrowed; docs/benchmarks.md). The H200's calibration was
# of the kernels before the padding, so the measurement includes that staleness:
# MEASURED_TRANSFER_KERNELS (the decode steps were timed as 430a1f420a98, the same timed code as
# 1eabd3ce9739 once the linear's route rules left the decode fingerprint; the forwards as
# 32f067645229, before the wide readouts moved to cuBLAS: the rows that move were the worst
# predicted, and their new route is not yet in the measurement, so the interval is kept as measured).
MEASURED_TRANSFER_INTERVAL: dict[tuple[int, int], dict[str, float]] = {(9, 0): {"forward": 0.346, "decode": 0.385}}
# the kernels fingerprints of that measurement, per capability and kind: (the source's calibration,
# the kernels timed). A transfer between exactly these is the one measured, so a source calibrated
# on other kernels than today's is not widened again by FINGERPRINT_WIDENING.
MEASURED_TRANSFER_KERNELS: dict[tuple[int, int], dict[str, tuple[str, str]]] = {
    (9, 0): {"forward": ("decb64fb5d42", "783b34b9bf53"), "decode": ("3f5f5aacafc8", "1eabd3ce9739")}
}
FINGERPRINT_WIDENING = 2.0
# a guess, like TRANSFER_WIDENING: a decode step at a stored precision is priced by costs fitted at full precision
STORED_WIDENING = 2.0
EXTRAPOLATION_WIDENING = 2.0  # a guess, like TRANSFER_WIDENING: past the checked shapes nothing was measured
# the further past, the less the check says: the interval widens with every doubling past the checked shape
EXTRAPOLATION_WIDENING_PER_DOUBLING = 1.0
_MODEL_DTYPES = ("bf16", "fp16")


class CalibrationWarning(UserWarning):
    """A calibration is used for kernels other than the ones it was fitted on."""


def _flops_per_s(profile: HardwareProfile, dtype: str) -> float:
    fraction = profile.calibrated.flops_fraction(dtype)
    return profile.peak_flops(dtype) * (DEFAULT_FLOPS_FRACTION if fraction is None else fraction)


def _roofline(arch: ArchSpec, shape: LatencyShape, profile: HardwareProfile, dtype: str) -> list[tuple[str, float]]:
    ops = op_costs(arch, shape, dtype=dtype)  # validates dtype
    matmul_rate = _flops_per_s(profile, dtype)
    vector_rate = _flops_per_s(profile, "fp32")
    bandwidth_fraction = profile.calibrated.bandwidth_fraction
    bandwidth = profile.bandwidth_bytes_per_s * (
        DEFAULT_BANDWIDTH_FRACTION if bandwidth_fraction is None else bandwidth_fraction
    )
    launch_us = profile.calibrated.launch_overhead_us or profile.launch_overhead_us
    breakdown = []
    for op in ops:
        compute = op.flops / (matmul_rate if op.matmul else vector_rate)
        seconds = max(compute, op.bytes / bandwidth) + op.kernels * launch_us * 1e-6
        breakdown.append((op.name, seconds * 1e3))
    return breakdown


@functools.lru_cache(maxsize=16)
def _model(kernel_model_json: str) -> KernelModel:
    return KernelModel.from_dict(json.loads(kernel_model_json))


@functools.cache
def _calibrated_reference() -> HardwareProfile | None:
    """What other profiles are transferred from: of the shipped profiles with a kernel model, one
    fitted on the kernels this checkout runs if any, then the most recent, then by name."""
    from ._measure import kernels_fingerprint

    fitted = [p for p in map(load_profile, list_profiles()) if p.calibrated.kernel_model_json is not None]
    if not fitted:
        return None
    current = kernels_fingerprint()

    def rank(p: HardwareProfile) -> tuple[bool, str]:
        return p.calibrated.get("kernels_fingerprint") == current, str(p.calibrated.get("date") or "")

    best = max(rank(p) for p in fitted)
    return next(p for p in fitted if rank(p) == best)


def reference_profile() -> HardwareProfile | None:
    """The shipped profile other profiles are transferred from (a calibration of the kernels this
    checkout runs if any, then the most recent), or None where no shipped profile is calibrated."""
    return _calibrated_reference()


def transfer_ratios(source: HardwareProfile, target: HardwareProfile) -> dict[str, float]:
    """Per feature kind (``_launches.KINDS``), the factor from ``source``'s coefficients to
    ``target``'s: launch and per-wave latency by the nominal launch overheads; per-SM tensor and
    vector work by SMs / peak (bf16, fp32); bytes by bandwidth."""
    per_sm = {
        dtype: (target.sm_count / target.peak_flops(dtype)) / (source.sm_count / source.peak_flops(dtype))
        for dtype in ("bf16", "fp32")
    }
    launch = target.launch_overhead_us / source.launch_overhead_us
    return {
        "launch": launch,
        "wave": launch,
        "tensor": per_sm["bf16"],
        "vector": per_sm["fp32"],
        "bytes": source.bandwidth_bytes_per_s / target.bandwidth_bytes_per_s,
    }


def transfer_interval(
    source: HardwareProfile, target: HardwareProfile, interval: float, *, decode: bool = False
) -> tuple[float, str]:
    """The interval of ``source``'s calibration (its own ``interval``) transferred to ``target``,
    and how it was set: ``"checked within sm_90"`` where a transfer between GPUs of that compute
    capability was measured (``MEASURED_TRANSFER_INTERVAL``, never narrower than the source's own),
    else ``"unchecked"`` (``TRANSFER_WIDENING`` × the source's, at least ``TRANSFER_MIN_INTERVAL``)."""
    cap = target.compute_capability
    same = cap is not None and cap == source.compute_capability
    measured = MEASURED_TRANSFER_INTERVAL.get(cap, {}) if same else {}
    key = "decode" if decode else "forward"
    if key in measured:
        return max(measured[key], interval), f"checked within sm_{cap[0]}{cap[1]}"
    return max(TRANSFER_MIN_INTERVAL, TRANSFER_WIDENING * interval), "unchecked"


def measured_as_is(
    source: HardwareProfile, target: HardwareProfile, calibrated: str | None, current: str, *, decode: bool = False
) -> bool:
    """Whether a transfer from ``source`` (calibrated on kernels ``calibrated``) to ``target``, run on
    kernels ``current``, is the very one ``MEASURED_TRANSFER_INTERVAL`` measured: then its interval
    already holds the source's staleness and is not widened for the fingerprint."""
    cap = target.compute_capability
    if cap is None or cap != source.compute_capability or source.name == target.name:
        return False
    return MEASURED_TRANSFER_KERNELS.get(cap, {}).get("decode" if decode else "forward") == (calibrated, current)


@functools.cache
def _warn_fingerprint(profile: str, calibrated: str, current: str) -> None:
    message = (
        f"the {profile} latency calibration was fitted on kernels {calibrated}, these are {current}: "
        f"predictions use it with a {FINGERPRINT_WIDENING:g}x wider interval; run `nas profiles calibrate` "
        f"on that GPU to refit"
    )
    warnings.warn(message, CalibrationWarning, stacklevel=3)
    log.warning(message)


def _widening(
    source: HardwareProfile, target: HardwareProfile, calibrated: str | None, current: str, *, decode: bool
) -> float:
    """``FINGERPRINT_WIDENING`` where ``source``'s calibration was fitted on kernels ``calibrated``
    other than ``current``, except for a transfer measured as is (``measured_as_is``), whose
    interval already holds that staleness; else 1."""
    if (
        calibrated is None
        or calibrated == current
        or measured_as_is(source, target, calibrated, current, decode=decode)
    ):
        return 1.0
    return FINGERPRINT_WIDENING


def _fingerprint_check(
    source: HardwareProfile, target: HardwareProfile, *, decode: bool = False
) -> tuple[float, tuple[tuple[str, str], ...]]:
    """(widening, notes) for predicting ``target`` from ``source``'s calibration (forward, or its
    decode model): a stale calibration is noted, and widened with a warning (``_widening``; a
    transfer measured as is is neither widened nor warned about)."""
    from ._measure import decode_fingerprint, kernels_fingerprint

    if decode:
        calibrated, current = (source.calibrated.decode_model or {}).get("kernels_fingerprint"), decode_fingerprint()
    else:
        calibrated, current = source.calibrated.get("kernels_fingerprint"), kernels_fingerprint()
    if calibrated is None or calibrated == current:
        return 1.0, ()
    widen = _widening(source, target, calibrated, current, decode=decode)
    if widen != 1.0:
        _warn_fingerprint(f"{source.name} decode" if decode else source.name, calibrated, current)
    return widen, (("kernels_fingerprint", f"calibrated {calibrated}, current {current}"),)


def _forward_range(source: HardwareProfile, shape: LatencyShape) -> tuple[float, tuple[tuple[str, str], ...]]:
    """(widening, notes) for ``shape`` against the forward calibration's cross-validation shapes."""
    checked = []
    for key in source.calibrated.check.get("cross_validation", {}):
        try:
            checked.append(parse_shape(key))
        except ValueError:  # "all" and other summaries
            continue
    if not checked:
        return 1.0, ()
    longest, most = max(c.seq_len for c in checked), max(c.tokens for c in checked)
    if shape.seq_len <= longest and shape.tokens <= most:
        return 1.0, ()
    note = f"{shape} is past the checked shapes (sequences <= {longest}, tokens <= {most})"
    return _extrapolation(max(shape.seq_len / longest, shape.tokens / most), note)


def _decode_range(model: dict, context: int) -> tuple[float, tuple[tuple[str, str], ...]]:
    """(widening, notes) for ``context`` against the decode calibration's checked contexts."""
    contexts = [int(k) for k in model.get("check", {}) if str(k).isdigit()]
    if not contexts or context <= max(contexts):
        return 1.0, ()
    return _extrapolation(context / max(contexts), f"context {context} is past the checked {max(contexts)}")


def _extrapolation(ratio: float, note: str) -> tuple[float, tuple[tuple[str, str], ...]]:
    """(widening, notes) for a shape ``ratio`` (> 1) times the largest checked one: the widening
    at the edge, growing by ``EXTRAPOLATION_WIDENING_PER_DOUBLING`` per doubling past it."""
    widening = EXTRAPOLATION_WIDENING + EXTRAPOLATION_WIDENING_PER_DOUBLING * math.log2(ratio)
    return widening, (("extrapolated", f"{note}; {ratio:.3g}x past it, interval x{widening:.3g}"),)


def predict(
    arch: ArchSpec,
    shape: LatencyShape,
    profile: HardwareProfile,
    *,
    dtype: str = "bf16",
    reference: HardwareProfile | None | str = "auto",
) -> Latency:
    """Predicted inference-forward latency of ``arch`` at ``shape`` on ``profile``, with an interval.

    ``reference``: the calibrated profile an uncalibrated one is transferred from — ``"auto"``
    (the shipped calibrated profile), a profile, or None (no transfer: roofline). The breakdown
    gives each kernel's (or, uncalibrated, each op's) ms in execution order; they sum to
    ``median_ms``.
    """
    op_costs(arch, shape, dtype=dtype)  # validates dtype
    source = (
        profile
        if profile.calibrated.kernel_model_json is not None
        else (_calibrated_reference() if reference == "auto" else reference)
    )
    if isinstance(source, str):
        raise ValueError(f"reference must be 'auto', a HardwareProfile or None, got {source!r}")
    if source is not None and source.calibrated.kernel_model_json is not None and dtype in _MODEL_DTYPES:
        model = _model(source.calibrated.kernel_model_json)
        try:
            work = launches(arch, shape, profile.sm_count)
        except ValueError:  # a head dim no kernel runs: only the roofline can say anything
            work = []
        if work and model.covers(work):
            widen, notes = _fingerprint_check(source, profile)
            outside, beyond = _forward_range(source, shape)
            widen, notes = widen * outside, notes + beyond
            interval = source.calibrated.interval or 0.0
            if source is profile:
                date = source.calibrated.get("date")
                basis = f"{profile.name}, calibrated {date}" if date else f"{profile.name}, calibrated"
            else:
                model = model.transfer(transfer_ratios(source, profile))
                interval, checked = transfer_interval(source, profile, interval)
                basis = f"transferred from {source.name}, {checked}"
            basis += ", extrapolated" if beyond else ""
            breakdown = [(launch.name, model.launch_us(launch) * 1e-3) for launch in work]
            if overhead := model.overhead_us(shape.tokens):
                breakdown.append(("graph", overhead * 1e-3))
            found = _predicted(profile, dtype, shape, breakdown, interval * widen, basis, notes)
            return unpriced_precision(found, arch)
    roofline = _roofline(arch, shape, profile, dtype)
    return unpriced_precision(_predicted(profile, dtype, shape, roofline, UNCALIBRATED_INTERVAL, "uncalibrated"), arch)


@functools.cache
def _decode_reference() -> HardwareProfile | None:
    """The first shipped profile (by name) with a decode model: what others are transferred from."""
    for name in list_profiles():
        profile = load_profile(name)
        if profile.calibrated.decode_model_json is not None:
            return profile
    return None


def predict_decode(
    arch: ArchSpec,
    batch: int,
    context: int,
    profile: HardwareProfile,
    *,
    dtype: str = "bf16",
    reference: HardwareProfile | None | str = "auto",
) -> Latency:
    """Predicted latency of one decoding step (one token for each of ``batch`` sequences holding
    ``context`` tokens) of ``arch`` on ``profile``, with an interval; ``kind`` "decode", shape
    ``batch x context``.

    The step is memory-bound (``nas.latency._decode``): calibrated, it costs the fitted µs per
    launch plus µs per MiB of weights, KV cache (per head dim) and state, and the unaligned rows' extra
    (``calibrated.decode_model``, fitted by
    ``nas profiles calibrate``; interval: its held-out 95th percentile); transferred from the
    calibrated profile, launches scale by the nominal launch overheads and bytes by bandwidth
    (interval widened as for the forward); uncalibrated, launches × the launch overhead plus all
    bytes at the profile's bandwidth fraction (``UNCALIBRATED_INTERVAL``).
    """
    work = decode_work(arch, context, batch, dtype=dtype)  # validates context, batch, dtype
    shape = LatencyShape(batch, context)
    source = (
        profile
        if profile.calibrated.decode_model_json is not None
        else (_decode_reference() if reference == "auto" else reference)
    )
    if isinstance(source, str):
        raise ValueError(f"reference must be 'auto', a HardwareProfile or None, got {source!r}")
    features = work.features()
    if source is not None and source.calibrated.decode_model_json is not None and dtype in _MODEL_DTYPES:
        model = source.calibrated.decode_model
        coef = expand_coefficients([float(c) for c in model["coefficients"]])
        interval = float(model["interval"])
        widen, notes = _fingerprint_check(source, profile, decode=True)
        outside, beyond = _decode_range(model, context)
        widen, notes = widen * outside, notes + beyond
        if source is profile:
            date = model.get("date")
            basis = f"{profile.name}, calibrated {date}" if date else f"{profile.name}, calibrated"
        else:
            ratios = transfer_ratios(source, profile)
            coef = [c * ratios[kind] for c, kind in zip(coef, DECODE_KINDS, strict=True)]
            interval, checked = transfer_interval(source, profile, interval, decode=True)
            basis = f"transferred from {source.name}, {checked}"
        basis += ", extrapolated" if beyond else ""
        breakdown = [(name, c * x * 1e-3) for name, c, x in zip(DECODE_FEATURES, coef, features, strict=True)]
        found = _predicted(profile, dtype, shape, breakdown, interval * widen, basis, notes, kind="decode")
        return _at_stored_precision(found, arch)
    fraction = profile.calibrated.bandwidth_fraction or DEFAULT_BANDWIDTH_FRACTION
    us_per_mib = 2**20 / (profile.bandwidth_bytes_per_s * fraction) * 1e6
    launch_us = profile.calibrated.launch_overhead_us or profile.launch_overhead_us
    coef = [launch_us, *(us_per_mib for _ in ALIGNED_DECODE_FEATURES[1:])]
    coef += [0.0] * (len(DECODE_FEATURES) - len(coef))  # the unaligned rows' extra cost is unknown here
    breakdown = [(name, c * x * 1e-3) for name, c, x in zip(DECODE_FEATURES, coef, features, strict=True)]
    found = _predicted(profile, dtype, shape, breakdown, UNCALIBRATED_INTERVAL, "uncalibrated", kind="decode")
    return _at_stored_precision(found, arch)


def _at_stored_precision(latency: Latency, arch: ArchSpec) -> Latency:
    """A decode prediction of an architecture below full precision: its interval widened by
    ``STORED_WIDENING`` and a note (``STORED_NOTE``) naming the dtypes priced by full-precision costs."""
    if arch.full_precision:
        return latency
    note = (STORED_NOTE, f"{arch.precision_text()}: priced by costs fitted at full precision")
    return dataclasses.replace(latency, interval=latency.interval * STORED_WIDENING, notes=(*latency.notes, note))


@dataclasses.dataclass(frozen=True)
class PredictionStatus:
    """How ``predict`` (or ``predict_decode``) prices a profile, as ``nas profiles list`` shows it:
    ``kind`` "calibrated" (its own model), "transferred" (``source``'s model, rescaled) or
    "roofline"; ``date`` of the calibration used; ``interval`` at the checked shapes with the
    current kernels (a fingerprint mismatch widens it); ``fingerprint`` "matches" / "differs" (None
    for the roofline, which times no kernel of ours)."""

    kind: str
    source: str | None
    date: str | None
    interval: float
    fingerprint: str | None
    checked: str | None = None  # a transfer's: "checked within sm_90" or "unchecked" (transfer_interval)

    @property
    def label(self) -> str:
        """``calibrated 2026-12-04``, ``transferred from h200 (2026-12-04, unchecked)``, ``roofline``."""
        if self.kind == "calibrated":
            return f"calibrated {self.date}" if self.date else "calibrated"
        if self.kind == "transferred":
            said = ", ".join(x for x in (self.date, self.checked) if x)
            return f"transferred from {self.source}" + (f" ({said})" if said else "")
        return "roofline"


def prediction_status(profile: HardwareProfile, *, decode: bool = False) -> PredictionStatus:
    """What ``predict`` (``decode``: ``predict_decode``) uses for ``profile`` with the default
    reference, and the interval it gives at the shapes its calibration checked (bf16)."""
    if decode:
        own = profile.calibrated.decode_model_json is not None
        source = profile if own else _decode_reference()
        if source is None:
            return PredictionStatus("roofline", None, None, UNCALIBRATED_INTERVAL, None)
        from ._measure import decode_fingerprint

        model = source.calibrated.decode_model or {}
        interval, date = float(model["interval"]), model.get("date")
        calibrated, current = model.get("kernels_fingerprint"), decode_fingerprint()
    else:
        own = profile.calibrated.kernel_model_json is not None
        source = profile if own else _calibrated_reference()
        if source is None:
            return PredictionStatus("roofline", None, None, UNCALIBRATED_INTERVAL, None)
        from ._measure import kernels_fingerprint

        interval, date = source.calibrated.interval or 0.0, source.calibrated.get("date")
        calibrated, current = source.calibrated.get("kernels_fingerprint"), kernels_fingerprint()
    checked = None
    if not own:
        interval, checked = transfer_interval(source, profile, interval, decode=decode)
    matches = calibrated is None or calibrated == current
    interval *= _widening(source, profile, calibrated, current, decode=decode)
    return PredictionStatus(
        "calibrated" if own else "transferred",
        source.name,
        date,
        interval,
        "matches" if matches else f"differs ({calibrated}, now {current})",
        checked,
    )


def _predicted(
    profile: HardwareProfile,
    dtype: str,
    shape: LatencyShape,
    breakdown: list[tuple[str, float]],
    interval: float,
    basis: str,
    notes: tuple = (),
    *,
    kind: str = "forward",
) -> Latency:
    """A prediction: the breakdown's sum, with its interval and what it rests on."""
    return Latency(
        median_ms=sum(ms for _, ms in breakdown),
        iqr_ms=0.0,
        source="predicted",
        device=profile.name,
        dtype=dtype,
        shape=shape,
        breakdown=tuple(breakdown),
        notes=notes,
        interval=interval,
        basis=basis,
        kind=kind,
    )
