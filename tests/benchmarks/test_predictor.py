"""benchmarks/predictor.py without a GPU: the held-out generator draws what a user's space holds,
and the report scores held-out decode steps and a transferred calibration."""

from __future__ import annotations

import json

import pytest

from benchmarks import predictor as pr
from hardware_profiles import load_profile
from nas.latency import launches, predict, predict_decode
from nas.latency.calibrate import SHAPES


def test_space_arch_draws_spaces_a_user_writes():
    archs = pr.space_archs(3, 60)
    assert archs == pr.space_archs(3, 60) and archs != pr.space_archs(4, 60)
    assert min(len(a.layers) for a in archs) <= 2 and max(len(a.layers) for a in archs) == 12
    assert min(a.vocab_size for a in archs) < 64 and max(a.vocab_size for a in archs) > 8192
    assert any(a.d_model % 16 for a in archs), "widths in steps of 8, not only the fit's 16s"
    for a in archs:
        heads = {la.heads for la in a.layers if la.mixer != "none"}
        assert any(heads <= set(h) for h in pr.HEAD_LISTS), heads
        for shape in SHAPES:
            assert launches(a, shape, 132)  # every kernel these forwards launch exists


def _rows(tmp_path, scale: float = 1.0):
    h200 = load_profile("h200")
    archs = pr.space_archs(3, 6)
    data = {
        "gpu": "NVIDIA H200",
        "fit_rows": [],
        "check_rows": [],
        "kernel_rows": [],
        "held_out_rows": [
            {"arch": a.to_dict(), "shape": str(s), "ms": scale * predict(a, s, h200).median_ms}
            for a in archs
            for s in SHAPES
        ],
        "held_out_decode_rows": [
            {"arch": g.to_dict(), "batch": b, "context": n, "ms": scale * predict_decode(g, b, n, h200).median_ms}
            for g in map(pr.as_generator, archs)
            for b, n in pr.DECODE_HELD_OUT
        ],
    }
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    return path


def test_report_scores_decode_steps_and_a_transfer(tmp_path):
    """Rows timed exactly as the H200's calibration predicts: its own prediction is exact, and
    the same rows predicted as a transfer to an uncalibrated H200 from itself are exact too (the
    ratios of a GPU to itself are 1)."""
    out = pr.report(_rows(tmp_path), "h200", tmp_path, transfer_from="h200")
    results = json.loads(out.read_text())["results"]
    assert results["all"]["calibrated"]["within_10pct"] == 1.0
    assert results["transferred"]["all"]["p95_abs_error"] == pytest.approx(0.0, abs=1e-9)
    assert results["transferred"]["all"]["inside_interval"] == 1.0
    for key in ("1x4096", "8x16384", "all"):
        for name in ("calibrated", "transferred"):
            assert results["decode"][key][name]["p95_abs_error"] == pytest.approx(0.0, abs=1e-9), (key, name)
    slow = pr.report(_rows(tmp_path, scale=2.0), "h200", tmp_path, transfer_from="h200")
    results = json.loads(slow.read_text())["results"]
    assert results["transferred"]["all"]["p95_abs_error"] == pytest.approx(0.5)
    assert results["decode"]["all"]["calibrated"]["inside_interval"] == 0.0
