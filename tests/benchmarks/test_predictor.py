"""benchmarks/predictor.py without a GPU: the held-out generator draws what a user's space holds,
and the report scores held-out decode steps and a transferred calibration."""

from __future__ import annotations

import json

import pytest

from benchmarks import predictor as pr
from hardware_profiles import load_profile
from nas.latency import launches, predict, predict_decode
from nas.latency.calibrate import HEAD_LISTS, SHAPES, fit_draws, preset_archs, random_archs


def test_space_arch_draws_spaces_a_user_writes():
    archs = pr.space_archs(3, 60)
    assert archs == pr.space_archs(3, 60) and archs != pr.space_archs(4, 60)
    assert min(len(a.layers) for a in archs) <= 2 and max(len(a.layers) for a in archs) == 12
    assert min(a.vocab_size for a in archs) < 64 and max(a.vocab_size for a in archs) > 8192
    assert any(a.d_model % 16 for a in archs), "widths in steps of 8, not only the fit's 16s"
    for a in archs:
        heads = {la.heads for la in a.layers if la.mixer != "none"}
        assert any(heads <= set(h) for h in HEAD_LISTS), heads
        for shape in SHAPES:
            assert launches(a, shape, 132)  # every kernel these forwards launch exists


def test_the_fit_draws_random_stacks_and_user_spaces_and_the_held_out_the_shipped_spaces():
    """``fit_draws`` alternates ``random_arch`` and ``space_arch`` (all-MLP and repeated-block
    stacks, which per-layer random draws almost never give, reach the fit), and ``preset_arch``
    draws candidates of the shipped spaces, which neither fit generator writes."""
    from nas.space import list_spaces, load_space

    def deep_mlp_only(archs) -> int:
        return sum(len(a.layers) >= 3 and all(la.mixer == "none" for la in a.layers) for a in archs)

    mixed = fit_draws(5, 40)
    assert mixed == fit_draws(5, 40) and mixed != fit_draws(6, 40)
    assert mixed[0] == random_archs(5, 1)[0]  # a random stack first, then a space's candidate, in turn
    assert deep_mlp_only(mixed) >= 2 and deep_mlp_only(random_archs(5, 40)) == 0
    presets = preset_archs(3, 30)
    assert presets == preset_archs(3, 30)
    spaces = [load_space(n) for n in list_spaces()]
    widths = {d for s in spaces for d in s.d_model.values()}
    assert {a.d_model for a in presets} <= widths
    for a in presets:
        for shape in SHAPES:
            assert launches(a, shape, 132)


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

    argv = ["predictor.py", "--gpu", "--dry-run", "--profile", "h200", "--out", str(tmp_path)]
    argv += ["--parts", "fit,held", "--fit-seed", "2", "--fit-start", "3", "--fit-archs", "2", "--archs", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    pr.main()
    data = json.loads((tmp_path / "predictor_rows.json").read_text())
    fitted = list({json.dumps(r["arch"], sort_keys=True): r["arch"] for r in data["fit_rows"]}.values())
    assert fitted == [a.to_dict() for a in fit_draws(2, 5)[3:]]  # the calibration's own draw
    held = list({json.dumps(r["arch"], sort_keys=True): r["arch"] for r in data["held_out_rows"]}.values())
    assert held == [a.to_dict() for a in preset_archs(3, 2)]  # the default held-out generator
    assert data["generators"]["held_out"] == "preset_arch"
    assert len(data["fit_rows"]) == 2 * len(SHAPES) and len(data["held_out_rows"]) == 2 * len(SHAPES)
    assert data["kernel_rows"] == data["check_rows"] == [] and data["seeds"]["fit_start"] == 3
    assert not list(tmp_path.glob("predictor_*_*.json")), "collecting writes no report"
    argv_random = [*argv, "--fit-draw", "random", "--held", "space", "--out", str(tmp_path / "r")]
    monkeypatch.setattr(sys, "argv", argv_random)
    pr.main()
    data = json.loads((tmp_path / "r" / "predictor_rows.json").read_text())
    fitted = list({json.dumps(r["arch"], sort_keys=True): r["arch"] for r in data["fit_rows"]}.values())
    assert fitted == [a.to_dict() for a in random_archs(2, 5)[3:]]
    assert data["generators"]["held_out"] == "space_arch"
    monkeypatch.setattr(sys, "argv", [*argv[:-10], "--parts", "fit,kernel"])
    with pytest.raises(SystemExit) as exit_:
        pr.main()
    assert exit_.value.code == 2 and "unknown kernel" in capsys.readouterr().err
