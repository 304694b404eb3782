"""The calibrated predictor on the CPU: fitting, intervals and labels, fingerprints, Latency dicts, CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import warnings

import pytest

from hardware_profiles import load_profile
from nas.cli import main
from nas.latency import CalibrationWarning, Latency, _predict, launches, parse_shape, predict
from nas.latency._launches import FEATURES, family
from nas.latency._model import KernelModel, interval_widths
from nas.latency.calibrate import (
    FIT_RANGES,
    FIT_RANGES_V1,
    SHAPES,
    FitRanges,
    KernelCase,
    calibration_section,
    fit,
    kernel_grid,
    random_archs,
    write_calibration,
)
from nas.spec import ArchSpec

SMS = 132
IDENTIFIABLE = (
    "linear.cublas",
    "linear.tma",
    "linear.short_k",
    "attention.sdpa.D64",
    "linear_attention.prefix.D64",
    "linear_attention.two_pass.D32",
    "conv",
)


PLAIN_US = 1.5  # _synthetic's cost of a plain start


def _synthetic(
    seed: int = 0,
    archs: int = 40,
    noise: float = 0.0,
    slower: dict[str, float] | None = None,
    ranges: FitRanges = FIT_RANGES,
) -> tuple[KernelModel, list[dict], list[dict], list[dict]]:
    """Kernel rows timed by a known model; forwards (``random_arch`` over ``ranges``) costed by the
    same model (classes in ``slower`` that much slower inside a forward) + 1.5 µs per plain start +
    5 µs + 0.3 µs per 1000 tokens, times ``exp(N(0, noise))``; a check set from another seed."""
    rng = random.Random(seed)
    cases = kernel_grid()
    classes = sorted({c.launch(SMS).cls for c in cases})
    used = {cls: [False] * len(FEATURES[family(cls)]) for cls in classes}  # features some launch of the class has
    for c in cases:
        launch = c.launch(SMS)
        used[launch.cls] = [u or v != 0 for u, v in zip(used[launch.cls], launch.x, strict=True)]
    # each class's truth from its own stream, so a feature added to one family leaves the others' alone
    truth = KernelModel(
        tuple(
            (cls, tuple(draw.uniform(0.2, 3.0) if u else 0.0 for u in used[cls]))
            for cls in classes
            for draw in [random.Random(f"{seed}:{cls}")]
        )
    )
    kernel_rows = [{"family": c.family, "args": dict(c.args), "us": truth.kernel_us(c.launch(SMS))} for c in cases]
    slower = slower or {}

    def row(arch, shape):
        work = launches(arch, shape, SMS)
        us = sum(slower.get(w.cls, 1.0) * truth.kernel_us(w) + PLAIN_US * w.plain for w in work)
        us += 5.0 + 0.3 * shape.tokens / 1e3
        return {"arch": arch.to_dict(), "shape": str(shape), "ms": us * math.exp(rng.gauss(0.0, noise)) / 1e3}

    fit_rows = [row(a, s) for a in random_archs(1, archs, ranges) for s in SHAPES]
    check_rows = [row(a, s) for a in random_archs(1001, archs, ranges) for s in SHAPES]
    return truth, kernel_rows, fit_rows, check_rows


def test_fit_recovers_known_coefficients():
    """On the first generator's forwards (``FIT_RANGES_V1``) every identifiable class's coefficients
    come back. (The graph gap shares every launch, and the intercept the embedding's one launch per
    forward: only the penalty toward the kernel grid separates them, so a generator whose forwards
    weigh the launches differently may land elsewhere on that ridge at the same predictions: the
    next test checks those. The TMA kernel's launches, which only the 32×512 forwards have, share
    a ridge with the per-token term and the plain starts as well: each within 5-10 %, the other
    coefficients 2 %, the plain starts' gap 5 %.)"""
    truth, kernel_rows, fit_rows, check_rows = _synthetic(ranges=FIT_RANGES_V1)
    model, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    for cls in IDENTIFIABLE:
        got, want = model.coefficient(cls), truth.coefficient(cls)
        assert got[0] == pytest.approx(want[0], rel=0.1 if cls == "linear.tma" else 5e-2, abs=1e-3), cls
        assert got[1:] == pytest.approx(want[1:], rel=2e-2, abs=1e-3), cls
    assert model.intercept_us == pytest.approx(5.0, rel=1e-2)
    assert model.per_ktoken_us == pytest.approx(0.3, rel=0.1)
    assert model.plain_gap_us == pytest.approx(PLAIN_US, rel=5e-2)
    for key in ("cv", "check"):
        assert report[key]["all"]["within_10pct"] == 1.0
    assert report["interval"] < 2e-3  # the ridge's pull toward the grid, on noiseless rows


def test_fit_predicts_the_widened_generators_forwards():
    """The calibration's generator (``FIT_RANGES``: depth to 12, vocab to 50257, widths in steps
    of 8): without noise, forwards the fit never saw, and every shape, are predicted within 1 %."""
    _, kernel_rows, fit_rows, check_rows = _synthetic(archs=60)
    _, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    for shape, summary in report["check"].items():
        assert summary["p95_abs_error"] < 0.01, (shape, summary)
    assert report["cv"]["all"]["p95_abs_error"] < 0.02
    assert report["interval"] < 0.02


def test_the_interval_spans_what_only_the_check_generator_misses():
    """Where the check rows miss and the fit's own rows do not, the interval is the check rows'
    95th percentile: pooled with the cross-validation's many exact rows, 8 misses in 120 check
    rows would fall under it."""
    _, kernel_rows, fit_rows, check_rows = _synthetic(archs=40)
    slow = [{**r, "ms": r["ms"] * 1.25} if i < 8 else r for i, r in enumerate(check_rows)]
    _, exact = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    _, report = fit(kernel_rows, fit_rows, slow, sm_count=SMS)
    assert exact["interval"] < 0.01 and report["cv"]["all"]["p95_abs_error"] < 0.01
    assert report["interval"] == pytest.approx(0.25, rel=0.05)  # measured 25 % over: predicted x 1.25 spans it


def test_each_generator_bounds_the_interval_on_its_own():
    """Rows tagged with the generator that drew them set the interval per generator: where one
    generator's rows miss and the others' do not, the interval is that generator's 95th percentile,
    which pooled with them would fall under; a generator with too few rows counts with the untagged."""
    from nas.latency.calibrate import MIN_GENERATOR_ROWS

    _, kernel_rows, fit_rows, other = _synthetic(archs=40)  # other: the check seed's draws, as a second generator
    # a tenth of the second generator's architectures (every shape) 25 % slower than the model says
    slow = {json.dumps(r["arch"], sort_keys=True) for r in other[:: 3 * 10]}
    other = [{**r, "ms": r["ms"] * 1.25} if json.dumps(r["arch"], sort_keys=True) in slow else r for r in other]
    _, pooled = fit(kernel_rows, fit_rows + other, sm_count=SMS)
    tagged = [{**r, "generator": "a"} for r in fit_rows] + [{**r, "generator": "b"} for r in other]
    _, report = fit(kernel_rows, tagged, sm_count=SMS)
    spans = report["interval_by_generator"]
    assert set(spans) == {"a", "b"} and report["interval"] == spans["b"]
    assert spans["b"] > 0.2 > 0.1 > spans["a"] and report["interval"] > pooled["interval"] + 0.05
    assert set(pooled["interval_by_generator"]) == {"pooled"}
    few = [{**r, "generator": "c"} if i < MIN_GENERATOR_ROWS - 1 else r for i, r in enumerate(tagged)]
    _, small = fit(kernel_rows, few, sm_count=SMS)
    assert "c" not in small["interval_by_generator"] and "pooled" in small["interval_by_generator"]


def test_forward_fit_moves_a_class_off_its_kernel_timing():
    """A class 30 % slower inside a forward than on the kernel grid is refitted; a strong pull
    toward the kernel grid keeps the grid's coefficients."""
    truth, kernel_rows, fit_rows, check_rows = _synthetic(archs=60, slower={"linear.cublas": 1.3})
    model, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    pinned, pinned_report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS, strength=1e6)
    routed = [
        w
        for r in check_rows
        for w in launches(ArchSpec.from_dict(r["arch"]), parse_shape(r["shape"]), SMS)
        if w.cls == "linear.cublas"
    ]
    truth_us = sum(truth.kernel_us(w) for w in routed)
    assert sum(model.kernel_us(w) for w in routed) == pytest.approx(1.3 * truth_us, rel=0.03)
    assert sum(pinned.kernel_us(w) for w in routed) == pytest.approx(truth_us, rel=1e-3)
    assert report["check"]["all"]["within_10pct"] == 1.0
    assert pinned_report["interval"] > report["interval"]


