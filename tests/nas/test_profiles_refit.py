"""``nas profiles refit``: the kernel model refitted on the CPU from the timing rows of one or
several ``nas profiles calibrate --rows`` files (leases, machines) and written into a profile;
bad rows are one line, exit 2, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from nas.cli import main

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "benchmarks" / "results" / "predictor_rows_h200.json"  # an H200 run's rows (calibrate --rows)


@pytest.fixture
def profile(tmp_path) -> Path:
    """A copy of the shipped h200 profile: the refit writes next to it, never into the package."""
    copy = tmp_path / "h200.yaml"
    shutil.copy(ROOT / "hardware_profiles" / "h200.yaml", copy)
    return copy


def _rows(tmp_path: Path, name: str, run: str | None = None, **changes) -> Path:
    """The H200 rows with ``changes``; ``run``: as another timing run (its rows' run id)."""
    data = json.loads(ROWS.read_text())
    data.update(changes)
    if run is not None:
        for key in ("fit_rows", "check_rows", "held_out_rows"):
            data[key] = [{**row, "run": run} for row in data.get(key) or ()]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_one_run_refits_and_writes_a_profile_that_predicts(tmp_path, profile, capsys):
    out = tmp_path / "out.yaml"
    before = profile.read_bytes()
    assert main(["profiles", "refit", "--rows", str(ROWS), "--profile", str(profile), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    refit = load_profile(out)
    rows = json.loads(ROWS.read_text())
    assert refit.calibrated.kernel_model_json is not None and refit.calibrated.interval > 0
    assert refit.calibrated.get("kernels_fingerprint") == rows["kernels_fingerprint"]
    assert refit.calibrated.get("date") == rows["date"]
    assert f"interval ±{refit.calibrated.interval:.1%}" in text and "from 1 run(s)" in text
    assert profile.read_bytes() == before  # --out: the profile itself is left as it was


def test_two_runs_pool_and_each_is_predicted_from_the_other(tmp_path, profile, capsys):
    later = _rows(tmp_path, "lease2.json", run="2026-12-07 10:00:00", date="2026-12-07")
    out = tmp_path / "out.yaml"
    assert (
        main(["profiles", "refit", "--rows", str(ROWS), str(later), "--profile", str(profile), "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    refit = load_profile(out)
    assert "from 2 run(s)" in text and "run 2026-12-07 10:00:00 from the others: " in text
    assert "across_runs" in refit.calibrated.check and refit.calibrated.get("date") == "2026-12-07"


def test_rows_of_named_generators_bound_the_interval_each(tmp_path, profile, capsys):
    """A rows file that names its generators tags each row with its own: a generator with enough
    rows gets its own held-out 95th percentile, the profile's interval is the widest, and the refit
    prints each."""
    named = _rows(tmp_path, "named.json", generators={"fit": "random_arch", "check": "stacked_arch"})
    out = tmp_path / "out.yaml"
    assert main(["profiles", "refit", "--rows", str(named), "--profile", str(profile), "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    line = text[text.index("interval by held-out set: ") :]
    assert "random_arch ±" in line  # 108 rows: its own; the 54 check rows join the untagged (pooled)
    widths = [float(w.split("%")[0]) / 100 for w in line.split("±")[1:3]]
    assert load_profile(out).calibrated.interval == pytest.approx(max(widths), abs=1e-3)


BAD = [
    ("missing-file", lambda tmp: [str(tmp / "none.json")], "cannot read it"),
    ("not-json", lambda tmp: [str(_text(tmp / "x.json", "{"))], "not JSON"),
    ("not-rows", lambda tmp: [str(_text(tmp / "y.json", "{}"))], "not a nas profiles calibrate --rows file"),
    ("one-run-twice", lambda tmp: [str(ROWS), str(ROWS)], "give each timing run once"),
    ("other-gpu", lambda tmp: [str(ROWS), str(_rows(tmp, "b.json", sm_count=114))], "sm_count 114, but"),
    (
        "other-kernels",
        lambda tmp: [str(ROWS), str(_rows(tmp, "c.json", kernels_fingerprint="0" * 12))],
        "pool the rows",
    ),
]


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("files", "words"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_rows_one_line_exit_2_nothing_written(tmp_path, profile, capsys, files, words):
    out = tmp_path / "out.yaml"
    assert main(["profiles", "refit", "--rows", *files(tmp_path), "--profile", str(profile), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not out.exists()


def test_a_profile_of_another_gpu_is_refused(tmp_path, capsys):
    out = tmp_path / "out.yaml"
    assert main(["profiles", "refit", "--rows", str(ROWS), "--profile", "l4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--profile l4 describes" in err and not out.exists()
