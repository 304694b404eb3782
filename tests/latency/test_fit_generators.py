"""The calibration's architecture generators: what the fit draws (``random_arch`` over
``FIT_RANGES``), the check set (``stacked_arch``), the first ranges the shipped H200 rows were drawn
from (``FIT_RANGES_V1``), and what a budget left out (``budget_cut``)."""

from __future__ import annotations

import json
from pathlib import Path

from nas.latency import launches
from nas.latency.calibrate import (
    FIT_RANGES,
    FIT_RANGES_V1,
    SHAPES,
    budget_cut,
    kernel_grid,
    random_archs,
    stacked_archs,
)
from nas.spec import ArchSpec, LayerSpec

ROWS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "predictor_rows_h200.json"


def test_the_fit_draws_what_a_users_yaml_can_produce():
    """Over 300 draws: widths that no tile of 64 (or 16) divides, the smallest (16, 24) and about
    as many at 16-64 as at 128-512 (log-uniform), depths past 8 up to 12, head counts past 16,
    vocabularies below 64 and above 8192 up to 50257, MLP ratios off the usual grid, conv widths
    past 8 — and every value inside the ranges."""
    archs = random_archs(11, 300)
    widths = {a.d_model for a in archs}
    assert {16, 24} <= widths and all(16 <= d <= 512 and d % 8 == 0 for d in widths)
    small = sum(a.d_model <= 64 for a in archs)
    assert 0.6 < small / sum(a.d_model >= 128 for a in archs) < 1.6
    depths = {len(a.layers) for a in archs}
    vocabs = [a.vocab_size for a in archs]
    layers = [layer for a in archs for layer in a.layers]
    assert any(d % 16 for d in widths)
    assert max(depths) == 12 and min(depths) == 1
    assert min(vocabs) < 64 and max(vocabs) > 8192 and all(32 <= v <= 50257 for v in vocabs)
    assert any(layer.heads > 16 for layer in layers)
    assert any(layer.mlp_ratio not in (0.0, 1.0, 1.5, 2.0, 3.0, 4.0) for layer in layers)
    assert any(layer.short_conv > 8 for layer in layers)
    assert {layer.mixer for layer in layers} == {"attention", "linear_attention", "none"}


def test_every_drawn_forward_launches_only_classes_the_kernel_grid_times():
    """A fit row whose kernel class the grid never timed is left out of the fit: none may be."""
    timed = {case.launch(132).cls for case in kernel_grid()}
    for arch in random_archs(3, 120) + stacked_archs(4, 60):
        for shape in SHAPES:
            assert {w.cls for w in launches(arch, shape, 132)} <= timed, arch


def test_the_check_set_repeats_one_block():
    for arch in stacked_archs(1001, 40):
        assert len(set(arch.layers)) == 1
        assert FIT_RANGES.depth[0] <= len(arch.layers) <= FIT_RANGES.depth[1]


def test_the_first_ranges_still_draw_the_shipped_h200_rows():
    """The shipped H200 calibration's rows are the first ranges' draws at seeds 1 (fit) and 1001
    (check), so the rows and the benchmarks built on them stay reproducible."""
    data = json.loads(ROWS.read_text())
    for key, seed in (("fit_rows", data["seeds"]["fit"]), ("check_rows", data["seeds"]["check"])):
        archs = list({json.dumps(r["arch"], sort_keys=True): r["arch"] for r in data[key]}.values())
        assert [a.to_dict() for a in random_archs(seed, len(archs), FIT_RANGES_V1)] == archs


def test_budget_cut_names_only_the_parts_that_lost_rows():
    parts = {"kernels": ([1, 2, 3], [{}, {}]), "fit forwards": ([1, 2], [{}, {}])}
    assert budget_cut(parts) == {"kernels": (1, 3)}
    assert budget_cut({"x": ([], [])}) == {}


