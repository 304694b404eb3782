"""The accuracy's error bar and the default pick: a trial trained as a population (seeds × learning
rates) records its accuracy's spread over seeds; the final table, the report, the export card and
``arch.json`` show it; accuracies within the larger of the test set's resolution and either
trial's spread count as level on the displayed front; and ``nas export`` takes, by default, the
cheapest feasible trial level with the best feasible accuracy, which the report and table mark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.trial import TrialState, create_trial

from nas.cli import main
from nas.commands._front import front_table as _front_table
from nas.latency import Latency, parse_shape
from nas.results.pareto import epsilon_dominates, front, level, pair_epsilon, pick
from nas.results.report import figures, front_table_html, write_html
from nas.search import record
from nas.search.record import TrialRecord
from nas.search.setup import SearchSetup
from nas.search.study import open_study
from nas.spec import ArchSpec, LayerSpec, TrainSpec

ARCH = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)
TRAIN = TrainSpec("adamw", 1e-3, 0.0, 0.0, 10, 8)
POPULATION = {
    "seeds": [0, 1, 2],
    "lr_multipliers": [0.5, 1.0, 2.0],
    "lrs": [5e-4, 1e-3, 2e-3],
    "accuracies": [[0.5, 0.52, None], [0.982, 0.99, 0.986], [0.9, 0.91, 0.92]],  # None: that variant diverged
    "best_lr": 1e-3,
    "weights": {"seed": 1, "lr": 1e-3, "accuracy": 0.99},
}
# The README's default search on a 2-core CPU, at --max-latency-ms 0.05: trials 10, 16 and 5 of its
# front (accuracy, its spread over seeds, latency ms, memory MiB). The knee, min-max scaling both
# axes, took the 0.192 trial; the 0.986 one met the same budget.
README_FRONT = ((0.986, 0.004, 0.0323, 0.85), (0.192, 0.01, 0.0239, 0.79), (0.034, None, 0.0178, 0.66))


def _trial(acc: float, interval: float | None, lat: float, mem: float, weights: str | None = None) -> TrialRecord:
    return TrialRecord(
        0,
        TrialState.COMPLETE,
        values={"accuracy": acc, "latency_ms": lat, "memory_mb": mem},
        arch=ARCH,
        train=TRAIN,
        arch_summary=ARCH.summary(),
        params=1234,
        latency=Latency(lat, 0.0, "predicted", "h200", "bf16", parse_shape("1x256")),
        memory={"total_mb": mem},
        steps_done=10,
        weights_artifact=weights,
        trained_accuracy=acc,
        accuracy_interval=interval,
        population=POPULATION if interval else None,
    )


def _study(tmp_path: Path, *trials: tuple[float, float | None, float, float], targets: int = 2048):
    """A study of ``trials`` (accuracy, interval, latency ms, memory MiB), scored on ``targets``
    test targets (ε = 1 / targets), as nas search records them."""
    study = open_study("i", str(tmp_path / "i.journal"))
    setup = SearchSetup("s", "", "mqar", "auto", "h200", "1x256", test_size=512, test_targets=targets)
    record.write_study_setup(study, setup)
    for acc, interval, lat, mem in trials:
        attrs = _trial(acc, interval, lat, mem).to_dict()
        study.add_trial(create_trial(values=[acc, lat, mem], user_attrs=attrs))
    return study


@pytest.fixture
def no_bundle(monkeypatch):
    """``nas export`` with the choice kept and the bundle reduced to its accuracy (these trials hold no weights)."""

    def bundle(study, chosen, out, **_):
        Path(out).mkdir()
        (Path(out) / "arch.json").write_text(json.dumps({"metrics": {"accuracy": chosen.accuracy}}))
        return Path(out)

    monkeypatch.setattr("nas.results.export.export", bundle)


def test_two_accuracies_are_level_within_the_resolution_or_either_trials_spread():
    eps = 1 / 2048
    spread, cheap = _trial(0.986, 0.004, 2.0, 1.0), _trial(0.982, None, 1.0, 1.0)
    assert pair_epsilon(spread, cheap, eps) == pair_epsilon(cheap, spread, eps) == 0.004  # either trial's
    assert level(spread, cheap, eps)  # 0.004 apart: at the spread (0.986 - 0.982 > 0.004 in floating point)
    assert epsilon_dominates(cheap, spread, eps)  # level and faster
    assert not level(spread, cheap, eps, spread=False)  # --accuracy-epsilon: its ε alone
    assert not epsilon_dominates(cheap, spread, eps, spread=False)
    far = _trial(0.975, 0.004, 1.0, 1.0)  # 0.011 below: beyond both trials' spread
    assert not level(spread, far, eps) and not epsilon_dominates(far, spread, eps)
    assert pair_epsilon(_trial(0.9, None, 1.0, 1.0), cheap, eps) == eps  # no spread: the resolution


def test_the_displayed_front_merges_trials_within_a_spread_and_an_override_does_not(tmp_path):
    study = _study(tmp_path, (0.986, 0.004, 0.040, 1.0), (0.983, None, 0.030, 1.0), (0.5, None, 0.01, 1.0))
    assert [r.accuracy for r in front(study)] == [0.983, 0.5]  # 0.986 ±0.004 is level with the faster 0.983
    assert [r.accuracy for r in front(study, 0.0)] == [0.986, 0.983, 0.5]  # the plain front
    assert [r.accuracy for r in front(study, 0.001)] == [0.986, 0.983, 0.5]  # an override is the only ε
    assert len(study.best_trials) == 3  # the stored study (and its hypervolume) is Optuna's, unchanged


def test_the_default_pick_takes_the_accurate_trial_the_knee_passed_over(tmp_path, capsys, no_bundle):
    study = _study(tmp_path, *README_FRONT)
    assert pick(study, "knee", max_latency_ms=0.05).accuracy == 0.192  # the bug: min-max scaling both axes
    assert pick(study, max_latency_ms=0.05).accuracy == 0.986
    storage = str(tmp_path / "i.journal")
    argv = ["export", "--study", "i", "--storage", storage, "--max-latency-ms", "0.05", "--out"]
    assert main([*argv, str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "exported trial 0 (--pick cheapest-best): " in out and "accuracy 0.986 ±0.004, " in out, out
    # what nas export takes with no flags is marked: the table's star, the report's star and note
    table = _front_table(study)
    column = {str(c.header): list(c._cells) for c in table.columns}  # noqa: SLF001
    assert column["trial"] == ["★ 0", "1", "2"] and column["acc"][0] == "0.986 ±0.004"
    assert "★ nas export's pick: the cheapest trial within ε of the best accuracy (ε: 0.00049 or" in str(table.caption)
    (star,) = [a for a in figures(study)["front2d"].layout.annotations if a.text.startswith("★")]
    assert (star.text, star.x, star.y) == ("★ nas export picks trial 0", 0.0323, 0.986)
    rows = front_table_html(study).split("<tr>")
    assert "nas export picks this" in rows[2] and "<td>0.986 ±0.004</td>" in rows[2]  # the header, then trial 0
    assert "nas export picks" not in "".join(rows[3:])
    page = write_html(study, tmp_path / "r.html").read_text()
    assert "★ nas export picks trial 0 (the cheapest trial within ε of the best accuracy)" in page


def test_the_default_pick_is_the_cheapest_level_with_the_best_and_says_what_it_passed_over(tmp_path, capsys, no_bundle):
    """0.990 ±0.006 and 0.986 ±0.002 are level (0.004 apart, within the first's spread): the faster
    one is taken and the more accurate one named; an ε of 0 takes the more accurate one."""
    study = _study(tmp_path, (0.990, 0.006, 0.05, 1.0), (0.986, 0.002, 0.03, 1.0), (0.9, None, 0.01, 1.0))
    assert [r.number for r in front(study)] == [1, 2] and pick(study).number == 1
    storage = str(tmp_path / "i.journal")
    argv = ["export", "--study", "i", "--storage", storage, "--out"]
    assert main([*argv, str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "exported trial 1 " in out, out
    assert "note: trial 0 is more accurate (0.990 ±0.006) by no more than the spread over seeds (ε = 0.006)" in out
    assert main([*argv, str(tmp_path / "b"), "--accuracy-epsilon", "0"]) == 0
    out = capsys.readouterr().out
    assert "exported trial 0 " in out and "note:" not in out, out
    assert main([*argv, str(tmp_path / "c"), "--pick", "knee"]) == 0  # the knee is still there, by name
    assert "exported trial 1 (--pick knee)" in capsys.readouterr().out


def test_a_level_trial_can_stand_for_the_pick_on_the_displayed_front(tmp_path):
    """1.0 ±0.002, 0.998 ±0.002 and 0.996 ±0.002: each is level with its neighbour, the ends are not.
    On the displayed front the cheapest stands for the middle one, not for the best, which it is not
    level with (levelness does not chain); the pick, the cheapest within the best's spread of it, is
    the middle one, listed below the front and marked."""
    study = _study(tmp_path, (1.0, 0.002, 0.03, 1.0), (0.998, 0.002, 0.02, 1.0), (0.996, 0.002, 0.01, 1.0))
    assert [r.number for r in front(study)] == [0, 2]
    assert pick(study).number == 1
    column = {str(c.header): list(c._cells) for c in _front_table(study).columns}  # noqa: SLF001
    assert column["trial"] == ["0", "2", "★ 1"]
    html = front_table_html(study)
    assert "not on the front (a cheaper trial level with it stands for it); nas export picks this" in html


def test_the_report_draws_the_accuracy_spread_as_vertical_error_bars(tmp_path):
    study = _study(tmp_path, *README_FRONT)
    figs = figures(study)
    best = next(t for t in figs["front2d"].data if t.name.startswith("Pareto front"))
    assert list(best.y) == [0.986, 0.192, 0.034] and list(best.error_y.array) == [0.004, 0.01, 0.0]
    assert list(best.error_y.arrayminus) == [0.004, 0.01, 0.0]
    assert list(next(t for t in figs["front3d"].data if t.name == "Pareto front").error_z.array) == [0.004, 0.01, 0.0]
    page = write_html(study, tmp_path / "r.html").read_text()
    assert '"error_y":{"array":[0.004,0.01,0.0],"arrayminus":[0.004,0.01,0.0]' in page.replace(" ", "")
    hover = best.hovertext[0]
    assert "accuracy 0.986 ±0.004" in hover and "accuracy: mean of 3 seeds at lr 1e-03, the best of 3" in hover
    assert "or either trial's spread over seeds, the larger, count as equal on the front" in page
    (tmp_path / "wide").mkdir()
    wide = _study(tmp_path / "wide", (0.9, 0.3, 0.01, 1.0), (0.1, 0.3, 0.005, 1.0))  # bars cut at 1 and 0
    bars = next(t for t in figures(wide)["front2d"].data if t.name.startswith("Pareto front")).error_y
    assert list(bars.array) == pytest.approx([0.1, 0.3]) and list(bars.arrayminus) == pytest.approx([0.3, 0.1])
    (tmp_path / "plain").mkdir()
    plain = _study(tmp_path / "plain", (0.9, None, 0.01, 1.0))  # a study written before: no bars
    assert next(t for t in figures(plain)["front2d"].data if t.name.startswith("Pareto front")).error_y.array is None


@pytest.mark.slow  # an export: ONNX written and checked in onnxruntime
def test_the_bundle_s_card_and_arch_json_carry_the_spread(tmp_path, capsys):
    from optuna.artifacts import upload_artifact
    from safetensors.torch import save_file

    from nas.models import build
    from nas.search.storage import open_artifact_store
    from nas.spec import arch_hash

    study = open_study("w", str(tmp_path / "w.journal"))
    storage = str(tmp_path / "w.journal")
    weights = tmp_path / "w.safetensors"
    save_file(
        {k: v.contiguous() for k, v in build(ARCH, seed=0).state_dict().items()},
        str(weights),
        metadata={"arch_hash": arch_hash(ARCH)},
    )
    store = open_artifact_store(storage)
    artifact = upload_artifact(artifact_store=store, file_path=str(weights), study_or_trial=study)
    for interval in (0.004, None):  # trained as a population, and as one run (an older trial)
        attrs = _trial(0.986, interval, 0.0323, 0.85, weights=artifact).to_dict()
        study.add_trial(create_trial(values=[0.986, 0.0323, 0.85], user_attrs=attrs))
    assert main(["export", "--study", "w", "--storage", storage, "--trial", "0", "--out", str(tmp_path / "b")]) == 0
    assert main(["export", "--study", "w", "--storage", storage, "--trial", "1", "--out", str(tmp_path / "o")]) == 0
    assert "accuracy 0.986 ±0.004, " in capsys.readouterr().out
    bundle = json.loads((tmp_path / "b" / "arch.json").read_text())
    assert bundle["accuracy_interval"] == 0.004 and bundle["population"] == POPULATION
    assert bundle["metrics"]["accuracy"] == 0.986
    card = (tmp_path / "b" / "card.md").read_text()
    assert (
        "| accuracy | 0.9860 ± 0.0040 (mean of 3 seeds at lr 1e-03, the best of 3 learning rates; these weights: "
        "seed 1, lr 1e-03, accuracy 0.9900) |" in card
    ), card
    single = json.loads((tmp_path / "o" / "arch.json").read_text())
    assert single["accuracy_interval"] is None and single["population"] is None
    assert "| accuracy | 0.9860 |" in (tmp_path / "o" / "card.md").read_text()
