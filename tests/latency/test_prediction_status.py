"""``prediction_status`` says what ``predict`` / ``predict_decode`` do for a profile, and
``nas profiles list`` shows it: each status is checked against a real prediction at a checked shape."""

from __future__ import annotations

import warnings

import pytest

import nas.latency._measure as measure_module
import nas.latency._predict as predict_module
from hardware_profiles import list_profiles, load_profile
from nas.cli import main
from nas.latency import LatencyShape, predict, predict_decode, prediction_status
from nas.spec import ArchSpec, LayerSpec

ARCH = ArchSpec(
    128,
    (LayerSpec("attention", heads=2), LayerSpec("linear_attention", heads=2, feature_map="elu+1")),
    256,
    256,
    "token",
)
SHAPE = LatencyShape(1, 256)  # inside every shipped calibration's checked shapes
CONTEXT = 1024  # inside the decode calibration's checked contexts


def _kind(basis: str) -> str:
    return "transferred" if basis.startswith("transferred") else "roofline" if basis == "uncalibrated" else "calibrated"


@pytest.mark.parametrize("name", list_profiles())
def test_the_status_is_what_predict_does(name):
    profile = load_profile(name)
    forward, decode = prediction_status(profile), prediction_status(profile, decode=True)
    lat = predict(ARCH, SHAPE, profile)
    step = predict_decode(ARCH, 1, CONTEXT, profile)
    assert forward.kind == _kind(lat.basis) and forward.interval == pytest.approx(lat.interval)
    assert decode.kind == _kind(step.basis) and decode.interval == pytest.approx(step.interval)
    if forward.kind == "transferred":
        assert lat.basis.startswith(f"transferred from {forward.source}")


def test_a_fingerprint_mismatch_is_shown_and_widens_like_predict(monkeypatch):
    profile = load_profile("h100_sxm")
    before = prediction_status(profile)
    monkeypatch.setattr(measure_module, "kernels_fingerprint", lambda: "000000000000")
    after = prediction_status(profile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lat = predict(ARCH, SHAPE, profile)
    assert before.fingerprint == "matches" and after.fingerprint.startswith("differs")
    assert after.interval == pytest.approx(predict_module.FINGERPRINT_WIDENING * before.interval)
    assert after.interval == pytest.approx(lat.interval)


def test_without_a_calibrated_profile_anywhere_it_is_the_roofline(monkeypatch):
    monkeypatch.setattr(predict_module, "_calibrated_reference", lambda: None)
    status = prediction_status(load_profile("l4"))
    assert (status.kind, status.label, status.fingerprint) == ("roofline", "roofline", None)
    assert status.interval == predict_module.UNCALIBRATED_INTERVAL


def test_profiles_list_shows_the_status_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["profiles", "list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert set(rows) == set(list_profiles())
    for name in ("h200", "h100_sxm"):
        status = prediction_status(load_profile(name))
        assert f"calibrated {status.date}" in rows[name] and f"{status.interval:.0%}" in rows[name]
    assert "matches" in rows["h100_sxm"] and "differs" in rows["h200"]  # the H200's fit is of older kernels
    assert "transferred from h100_sxm" in rows["l4"] and "matches" in rows["l4"]
    assert "141 GB" in rows["h200"]