def test_the_fused_kernels_unaligned_rows_are_features_and_cublas_has_only_k16():
    """K % 16, K % 8 and N % 8 on the fused kernel's routes are priced by their own features
    (``_launches._linear``); cuBLAS, taken only where every row is 16-byte aligned, carries the
    K % 16 one where it takes such rows (its kernel there is slower as well)."""
    from nas.latency._launches import FEATURES, _linear

    names = FEATURES["linear"]
    k16, k8, n8 = (names.index(f) for f in ("k_steps_k16", "k_steps_k8", "out_n8"))
    odd = _linear("x", 16384, 1003, 40, 132, activation="gelu")
    assert odd.cls != "linear.cublas" and odd.x[k16] > 0 and odd.x[k8] == 0 and odd.x[n8] > 0
    down = _linear("x", 16384, 256, 2417, 132, residual=True)
    assert down.cls != "linear.cublas" and down.x[k16] > 0 and down.x[k8] > 0 and down.x[n8] == 0
    plain = _linear("x", 16384, 1024, 256, 132)
    assert plain.cls == "linear.cublas" and plain.x[k16] == plain.x[k8] == plain.x[n8] == 0
    routed = _linear("x", 16384, 120, 40, 132)  # K % 16 but rows aligned: cuBLAS, K % 16 alone
    assert routed.cls == "linear.cublas" and routed.x[k16] > 0 and routed.x[k8] == routed.x[n8] == 0


def test_the_kernel_grid_times_every_alignment_feature_a_forward_meets():
    """The model pads every width but the residual one, so only a residual width off a multiple
    of 8 gives a launch the alignment features; each (class, feature) such a forward launches
    (every readout, mixer and MLP) is non-zero in some kernel-grid row, so the prior has a timing
    for it. The fit's generator, in steps of 8, meets only cuBLAS's K % 16."""
    from nas.latency._launches import FEATURES
    from nas.latency.calibrate import ODD_WIDTHS

    names = FEATURES["linear"]
    extra = [names.index(f) for f in ("k_steps_k16", "k_steps_k8", "out_n8")]

    def seen(work):
        return {(w.cls, i) for w in work if w.cls.startswith("linear.") for i in extra if w.x[i] > 0}

    timed = seen(case.launch(132) for case in kernel_grid())
    drawn = set().union(*(seen(launches(a, s, 132)) for a in random_archs(9, 80) for s in SHAPES))
    assert {cls for cls, _ in drawn} == {"linear.cublas"} and drawn <= timed  # d % 16 = 8: cuBLAS's K % 16
    odd = [
        ArchSpec(
            d,
            (
                LayerSpec("attention", 2, None, 4, ratio, "gelu", "rmsnorm"),
                LayerSpec("linear_attention", 2, "elu+1", 0, 1.5, "silu", "layernorm"),
            ),
            1001,
            1001 if readout == "token" else 7,
            readout,
        )
        for d in (*ODD_WIDTHS, 52, 124)
        for ratio in (0.0, 2.7)
        for readout in ("token", "last")
    ]
    met = set().union(*(seen(launches(a, s, 132)) for a in odd for s in SHAPES))
    assert met and met <= timed, sorted(met - timed)


def test_a_calibration_from_before_the_alignment_features_loads_with_them_at_zero(tmp_path):
    """A profile whose linear classes hold the 7 numbers written before 2026-12-07, or the 10 written
    before the misaligned read, still loads, the later features read as 0; any other count is refused."""
    import pytest
    import yaml

    from hardware_profiles import ProfileError, load_profile
    from nas.latency._model import KernelModel

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "hardware_profiles" / "h100_sxm.yaml").read_text())
    coefficients = raw["calibrated"]["kernel_model"]["coefficients"]
    assert len(coefficients["linear.short_k"]) == 11
    old = tmp_path / "old.yaml"
    for kept in (10, 7):
        for cls in [c for c in coefficients if c.startswith("linear.")]:
            coefficients[cls] = coefficients[cls][:kept]
        old.write_text(yaml.safe_dump(raw))
        model = KernelModel.from_dict(load_profile(str(old)).calibrated.kernel_model)
        got = model.coefficient("linear.short_k")
        assert len(got) == 11 and got[kept:] == (0.0,) * (11 - kept)
        assert got[:kept] == tuple(coefficients["linear.short_k"])
    for wrong in (6, 8, 9):
        coefficients["linear.short_k"] = [0.5] * wrong
        old.write_text(yaml.safe_dump(raw))
        with pytest.raises(ProfileError, match="must hold 11 numbers"):
            load_profile(str(old))
