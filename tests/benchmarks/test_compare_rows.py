"""benchmarks/compare_rows.py: pairs two runs' forwards by (architecture, shape), split by padding."""

from __future__ import annotations

import json

from benchmarks import compare_rows


def _row(d: int, heads: int, shape: str, ms: float) -> dict:
    layer = {"mixer": "attention", "heads": heads, "feature_map": None}
    return {"arch": {"d_model": d, "layers": [layer]}, "shape": shape, "ms": ms}


def test_ratios_by_padding_and_shape(tmp_path) -> None:
    old = {"fit_rows": [_row(96, 2, "1x256", 2.0), _row(128, 2, "1x256", 1.0)], "check_rows": []}
    new = {
        "fit_rows": [_row(96, 2, "1x256", 1.5), _row(128, 2, "1x256", 1.1)],
        "check_rows": [_row(64, 1, "1x256", 9.0)],  # no partner in the old run: left out
    }
    result = compare_rows.compare(old, new)
    assert result["summary"]["padded"]["median"] == 0.75  # head dim 48 runs as 64
    assert abs(result["summary"]["not padded 1x256"]["median"] - 1.1) < 1e-12  # head dim 64
    assert len(result["pairs"]) == 2
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for p, data in zip(paths, (old, new), strict=True):
        p.write_text(json.dumps(data))
    assert compare_rows.main([*map(str, paths), "--out", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["summary"]["padded"]["n"] == 1


def test_ratios_by_identity_linear_attention() -> None:
    """``by="identity"``: rows with any identity-map linear-attention layer apart from the rest."""

    def row(feature_map: str | None, ms: float) -> dict:
        layers = [{"mixer": "attention", "heads": 2, "feature_map": None}]
        if feature_map:
            layers.append({"mixer": "linear_attention", "heads": 2, "feature_map": feature_map})
        return {"arch": {"d_model": 128, "layers": layers, "tag": ms}, "shape": "8x1024", "ms": ms}

    old = {"fit_rows": [row("identity", 4.0), row("elu+1", 2.0), row(None, 1.0)]}
    new = {"fit_rows": [row("identity", 4.0) | {"ms": 3.0}, row("elu+1", 2.0) | {"ms": 2.2}, row(None, 1.0)]}
    summary = compare_rows.compare(old, new, by="identity")["summary"]
    assert summary["identity"]["median"] == 0.75 and summary["identity 8x1024"]["n"] == 1
    assert summary["no identity"]["n"] == 2 and summary["no identity"]["max"] == 1.1
    linear = compare_rows.compare(old, new, by="linear")["summary"]  # any linear attention: both maps
    assert linear["linear attention"]["n"] == 2 and linear["linear attention"]["min"] == 0.75
    assert linear["no linear attention"]["n"] == 1 and linear["no linear attention"]["median"] == 1.0