def test_interval_covers_the_stated_share_of_held_out_errors():
    """Measured times with 4 % log-normal noise: the interval (from cross-validated residuals,
    not the fit's own) must cover about 95 % of forwards the fit never saw, and stay within a
    small multiple of the noise's own 95th percentile (7.8 %; the rest is the fit's error with
    240 forwards for ~100 coefficients; with 120, since the cuBLAS route's class carries most of
    the forwards' linear time, the held-out error reached 20 %: fitted noise, not model error;
    with 180, coverage 89 % once the padded widths moved more launches to the TMA class)."""
    _, kernel_rows, fit_rows, check_rows = _synthetic(archs=80, noise=0.04)
    model, report = fit(kernel_rows, fit_rows, sm_count=SMS)
    errors = [
        model.forward_us(
            launches(ArchSpec.from_dict(r["arch"]), parse_shape(r["shape"]), SMS), parse_shape(r["shape"]).tokens
        )
        / 1e3
        / r["ms"]
        - 1
        for r in check_rows
    ]
    covered = sum(w <= report["interval"] for w in interval_widths(errors)) / len(errors)
    assert 0.90 <= covered, (covered, report["interval"])
    assert report["interval"] < 4 * 0.04


def test_interval_includes_the_shift_between_runs():
    """Two GPU runs 6 % apart: each run predicted by the fit on the other is part of the interval.
    With every forward in both runs, cross-validation alone (the fit sees both runs) puts the
    interval near 3 %; with the across-runs residuals it is near the 6 % shift."""
    _, kernel_rows, fit_rows, _ = _synthetic(archs=40)
    runs = [{**r, "run": "a"} for r in fit_rows[:60]] + [{**r, "ms": r["ms"] * 1.06, "run": "b"} for r in fit_rows[60:]]
    _, report = fit(kernel_rows, runs, sm_count=SMS)
    assert set(report["across_runs"]) == {"a", "b"}
    assert report["interval"] > 0.04
    both = [{**r, "run": "a"} for r in fit_rows] + [{**r, "ms": r["ms"] * 1.06, "run": "b"} for r in fit_rows]
    _, report = fit(kernel_rows, both, sm_count=SMS)
    assert report["interval"] > 0.05


def test_check_summary_ratio_is_predicted_over_measured():
    from nas.latency.calibrate import check_summary

    s = check_summary([1.05, 2.1, 3.0], [1.0, 2.0, 3.0])
    assert s["median_ratio"] == pytest.approx(1.05) and s["n"] == 3 and s["within_10pct"] == 1.0
    assert check_summary([1.2], [1.0])["within_10pct"] == 0.0  # 20 % over


