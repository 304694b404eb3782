"""The calibrated predictor on the CPU: fitting, intervals and labels, fingerprints, Latency dicts, CLI."""

from __future__ import annotations

import dataclasses
import random
import warnings

import pytest

from hardware_profiles import load_profile
from nas.cli import main
from nas.latency import CalibrationWarning, Latency, _predict, launches, parse_shape, predict
from nas.latency._launches import FEATURES, family
from nas.latency._model import KernelModel
from nas.latency.calibrate import (
    SHAPES,
    KernelCase,
    calibration_section,
    fit,
    kernel_grid,
    random_archs,
    write_calibration,
)

SMS = 132
IDENTIFIABLE = ("linear.tma", "linear.short_k", "attention.D64", "linear_attention.D32", "conv", "copy")


def _synthetic(seed: int = 0) -> tuple[KernelModel, list[dict], list[dict], list[dict]]:
    rng = random.Random(seed)
    cases = kernel_grid()
    classes = sorted({c.launch(SMS).cls for c in cases})
    truth = KernelModel(tuple((cls, tuple(rng.uniform(0.2, 3.0) for _ in FEATURES[family(cls)])) for cls in classes))
    kernel_rows = [{"family": c.family, "args": dict(c.args), "us": truth.kernel_us(c.launch(SMS))} for c in cases]

    def row(arch, shape):  # in a forward: every kernel 10 % slower, 0.4 µs gap each, 5 µs per forward
        work = launches(arch, shape, SMS)
        return {
            "arch": arch.to_dict(),
            "shape": str(shape),
            "ms": (1.1 * sum(truth.kernel_us(w) for w in work) + 0.4 * len(work) + 5.0) / 1e3,
        }

    fit_rows = [row(a, s) for a in random_archs(1, 30) for s in SHAPES]
    check_rows = [row(a, s) for a in random_archs(1001, 10) for s in SHAPES]
    return truth, kernel_rows, fit_rows, check_rows


def test_fit_recovers_known_coefficients():
    truth, kernel_rows, fit_rows, check_rows = _synthetic()
    model, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    for cls in IDENTIFIABLE:
        assert model.coefficient(cls) == pytest.approx(truth.coefficient(cls), rel=1e-3), cls
    assert model.gap_us == pytest.approx(0.4, rel=1e-3)
    assert model.intercept_us == pytest.approx(5.0, rel=1e-3)
    assert all(s == pytest.approx(1.1, rel=1e-3) for _, s in model.scales)
    assert report["check"]["all"]["within_10pct"] == 1.0 and report["interval"] < 1e-6


def test_fit_sees_a_wrong_kernel_model():
    """Timings from another cost law must not fit: the check reports the error."""
    truth, kernel_rows, fit_rows, check_rows = _synthetic()
    for r in fit_rows[: len(fit_rows) // 2]:
        r["ms"] *= 1.5  # half the forwards 50 % slower than their kernels say
    _, report = fit(kernel_rows, fit_rows, check_rows, sm_count=SMS)
    assert report["interval"] > 0.05


def test_wave_quantisation_shows_in_the_features():
    one_wave = KernelCase(
        "linear", (("K", 512), ("M", 128 * 132), ("N", 128), ("activation", None), ("residual", False))
    ).launch(SMS)
    one_more = KernelCase(
        "linear", (("K", 512), ("M", 128 * 132 + 1), ("N", 128), ("activation", None), ("residual", False))
    ).launch(SMS)
    assert one_wave.cls == "linear.tma" and one_more.x[1] == 2 * one_wave.x[1]


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
    assert l4.label().startswith("predicted (transferred from h200, ±")
    assert l4.interval >= max(_predict.TRANSFER_MIN_INTERVAL, own.interval)
    assert l4.median_ms > own.median_ms  # 16x less bandwidth, 8x less bf16 peak


def test_uncalibrated_profile_says_so():
    arch = random_archs(5, 1)[0]
    lat = predict(arch, SHAPES[0], load_profile("l4"), reference=None)
    assert lat.label() == f"predicted (uncalibrated, ±{_predict.UNCALIBRATED_INTERVAL * 100:.0f} %)"
    fp32 = predict(arch, SHAPES[0], load_profile("h200"), dtype="fp32")  # the model is fitted for 16-bit
    assert fp32.basis == "uncalibrated"


def test_shipped_profiles_carry_their_basis():
    arch = random_archs(5, 1)[0]
    h200 = load_profile("h200")
    assert h200.calibrated.kernel_model is not None and h200.calibrated.get("kernels_fingerprint")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        assert predict(arch, SHAPES[0], h200).basis.startswith("h200, calibrated ")
        for name in ("l4", "a100_80gb", "h100_sxm", "rtx4090"):
            assert predict(arch, SHAPES[0], load_profile(name)).basis == "transferred from h200"


def test_fingerprint_mismatch_warns_and_widens(calibrated):
    stale = dataclasses.replace(
        calibrated,
        calibrated=dataclasses.replace(
            calibrated.calibrated,
            provenance=tuple(
                (k, "0123456789ab" if k == "kernels_fingerprint" else v) for k, v in calibrated.calibrated.provenance
            ),
        ),
    )
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


def test_cli_calibrate_unknown_profile_exits_2(capsys):
    assert main(["profiles", "calibrate", "--profile", "nope"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
