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


def test_parts_collect_only_the_named_rows_from_where_the_last_call_stopped(tmp_path, monkeypatch, capsys):
    """``--parts fit,held`` (the GPU path under --dry-run) measures the fit seed's architectures
    from ``--fit-start`` on and the held-out set, times no kernel grid, fits nothing and writes
    the rows; an unknown part is refused."""
    import sys

    from nas.latency.calibrate import random_archs

    argv = ["predictor.py", "--gpu", "--dry-run", "--profile", "h200", "--out", str(tmp_path)]
    argv += ["--parts", "fit,held", "--fit-seed", "2", "--fit-start", "3", "--fit-archs", "2", "--archs", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    pr.main()
    data = json.loads((tmp_path / "predictor_rows.json").read_text())
    fitted = list({json.dumps(r["arch"], sort_keys=True): r["arch"] for r in data["fit_rows"]}.values())
    assert fitted == [a.to_dict() for a in random_archs(2, 5)[3:]]
    assert len(data["fit_rows"]) == 2 * len(SHAPES) and len(data["held_out_rows"]) == 2 * len(SHAPES)
    assert data["kernel_rows"] == data["check_rows"] == [] and data["seeds"]["fit_start"] == 3
    assert not list(tmp_path.glob("predictor_*_*.json")), "collecting writes no report"
    monkeypatch.setattr(sys, "argv", [*argv[:-10], "--parts", "fit,kernel"])
    with pytest.raises(SystemExit) as exit_:
        pr.main()
    assert exit_.value.code == 2 and "unknown kernel" in capsys.readouterr().err