def test_fit_sees_a_wrong_kernel_model():
    """Timings from another cost law must not fit: the held-out errors report it."""
    truth, kernel_rows, fit_rows, check_rows = _synthetic()
    for r in fit_rows[: len(fit_rows) // 2]:
        r["ms"] *= 1.5  # half the forwards 50 % slower than their kernels say
    _, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    assert report["interval"] > 0.05


def test_two_pass_launch_class_follows_the_rule():
    """The identity map's launch is class ``linear_attention.two_pass.D*`` exactly where sm_90's
    rule takes the two passes (two launches in one group, three with the carry scan; the pass-1
    walk over a group's chunks), and the kernel grid times that class."""
    from kernels.linear_attention import configs
    from nas.spec import LayerSpec

    D, heads = 32, 2
    layer = LayerSpec("linear_attention", heads=heads, feature_map="identity")
    arch = ArchSpec(d_model=heads * D, layers=(layer,), vocab_size=64, n_out=64)

    def mixer(shape: str, arch: ArchSpec = arch):
        return next(w for w in launches(arch, parse_shape(shape), SMS) if w.cls.startswith("linear_attention"))

    batch, length = 128 // heads, 2048  # a full grid over long rows: the fused kernel's until 2026-12-04
    full, below = mixer(f"{batch}x{length}"), mixer(f"{batch}x{length - 1}")
    assert full.cls == below.cls == f"linear_attention.two_pass.D{D}"
    launch = configs.TWO_PASS_HOPPER[D][0]
    chunks = -(-(length - 1) // launch.chunk)  # 128 state blocks keep enough SMs busy for one group
    assert below.x[0] == 2.0 and below.x[5] == 0.0 and below.x[2] == chunks * D / 64
    grouped = mixer("1x4097")  # 2 state blocks: pass 1 in groups, the carry scan between the passes
    group = configs.two_pass_group(2, -(-4097 // launch.chunk), SMS)
    assert grouped.x[0] == 3.0 and grouped.x[5] > 0 and grouped.x[2] == group * D / 64
    assert group < chunks
    narrow = ArchSpec(d_model=heads * 16, layers=(layer,), vocab_size=64, n_out=64)  # D 16: fused, not measured
    assert mixer(f"{batch}x{length}", narrow).cls == "linear_attention.D16"
    grid = {c.launch(SMS).cls for c in kernel_grid()}
    assert {f"linear_attention.{r}.D{D}" for r in ("two_pass", "prefix") for D in (32, 64, 128)} <= grid


def test_prefix_and_normalized_launches_follow_the_rule():
    """Where ``forward_route`` takes the prefix forward the launch is one of class
    ``linear_attention.prefix.D*`` (its critical path the longest prefix, nc - 1 chunks); a
    normalized map on the two passes is of the two-pass class with its φ on pass 2's waves; the
    kernel grid times both, for every map."""
    from kernels.linear_attention import configs
    from nas.spec import LayerSpec

    def mixer(fm: str, heads: int, D: int, shape: str):
        layer = LayerSpec("linear_attention", heads=heads, feature_map=fm)
        arch = ArchSpec(d_model=heads * D, layers=(layer,), vocab_size=64, n_out=64)
        return next(w for w in launches(arch, parse_shape(shape), SMS) if w.cls.startswith("linear_attention"))

    for fm in ("identity", "elu+1", "relu"):
        short = mixer(fm, 4, 64, "1x256")
        assert configs.forward_route((9, 0), 4, 256, 64, fm) == "prefix"
        assert short.cls == "linear_attention.prefix.D64" and short.x[0] == 1.0 and short.x[2] == 3.0
        assert (short.x[3] > 0) == (fm == "elu+1") and (short.x[4] > 0) == (fm == "relu")
        long = mixer(fm, 4, 64, "2x4097")
        assert configs.forward_route((9, 0), 8, 4097, 64, fm) == "two_pass"
        assert long.cls == "linear_attention.two_pass.D64"
        assert (long.x[3] > 0) == (fm == "elu+1") and (long.x[4] > 0) == (fm == "relu")
    classes = {(c.kw["feature_map"], c.launch(SMS).cls) for c in kernel_grid() if c.family == "linear_attention"}
    for fm in ("identity", "elu+1", "relu"):
        assert {(fm, f"linear_attention.{r}.D{D}") for r in ("two_pass", "prefix") for D in (32, 64)} <= classes


def test_wave_quantisation_shows_in_the_features():
    one_wave = KernelCase(
        "linear", (("K", 512), ("M", 128 * 132), ("N", 128), ("activation", None), ("residual", False))
    ).launch(SMS)
    one_more = KernelCase(
        "linear", (("K", 512), ("M", 128 * 132 + 1), ("N", 128), ("activation", None), ("residual", False))
    ).launch(SMS)
    assert one_wave.cls == "linear.cublas" and one_more.x[1] == 2 * one_wave.x[1]


@pytest.fixture
def calibrated(tmp_path):
    truth, kernel_rows, fit_rows, check_rows = _synthetic()
    for r in check_rows:
        r["ms"] *= 1.04  # a 4 % check error: the interval
    model, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    from nas.latency import kernels_fingerprint

    env = {
        "gpu": "NVIDIA H200",
        "driver": "1",
        "torch": "2.11",
        "triton": "3.6",
        "kernels_fingerprint": kernels_fingerprint(),
        "date": "2026-12-01",
    }
    path = write_calibration(load_profile("h200"), calibration_section(model, report, env, SMS), tmp_path / "h200.yaml")
    return load_profile(str(path))


def test_calibrated_interval_and_label(calibrated):
    arch = random_archs(5, 1)[0]
    lat = predict(arch, SHAPES[0], calibrated)
    assert lat.interval == pytest.approx(calibrated.calibrated.interval) and 0.03 < lat.interval < 0.05
    assert lat.label() == f"predicted (h200, calibrated 2026-12-01, ±{lat.interval * 100:.0f} %)"
    assert sum(ms for _, ms in lat.breakdown) == pytest.approx(lat.median_ms)
    assert lat.low_ms < lat.median_ms < lat.high_ms


def test_transferred_profile_says_so_with_a_wider_interval(calibrated):
    arch = random_archs(5, 1)[0]
    own = predict(arch, SHAPES[1], calibrated)
    l4 = predict(arch, SHAPES[1], load_profile("l4"), reference=calibrated)
    assert l4.label().startswith("predicted (transferred from h200, unchecked, ±")
    assert l4.interval >= max(_predict.TRANSFER_MIN_INTERVAL, own.interval)
    assert l4.median_ms > own.median_ms  # 16x less bandwidth, 8x less bf16 peak


def test_a_transferred_interval_is_the_sources_widened(calibrated):
    """Transferred from a calibration of ±10 %: ±30 % (TRANSFER_WIDENING), above the ±25 % floor."""
    loose = dataclasses.replace(calibrated, calibrated=dataclasses.replace(calibrated.calibrated, interval=0.1))
    l4 = predict(random_archs(5, 1)[0], SHAPES[1], load_profile("l4"), reference=loose)
    assert l4.interval == pytest.approx(_predict.TRANSFER_WIDENING * 0.1)
    assert l4.interval > _predict.TRANSFER_MIN_INTERVAL


def _stale(profile):
    """``profile`` as if calibrated on other kernels (fingerprint 0123456789ab)."""
    provenance = tuple(
        (k, "0123456789ab" if k == "kernels_fingerprint" else v) for k, v in profile.calibrated.provenance
    )
    return dataclasses.replace(profile, calibrated=dataclasses.replace(profile.calibrated, provenance=provenance))


def test_stale_kernels_past_the_checked_shapes_widen_twice(calibrated):
    """Both widenings at once multiply: a calibration of other kernels used past its checked
    shapes says both in its notes and label."""
    stale = _stale(calibrated)
    arch = random_archs(5, 1)[0]
    fresh = predict(arch, SHAPES[0], calibrated)
    far = parse_shape("1x4097")
    extrapolated = predict(arch, far, calibrated)
    assert "extrapolated" in extrapolated.label()
    assert extrapolated.interval >= _predict.EXTRAPOLATION_WIDENING * fresh.interval
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        lat = predict(arch, far, stale)
    assert lat.interval == pytest.approx(_predict.FINGERPRINT_WIDENING * extrapolated.interval)
    assert set(dict(lat.notes)) == {"kernels_fingerprint", "extrapolated"} and "extrapolated" in lat.label()


def test_uncalibrated_profile_says_so():
    arch = random_archs(5, 1)[0]
    lat = predict(arch, SHAPES[0], load_profile("l4"), reference=None)
    assert lat.label() == f"predicted (uncalibrated, ±{_predict.UNCALIBRATED_INTERVAL * 100:.0f} %)"
    fp32 = predict(arch, SHAPES[0], load_profile("h200"), dtype="fp32")  # the model is fitted for 16-bit
    assert fp32.basis == "uncalibrated"


def test_shipped_profiles_carry_their_basis():
    """The H100 and H200 predict from their own calibrations; the others are transferred from the
    reference: a calibration of the kernels this checkout runs (the H100's, the H200's being of
    older kernels), checked where a transfer within that compute capability was measured."""
    from nas.latency._measure import kernels_fingerprint

    arch = random_archs(5, 1)[0]
    reference = _predict._calibrated_reference()
    assert reference is not None and reference.name == "h100_sxm"
    assert reference.calibrated.get("kernels_fingerprint") == kernels_fingerprint()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for name in ("h100_sxm", "h200"):
            profile = load_profile(name)
            assert profile.calibrated.kernel_model is not None and profile.calibrated.get("kernels_fingerprint")
            assert predict(arch, SHAPES[0], profile).basis.startswith(f"{name}, calibrated ")
        for name in ("l4", "a100_80gb", "rtx4090"):
            capability = load_profile(name).compute_capability
            checked = _predict.MEASURED_TRANSFER_INTERVAL.get(capability) and capability == reference.compute_capability
            expect = f"checked within sm_{capability[0]}{capability[1]}" if checked else "unchecked"
            assert predict(arch, SHAPES[0], load_profile(name)).basis == f"transferred from h100_sxm, {expect}"


def test_a_measured_transfer_interval_holds_only_within_its_capability(calibrated, monkeypatch):
    """A transfer measured between two sm_90 GPUs sets the interval of a transfer from the H200 to
    the H100 (never below the source's own) and says so; the L4 (sm_89) keeps the unchecked guess."""
    monkeypatch.setattr(_predict, "MEASURED_TRANSFER_INTERVAL", {(9, 0): {"forward": 0.14}})
    arch = random_archs(5, 1)[0]
    h100, l4 = load_profile("h100_sxm"), load_profile("l4")
    if h100.calibrated.kernel_model_json is not None:  # a shipped H100 calibration: predict as if absent
        h100 = dataclasses.replace(h100, calibrated=type(h100.calibrated)())
    there = predict(arch, SHAPES[1], h100, reference=calibrated)
    assert there.basis == "transferred from h200, checked within sm_90"
    assert there.interval == pytest.approx(max(0.14, calibrated.calibrated.interval))
    assert _predict.transfer_interval(calibrated, h100, 0.2) == (0.2, "checked within sm_90")
    assert _predict.transfer_interval(calibrated, h100, 0.05, decode=True)[1] == "unchecked"
    far = predict(arch, SHAPES[1], l4, reference=calibrated)
    assert far.basis == "transferred from h200, unchecked"
    assert far.interval == pytest.approx(
        max(_predict.TRANSFER_MIN_INTERVAL, _predict.TRANSFER_WIDENING * calibrated.calibrated.interval)
    )


def test_a_transfer_measured_from_a_stale_source_is_not_widened_again(calibrated, monkeypatch):
    """A transfer measured with the source's calibration of older kernels already holds that
    staleness: it keeps the measured interval, in predictions and in ``nas profiles list``. Any other
    pair of fingerprints (the source refitted, or the kernels changed again) is widened as before."""
    from nas.latency import kernels_fingerprint, prediction_status

    stale = _stale(calibrated)
    h100 = load_profile("h100_sxm")
    h100 = dataclasses.replace(h100, calibrated=type(h100.calibrated)())
    arch = random_archs(5, 1)[0]
    monkeypatch.setattr(_predict, "MEASURED_TRANSFER_INTERVAL", {(9, 0): {"forward": 0.3}})
    monkeypatch.setattr(_predict, "_calibrated_reference", lambda: stale)
    _predict._warn_fingerprint.cache_clear()  # each staleness warns once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        monkeypatch.setattr(
            _predict, "MEASURED_TRANSFER_KERNELS", {(9, 0): {"forward": ("0123456789ab", kernels_fingerprint())}}
        )
        assert _predict.measured_as_is(stale, h100, "0123456789ab", kernels_fingerprint())
        assert not _predict.measured_as_is(stale, stale, "0123456789ab", kernels_fingerprint())  # not a transfer
        found = predict(arch, SHAPES[1], h100, reference=stale)
        assert found.interval == pytest.approx(0.3)
        assert prediction_status(h100).interval == pytest.approx(0.3)
        assert not [w for w in caught if issubclass(w.category, CalibrationWarning)]  # nothing to refit for
        assert "kernels_fingerprint" in dict(found.notes)  # but the staleness is stated
        monkeypatch.setattr(_predict, "MEASURED_TRANSFER_KERNELS", {(9, 0): {"forward": ("fedcba987654", "x")}})
        assert predict(arch, SHAPES[1], h100, reference=stale).interval == pytest.approx(
            0.3 * _predict.FINGERPRINT_WIDENING
        )
        assert prediction_status(h100).interval == pytest.approx(0.3 * _predict.FINGERPRINT_WIDENING)
        assert [w for w in caught if issubclass(w.category, CalibrationWarning)]


def test_a_decode_transfer_measured_from_a_stale_source_is_not_widened_again(monkeypatch):
    """The same rule for the decode model: its fingerprint pair as measured keeps the measured
    interval in ``predict_decode`` and ``prediction_status(decode=True)``; another pair is doubled."""
    import json

    from nas.latency import decode_fingerprint, predict_decode, prediction_status

    source = load_profile("h100_sxm")
    model = dict(source.calibrated.decode_model, kernels_fingerprint="0123456789ab", interval=0.2)
    stale = dataclasses.replace(
        source, calibrated=dataclasses.replace(source.calibrated, decode_model_json=json.dumps(model, sort_keys=True))
    )
    h200 = load_profile("h200")
    target = dataclasses.replace(h200, calibrated=type(h200.calibrated)())
    arch = random_archs(5, 1)[0]
    monkeypatch.setattr(_predict, "MEASURED_TRANSFER_INTERVAL", {(9, 0): {"decode": 0.5}})
    monkeypatch.setattr(_predict, "_decode_reference", lambda: stale)
    _predict._warn_fingerprint.cache_clear()  # each staleness warns once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        monkeypatch.setattr(
            _predict, "MEASURED_TRANSFER_KERNELS", {(9, 0): {"decode": ("0123456789ab", decode_fingerprint())}}
        )
        found = predict_decode(arch, 1, 4096, target, reference=stale)
        assert found.interval == pytest.approx(0.5)
        assert prediction_status(target, decode=True).interval == pytest.approx(0.5)
        assert not [w for w in caught if issubclass(w.category, CalibrationWarning)]  # nothing to refit for
        assert "kernels_fingerprint" in dict(found.notes)  # but the staleness is stated
        monkeypatch.setattr(_predict, "MEASURED_TRANSFER_KERNELS", {(9, 0): {"forward": ("0123456789ab", "x")}})
        widened = 0.5 * _predict.FINGERPRINT_WIDENING
        assert predict_decode(arch, 1, 4096, target, reference=stale).interval == pytest.approx(widened)
        assert prediction_status(target, decode=True).interval == pytest.approx(widened)
        assert [str(w.message) for w in caught if "h100_sxm decode" in str(w.message)]  # the decode model named


def test_interval_widths_are_what_the_interval_must_span():
    """An interval is ``predicted x (1 ± i)``: an underestimate by 30 % (predicted 0.7 of measured)
    needs i = 0.3 / 0.7, an overestimate by 30 % needs 0.3 / 1.3; a calibration's interval read
    from them covers its rows where one read from |error| would not."""
    from nas.latency._model import finite_interval, interval_widths, quantile

    assert interval_widths([-0.3, 0.3, 0.0]) == pytest.approx([0.3 / 0.7, 0.3 / 1.3, 0.0])
    assert interval_widths([-1.0]) == [math.inf]  # a prediction of zero: no interval holds it
    assert quantile([0.1, math.inf], 0.0) == 0.1 and quantile([0.1, math.inf], 1.0) == math.inf
    with pytest.raises(ValueError, match="predicted at 0 ms"):  # never written into a profile
        finite_interval(quantile(interval_widths([-1.0, 0.1]), 0.95))
    errors = [-0.3] * 10 + [0.0] * 90  # 10 % of rows underestimated by 30 %, the rest exact
    predicted, measured = [1 + e for e in errors], [1.0] * 100

    def covered(q: float) -> int:
        return sum(p * (1 - q) <= m <= p * (1 + q) for p, m in zip(predicted, measured, strict=True))

    assert covered(quantile(interval_widths(errors), 0.95)) == 100
    assert covered(quantile([abs(e) for e in errors], 0.95)) == 90  # |error| leaves the underestimates out


def test_fingerprint_mismatch_warns_and_widens(calibrated):
    stale = _stale(calibrated)
    arch = random_archs(5, 1)[0]
    fresh = predict(arch, SHAPES[0], calibrated)
    _predict._warn_fingerprint.cache_clear()
    with pytest.warns(CalibrationWarning, match="0123456789ab") as caught:
        lat = predict(arch, SHAPES[0], stale)
    from nas.latency import kernels_fingerprint

    assert kernels_fingerprint() in str(caught[0].message)
    assert lat.interval == pytest.approx(_predict.FINGERPRINT_WIDENING * fresh.interval)
    assert "0123456789ab" in dict(lat.notes)["kernels_fingerprint"]


def test_latency_dict_round_trip_with_interval_and_old_dicts():
    lat = Latency(
        0.5,
        0.0,
        "predicted",
        "h200",
        "bf16",
        parse_shape("8x1024"),
        breakdown=(("a", 0.2), ("b", 0.3)),
        interval=0.07,
        basis="h200, calibrated 2026-12-01",
    )
    assert Latency.from_dict(lat.to_dict()) == lat
    old = {k: v for k, v in lat.to_dict().items() if k not in ("interval", "basis")}
    back = Latency.from_dict(old)
    assert back.interval == 0.0 and back.basis == "" and back.label() == "predicted"
    assert (
        Latency(1.0, 0.1, "measured", "NVIDIA H200", "bf16", parse_shape("1x256")).label() == "measured (NVIDIA H200)"
    )
    with pytest.raises(ValueError, match="interval"):
        Latency(1.0, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"), interval=-0.1)


def test_profile_rejects_a_malformed_kernel_model(tmp_path):
    from hardware_profiles import ProfileError

    text = load_profile("l4").path
    path = tmp_path / "bad.yaml"
    path.write_text(
        open(text)
        .read()
        .replace("calibrated: {}", "calibrated:\n  kernel_model:\n    coefficients:\n      conv: [1, -2]\n")
    )
    with pytest.raises(ProfileError, match="non-negative"):
        load_profile(str(path))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_cli_calibrate_without_gpu_exits_2(capsys):
    assert main(["profiles", "calibrate"]) == 2
    assert main(["profiles", "calibrate", "--profile", "l4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("nas: error: calibrate needs a CUDA GPU") for line in err)


@pytest.mark.parametrize("budget", ["0", "-5", "ten"])
def test_cli_calibrate_bad_budget_exits_2(budget, capsys):
    assert main(["profiles", "calibrate", "--budget-s", budget]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget-s" in err[0]


def test_cli_calibrate_unknown_profile_exits_2(capsys):
    assert main(["profiles", "calibrate", "--profile", "nope"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _fake_gpu(monkeypatch, kernel_rows, fit_rows, check_rows, *, drop_kernels: int = 0, budgets: list | None = None):
    """``nas.latency.calibrate``'s GPU parts replaced by the rows of a known model: the kernel
    timing leaves out its last ``drop_kernels`` cases (as a deadline would), the deadlines seen go
    to ``budgets``."""
    from nas.latency import calibrate as cal

    by_key = {(r["family"], tuple(sorted(r["args"].items()))): r for r in kernel_rows}
    forwards = {(str(r["arch"]), r["shape"]): r for r in fit_rows + check_rows}
    env = {"gpu": "NVIDIA H200", "driver": "1", "torch": "2.11", "triton": "3.6", "date": "2026-12-01"}

    def time_kernels(cases, deadline=math.inf, **_):
        if budgets is not None:
            budgets.append(deadline)
        cases = list(cases)
        return [dict(by_key[(c.family, c.args)]) for c in cases[: len(cases) - drop_kernels]]

    monkeypatch.setattr(cal, "require_gpu", lambda profile: SMS)
    monkeypatch.setattr(cal, "warm", lambda *a, **k: None)
    monkeypatch.setattr(cal, "environment", lambda: {**env, "kernels_fingerprint": "abc"})
    monkeypatch.setattr(cal, "time_kernels", time_kernels)
    monkeypatch.setattr(
        cal, "measure_models", lambda models, **k: [dict(forwards[(str(a.to_dict()), str(s))]) for a, s in models]
    )
    monkeypatch.setattr(cal, "fit_draws", lambda seed, n: random_archs(1, 8))
    monkeypatch.setattr(cal, "stacked_archs", lambda seed, n: random_archs(1001, 8))


def test_cli_calibrate_says_what_its_budget_left_out(tmp_path, monkeypatch, capsys):
    """``--budget-s`` sets the deadline; kernels the deadline left untimed are counted in the
    output and the report, and the fit uses the rest."""
    import time

    _, kernel_rows, fit_rows, check_rows = _synthetic(archs=8)
    budgets: list[float] = []
    _fake_gpu(monkeypatch, kernel_rows, fit_rows, check_rows, drop_kernels=7, budgets=budgets)
    out = tmp_path / "h200.yaml"
    start = time.monotonic()
    assert main(["profiles", "calibrate", "--profile", "h200", "--out", str(out), "--budget-s", "30"]) == 0
    assert start + 29 <= budgets[0] <= time.monotonic() + 31
    said = " ".join(capsys.readouterr().out.split())
    assert f"the 30 s budget left out 7 of {len(kernel_rows)} kernels" in said
    assert "fit forwards" not in said.split("left out")[1].split(":")[0]
    assert load_profile(str(out)).calibrated.kernel_model is not None


def test_cli_calibrate_saves_rows_that_refit_to_the_same_model(tmp_path, monkeypatch, capsys):
    """``nas profiles calibrate --rows`` (the GPU parts replaced by a known model) writes every
    timing row; fitting those rows again gives the coefficients written into the profile."""
    from nas.latency import calibrate as cal

    truth, kernel_rows, fit_rows, check_rows = _synthetic(archs=8)
    by_key = {(r["family"], tuple(sorted(r["args"].items()))): r for r in kernel_rows}
    forwards = {(str(r["arch"]), r["shape"]): r for r in fit_rows + check_rows}
    env = {"gpu": "NVIDIA H200", "driver": "1", "torch": "2.11", "triton": "3.6", "date": "2026-12-01"}
    monkeypatch.setattr(cal, "require_gpu", lambda profile: SMS)
    monkeypatch.setattr(cal, "warm", lambda *a, **k: None)
    monkeypatch.setattr(cal, "environment", lambda: {**env, "kernels_fingerprint": "abc"})
    monkeypatch.setattr(cal, "time_kernels", lambda cases, **k: [dict(by_key[(c.family, c.args)]) for c in cases])
    monkeypatch.setattr(
        cal,
        "measure_models",
        lambda models, **k: [dict(forwards[(str(a.to_dict()), str(s))]) for a, s in models],
    )
    rows_path, out = tmp_path / "rows.json", tmp_path / "h200.yaml"
    args = ["profiles", "calibrate", "--profile", "h200", "--out", str(out), "--rows", str(rows_path)]
    monkeypatch.setattr(cal, "fit_draws", lambda seed, n: random_archs(1, 8))
    monkeypatch.setattr(cal, "stacked_archs", lambda seed, n: random_archs(1001, 8))
    assert main(args) == 0
    saved = __import__("json").loads(rows_path.read_text())
    assert saved["gpu"] == "NVIDIA H200" and saved["sm_count"] == SMS
    assert len(saved["kernel_rows"]) == len(kernel_rows) and len(saved["fit_rows"]) == len(fit_rows)
    assert all(r["run"] for r in saved["fit_rows"] + saved["check_rows"])
    refitted, _ = fit(saved["kernel_rows"], saved["fit_rows"], saved["check_rows"], sm_count=SMS)
    written = load_profile(str(out)).calibrated
    assert written.get("kernels_fingerprint") == "abc"
    assert written.kernel_model == refitted.to_dict()


def test_the_kernel_grid_times_the_normed_linears_as_the_forward_launches_them():
    """Each linear the model runs after a norm (q/k/v, MLP up, readout) has a kernel-grid case
    with the very launch the forward makes: where the fused kernel sums the norm (a large
    vocabulary read from a narrow model too), the grid times that kernel, not cuBLAS's route."""
    from kernels.linear import configs
    from nas.latency.calibrate import D_GRID
    from nas.spec import LayerSpec

    grid = {(c.launch(SMS).cls, c.launch(SMS).x) for c in kernel_grid() if c.family == "linear"}
    fused = unfused = 0
    for shape in SHAPES:
        for d in (16, 64, 128, 256):
            act = ("gelu", "relu", "silu")[(D_GRID.index(d) + 1) % 3]  # the grid's MLP-up activation at ratio 2
            layer = LayerSpec("attention", max(1, d // 64), None, 0, 2.0, act, "rmsnorm")
            for readout, vocab in itertools.product(("token", "last"), (1001, 8192, 50257)):  # grid vocabs
                arch = ArchSpec(d, (layer,), vocab, vocab, readout)
                work = {w.name: w for w in launches(arch, shape, SMS)}
                for name in ("layers.0.qkv", "layers.0.mlp_up", "head"):
                    assert (work[name].cls, work[name].x) in grid, (str(shape), d, readout, name, work[name].cls)
                rows = shape.tokens if readout == "token" else shape.batch
                folds = configs.norm_in_kernel((9, 0), configs.m_bucket(rows), configs.padded_features(vocab), d, None)
                fused += folds
                unfused += not folds and configs.fuses_norm(configs.m_bucket(rows), d)  # a wide readout
    assert fused >= 10 and unfused >= 10  # the readout's fused route is among them, and cuBLAS's after a norm


def test_a_norm_is_a_launch_only_where_the_linear_does_not_fuse_it():
    """TritonModel folds each norm into the linear after it: the launch list has the norm's own
    launch exactly where ``fuses_norm`` leaves it out of the linear's main loop (none at 1x256
    here), right before that linear, whose class follows ``prefers_cublas(..., norm=True)``."""
    from kernels.linear import configs
    from nas.spec import LayerSpec

    arch = ArchSpec(
        128,
        (
            LayerSpec("attention", 4, None, 4, 4.0, "gelu", "rmsnorm"),
            LayerSpec("linear_attention", 4, "identity", 0, 2.0, "silu", "layernorm"),
        ),
        1000,
        1000,
        "token",
    )
    seen_own = seen_fused = seen_cublas = False
    for shape in ("1x256", "4x256", "16x1024"):
        work = launches(arch, parse_shape(shape), SMS)
        names = [w.name for w in work]
        bucket = configs.m_bucket(parse_shape(shape).tokens)
        for norm, linear, n, act in (
            ("layers.0.mixer_norm", "layers.0.qkv", 3 * 128, None),
            ("layers.0.mlp_norm", "layers.0.mlp_up", 512, "gelu"),
            ("layers.1.mixer_norm", "layers.1.qkv", 3 * 128, None),
            ("final_norm", "head", 1000, None),
        ):
            fused = configs.fuses_norm(bucket, 128)
            assert (norm in names) == (not fused), (shape, norm)
            if not fused:
                assert names.index(norm) == names.index(linear) - 1
            cublas = configs.prefers_cublas((9, 0), bucket, n, 128, act, False, norm=True)
            assert (work[names.index(linear)].cls == "linear.cublas") == cublas, (shape, linear)
            seen_own |= not fused
            seen_fused |= fused
            seen_cublas |= cublas
    assert seen_own and seen_fused and seen_cublas  # both sides of the rule are exercised
    assert not any(w.cls.startswith("norm.") for w in launches(arch, parse_shape("1x256"), SMS))


# The H100's rows of its first eleven leases that the wide-readout rule (``configs._wide_readout``)
# moved: timed with the norm folded into the fused readout, which now runs on cuBLAS after the norm.
REROUTED_FIT_ROWS = 167


def as_timed(row: dict) -> bool:
    """Whether ``row``'s forward launches today as it did when timed before the wide-readout
    rule: its readout is not one the rule moved from the fused kernel with the norm folded in
    (``fuses_norm`` and aligned) to cuBLAS."""
    from kernels.linear import configs

    arch, shape = row["arch"], parse_shape(row["shape"])
    bucket = configs.m_bucket(shape.tokens if arch["readout"] == "token" else shape.batch)
    d, n = arch["d_model"], configs.padded_features(arch["n_out"])
    folded = configs.fuses_norm(bucket, d) and d % 16 == 0
    return not (folded and configs._wide_readout((9, 0), bucket, n, None, False))


@pytest.mark.parametrize("name", ["h100_sxm", "h200"])
def test_the_committed_rows_refit_to_the_shipped_profile(name):
    """benchmarks/results/predictor_rows_<gpu>.json is the run the shipped profile was fitted on
    (the H100's with the held-out forwards of its second to fifth, seventh, ninth, tenth and
    eleventh leases' files, the sixth, tenth, eleventh and twelfth leases' fit rows and check rows
    too, and the twelfth lease's kernel grid, each row tagged with its generator and its file as
    the run; of the first eleven leases only the rows whose launches the wide-readout rule left as
    they were timed): the kernels fingerprint and date of its kernel grid's file, and refitting it
    gives the profile's interval and check scores (a recalibration that ships a profile without its
    rows fails here).
    Rows of kernels that have changed since (the launch model now describes other kernels) cannot
    refit to it: such a profile must say that its kernels differ."""
    import json
    from pathlib import Path

    from nas.latency import prediction_status
    from nas.latency._measure import kernels_fingerprint

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    rows = json.loads((results / f"predictor_rows_{name.split('_')[0]}.json").read_text())
    shipped = load_profile(name).calibrated
    grid = rows if name != "h100_sxm" else json.loads((results / "predictor_rows_h100_lease12.json").read_text())
    assert (grid["kernels_fingerprint"], grid["date"]) == (shipped.get("kernels_fingerprint"), shipped.get("date"))
    if grid["kernels_fingerprint"] != kernels_fingerprint():
        assert prediction_status(load_profile(name)).fingerprint.startswith("differs")
        return
    kernel_rows, fit_rows, check_rows = rows["kernel_rows"], rows["fit_rows"], rows["check_rows"]
    if name == "h100_sxm":  # the twelfth lease's kernel grid; the forwards of eleven (the eighth timed none)
        files = {i: f"predictor_rows_h100_lease{i}.json" for i in range(2, 13)} | {1: "predictor_rows_h100.json"}
        lease = {i: json.loads((results / f).read_text()) for i, f in files.items() if i != 1} | {1: rows}

        def tagged(i: int, key: str) -> list[dict]:  # each row with its file's generator, its file the run
            generator = lease[i]["generators"][key.removesuffix("_rows")]
            return [{**r, "generator": generator, "run": files[i]} for r in lease[i][key] if i == 12 or as_timed(r)]

        kernel_rows = lease[12]["kernel_rows"]
        fit_rows = [r for i in (1, 6, 10, 11, 12) for r in tagged(i, "fit_rows")]
        fit_rows += [r for i in (1, 2, 3, 4, 5, 7, 9, 10, 11) for r in tagged(i, "held_out_rows")]
        check_rows = [r for i in (1, 6, 10, 11, 12) for r in lease[i]["check_rows"] if i == 12 or as_timed(r)]
    _, report = fit(kernel_rows, fit_rows, check_rows, sm_count=rows["sm_count"])
    if name == "h100_sxm":
        timed_before = 360 + 240 + 120 + 120 + 180 + 360 + 3 * 180 + 360 + 540 + 240 + 360
        assert report["fit_models"] == timed_before - REROUTED_FIT_ROWS + len(lease[12]["fit_rows"])
        assert len(report["across_runs"]) == 12 - 1  # the eighth lease timed no forwards
        assert report["interval"] == report["interval_by_generator"]["preset_arch"]
    assert report["interval"] == pytest.approx(shipped.interval, abs=5e-4)
    assert report["check"]["all"]["within_10pct"] == pytest.approx(
        shipped.check["check_set"]["all"]["within_10pct"], abs=1e-3
    )


def test_only_the_residual_width_can_leave_a_launch_unaligned():
    """The model pads MLP hidden widths and readout outputs (``padded_features``), and a K % 16 ≠ 0
    linear goes to cuBLAS with the norm as a launch of its own: at d 72 (K % 16 = 8), hidden 94 and
    1003 outputs only cuBLAS's K % 16 feature is met (on the linears that read d), and each normed
    linear is a norm launch then cuBLAS; at d 36 (K % 8 ≠ 0: no cuBLAS) the fused kernel's
    unaligned loop is priced."""
    from kernels.linear import configs
    from nas.spec import LayerSpec

    def arch(d: int) -> ArchSpec:
        layers = (LayerSpec("attention", 2, None, 4, 1.3, "gelu", "rmsnorm"), LayerSpec("none", mlp_ratio=0.7))
        return ArchSpec(d, layers, 1003, 1003, "token")

    unaligned = [FEATURES["linear"].index(f) for f in ("k_steps_k16", "k_steps_k8", "out_n8")]
    for shape in ("1x256", "8x1024"):
        work = launches(arch(72), parse_shape(shape), SMS)
        linears = [w for w in work if family(w.cls) == "linear"]
        assert len(linears) == 7
        assert all(w.x[i] == 0 for w in linears for i in unaligned[1:]), shape
        assert all((w.x[unaligned[0]] > 0) == (w.cls == "linear.cublas" and w.name != "layers.0.out") for w in linears)
        names = [w.name for w in work]
        for norm, linear in (("layers.0.mixer_norm", "layers.0.qkv"), ("final_norm", "head")):
            assert names.index(norm) == names.index(linear) - 1 and work[names.index(linear)].cls == "linear.cublas"
        assert configs.fuses_norm(configs.m_bucket(parse_shape(shape).tokens), 72)  # the route, not the size
    narrow = launches(arch(36), parse_shape("1x256"), SMS)
    qkv = next(w for w in narrow if w.name == "layers.0.qkv")
    assert qkv.cls != "linear.cublas" and qkv.x[unaligned[1]] > 0


def test_the_committed_decode_rows_refit_to_the_shipped_h100_decode_model():
    """The H100's decode model is ``fit_decode`` over its rows file's calibration steps and held-out
    decode steps, with the second lease's (its own file): refitting them gives the shipped coefficients and interval."""
    import json
    from pathlib import Path

    from nas.latency.calibrate_decode import fit_decode

    rows = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/predictor_rows_h100.json").read_text())
    shipped = load_profile("h100_sxm").calibrated.decode_model
    second = json.loads(
        (Path(__file__).resolve().parents[2] / "benchmarks/results/predictor_rows_h100_lease2.json").read_text()
    )
    pooled = rows["decode_rows"] + rows["held_out_decode_rows"] + second["decode_rows"] + second["held_out_decode_rows"]
    coef, report = fit_decode(pooled)
    assert report["rows"] == shipped["rows"]
    assert report["interval"] == pytest.approx(shipped["interval"], abs=5e-4)
    assert coef == pytest.approx(shipped["coefficients"], rel=1e-3)


def test_plain_starts_follow_the_library_kernels_and_the_early_scope():
    """A Triton kernel right after a library kernel (the embedding gather, cuBLAS's matmul, cuDNN's
    attention) starts plain, one after a Triton kernel does not, and the cuBLAS route's epilogue
    pass adds one outside the early-trigger scope only; a forward's plain starts are a column of
    the stage-2 system and priced by ``plain_gap_us``, which a transfer scales like a launch."""
    from nas.latency._launches import _library_ends
    from nas.latency._model import _forward_columns
    from nas.models.triton_model import PDL_EARLY_MAX_TOKENS
    from nas.spec import LayerSpec

    arch = ArchSpec(
        96,
        (LayerSpec("attention", 2, None, 0, 4.0, "gelu", "layernorm"), LayerSpec("none", mlp_ratio=2.0)),
        1000,
        1000,
        "token",
    )
    for text in ("1x256", "8x1024", "32x512"):
        shape = parse_shape(text)
        work = launches(arch, shape, SMS)
        assert work[0].cls == "embed" and work[0].plain == 0
        for before, launch in zip(work, work[1:], strict=False):
            first, _ = _library_ends(launch)
            expected = float(_library_ends(before)[1] and not first)
            if launch.cls == "linear.cublas" and launch.x[0] == 2.0 and shape.tokens > PDL_EARLY_MAX_TOKENS:
                expected += 1.0
            assert launch.plain == expected, (text, before.name, launch.name)
        assert work[1].plain == 1.0  # the first Triton kernel after the gather
        assert sum(w.plain for w in work) > 0
        model = KernelModel(
            tuple((w.cls, tuple(0.0 for _ in w.x)) for w in {w.cls: w for w in work}.values()), plain_gap_us=2.0
        )
        assert model.forward_us(work, shape.tokens) == pytest.approx(2.0 * sum(w.plain for w in work))
        row = _forward_columns(model, work, shape.tokens)
        assert row[-3] == sum(w.plain for w in work) and row[-4] == len(work)
    epilogues = [w for w in launches(arch, parse_shape("8x1024"), SMS) if w.cls == "linear.cublas" and w.x[0] == 2.0]
    early = [w for w in launches(arch, parse_shape("1x256"), SMS) if w.cls == "linear.cublas" and w.x[0] == 2.0]
    assert epilogues and early  # the arch takes the epilogue route at both sizes, so both rules were exercised
    model = KernelModel((), gap_us=1.0, plain_gap_us=2.0)
    assert KernelModel.from_dict(model.to_dict()).plain_gap_us == 2.0
    assert KernelModel.from_dict({"coefficients": {}}).plain_gap_us == 0.0  # a calibration from before
    ratios = {"launch": 3.0, "wave": 1.0, "tensor": 1.0, "vector": 1.0, "bytes": 1.0}
    assert model.transfer(ratios).plain_gap_us == pytest.approx(6.0)
