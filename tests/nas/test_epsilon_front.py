"""Accuracy differences below the test set's resolution do not make separate front points: the
displayed front, the knee and the exports use ε = 1 / the scored test targets (1 / test rows for
studies recorded before them; or the user's), the stored study and its hypervolume do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.trial import TrialState, create_trial

from nas.cli import main
from nas.latency import Latency, parse_shape
from nas.results.pareto import accuracy_epsilon, cheapest_best, epsilon_dominates, epsilon_front, front, pick
from nas.search import record
from nas.search.objectives import CATALOGUE
from nas.search.record import TrialRecord
from nas.search.setup import SearchSetup
from nas.search.study import open_study
from nas.spec import ArchSpec, LayerSpec, TrainSpec

ARCH = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)


def _study(
    tmp_path,
    test_size: int | None,
    *trials: tuple[float, float, float],
    test_targets: int | None = None,
    over_budget: bool = False,
):
    study = open_study("e", str(tmp_path / "e.journal"))
    setup = SearchSetup("s", "", "mqar", "auto", "h200", "1x256", test_size=test_size, test_targets=test_targets)
    record.write_study_setup(study, setup)
    for acc, lat, mem in trials:
        latency = Latency(lat, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"))
        r = TrialRecord(
            0,
            TrialState.COMPLETE,
            arch=ARCH,
            train=TrainSpec("adamw", 1e-3, 0.0, 0.0, 10, 8),
            arch_summary=ARCH.summary(),
            latency=latency,
            steps_done=10,
        )
        attrs = {**r.to_dict(), "memory": {"total_mb": mem}}
        over = {"constraints": [1.0]} if over_budget else {}  # a hard budget of the search broken
        study.add_trial(create_trial(values=[acc, lat, mem], user_attrs=attrs, system_attrs=over))
    return study


def _rec(acc: float, lat: float, mem: float) -> TrialRecord:
    return TrialRecord(0, TrialState.COMPLETE, values={"accuracy": acc, "latency_ms": lat, "memory_mb": mem})


def test_epsilon_dominance():
    eps = 1 / 512
    assert epsilon_dominates(_rec(0.9990, 1.0, 1.0), _rec(1.0, 2.0, 1.0), eps)  # as accurate within ε, faster
    assert not epsilon_dominates(_rec(0.99, 1.0, 1.0), _rec(1.0, 2.0, 1.0), eps)  # 0.01 is resolved
    assert not epsilon_dominates(_rec(1.0, 1.0, 1.0), _rec(0.9995, 1.0, 1.0), eps)  # equal within ε: neither
    assert epsilon_dominates(_rec(1.0, 1.0, 1.0), _rec(0.99, 1.0, 1.0), eps)


def test_front_knee_and_pick_merge_accuracies_the_test_set_cannot_tell_apart(tmp_path):
    # 0.9990 vs 1.0000 on 512 test rows: one step of 1/512 ≈ 0.00195 or less apart
    study = _study(tmp_path, 512, (1.0, 2.0, 1.0), (0.9990, 1.0, 1.0), (0.5, 0.5, 0.5))
    assert accuracy_epsilon(study) == pytest.approx(1 / 512)
    assert [r.accuracy for r in front(study)] == [0.9990, 0.5]
    assert [r.accuracy for r in front(study, 0.0)] == [1.0, 0.9990, 0.5]  # overridden: every point
    assert pick(study, "accuracy").accuracy == 0.9990  # the most accurate the test set can resolve
    assert pick(study, "accuracy", epsilon=0.0).accuracy == 1.0
    assert len(study.best_trials) == 3  # the stored study (and its hypervolume) is Optuna's, unchanged


def test_the_resolution_is_one_scored_target_not_one_row(tmp_path):
    """2 test rows of 36 scored tokens each: accuracy moves in steps of 1/72, so 0.5 and 0.014 are
    far apart (1 / rows would be 0.5 and merge them, the cheaper, far worse trial standing for both)."""
    study = _study(tmp_path, 2, (0.5, 2.0, 1.0), (1 / 72, 1.0, 1.0), test_targets=72)
    assert accuracy_epsilon(study) == pytest.approx(1 / 72)
    assert [r.accuracy for r in front(study)] == [0.5, 1 / 72]
    assert pick(study, "accuracy").accuracy == 0.5


def test_scored_targets_count_what_accuracy_is_computed_over():
    import torch

    from nas.tasks import IGNORE_INDEX, load_task
    from nas.tasks.base import Task

    mqar = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=8,n_test=5")
    assert mqar.scored_targets == int((mqar.y_test != IGNORE_INDEX).sum()) == 5 * 2  # a query per pair
    x = torch.zeros(3, 7, dtype=torch.int32)
    y = torch.full((3, 7), IGNORE_INDEX, dtype=torch.int32)
    y[:, 2:] = 1  # 5 scored positions a row
    tok = Task("t", {}, 4, 4, "token", x, y, x, y)
    assert tok.scored_targets == 15
    cls = Task("c", {}, 4, 3, "last", x, y[:, 0], x, torch.tensor([0, 1, 2], dtype=torch.int32))
    assert cls.scored_targets == 3


def test_a_front_with_no_feasible_trial_says_so_not_a_budget_of_none(tmp_path):
    from nas.results.pareto import PickError

    study = _study(tmp_path, 512, (1.0, 2.0, 1.0), (0.5, 1.0, 1.0), over_budget=True)
    assert front(study) == []
    with pytest.raises(PickError, match="no feasible trial on its front") as err:
        pick(study, "knee")
    assert "None" not in str(err.value) and "--trial N" in str(err.value)
    with pytest.raises(PickError, match="no front trial meets the budget"):
        pick(study, "knee", max_latency_ms=5.0)


def test_a_report_of_no_feasible_trial_prints_no_optuna_warning(tmp_path):
    import logging

    _study(tmp_path, 512, (1.0, 2.0, 1.0), over_budget=True)
    seen: list[logging.LogRecord] = []
    catcher = logging.Handler(logging.WARNING)
    catcher.emit = seen.append  # what Optuna's own stderr handler would print
    logging.getLogger("optuna").addHandler(catcher)
    try:
        out = tmp_path / "r.html"
        assert main(["report", "--study", "e", "--storage", str(tmp_path / "e.journal"), "--out", str(out)]) == 0
    finally:
        logging.getLogger("optuna").removeHandler(catcher)
    assert not [r.getMessage() for r in seen if "feasible" in r.getMessage()]
    assert out.exists()


def test_a_study_that_recorded_no_test_size_keeps_the_plain_front(tmp_path):
    study = _study(tmp_path, None, (1.0, 2.0, 1.0), (0.9990, 1.0, 1.0))
    assert accuracy_epsilon(study) == 0.0 and len(front(study)) == 2


def test_report_and_export_accept_an_epsilon_and_refuse_a_bad_one(tmp_path, capsys):
    study = _study(tmp_path, 512, (1.0, 2.0, 1.0), (0.9990, 1.0, 1.0))
    storage = str(tmp_path / "e.journal")
    out = tmp_path / "r.html"
    assert main(["report", "--study", "e", "--storage", storage, "--out", str(out), "--accuracy-epsilon", "0"]) == 0
    assert "2 on the front" in out.read_text()
    assert main(["report", "--study", "e", "--storage", storage, "--out", str(out)]) == 0
    assert "1 on the front" in out.read_text() and "count as equal" in out.read_text()
    capsys.readouterr()
    for bad in ("1.5", "-0.1", "x"):
        assert main(["report", "--study", "e", "--storage", storage, "--accuracy-epsilon", bad]) == 2
        assert (
            main(
                [
                    "export",
                    "--study",
                    "e",
                    "--storage",
                    storage,
                    "--out",
                    str(tmp_path / "x"),
                    "--accuracy-epsilon",
                    bad,
                ]
            )
            == 2
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all("accuracy-epsilon" in line for line in err)
    assert len(study.get_trials()) == 2


def test_export_says_when_a_more_accurate_trial_was_counted_level(tmp_path, capsys, monkeypatch):
    """20 scored targets: ε = 0.05. ``--pick accuracy`` takes the 0.600 trial over the 0.650 one
    (level within ε, cheaper), as documented, but said nothing of it (found by a new-user audit)."""

    def bundle(study, chosen, out, **_):  # these trials hold no weights: the choice is what is tested
        Path(out).mkdir()
        (Path(out) / "arch.json").write_text(json.dumps({"metrics": {"accuracy": chosen.accuracy}}))
        return Path(out)

    monkeypatch.setattr("nas.results.export.export", bundle)
    _study(tmp_path, 20, (0.60, 0.010, 1.0), (0.65, 0.020, 1.0), test_targets=20)
    storage = str(tmp_path / "e.journal")
    argv = ["export", "--study", "e", "--storage", storage, "--pick", "accuracy", "--out"]
    assert main([*argv, str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "exported trial 0 " in out, out
    assert "note: trial 1 is more accurate (0.650) by no more than the study's resolution (ε = 0.05)" in out, out
    assert main([*argv, str(tmp_path / "b"), "--accuracy-epsilon", "0"]) == 0
    out = capsys.readouterr().out
    assert "exported trial 1 " in out and "note:" not in out, out
    assert main([*argv, str(tmp_path / "c"), "--max-latency-ms", "0.015"]) == 0  # the other is over the budget
    assert "note:" not in capsys.readouterr().out


def test_counts_say_trained_not_completed_and_name_the_failures(tmp_path, capsys):
    """``nas studies`` and the report counted budget breakers (COMPLETE, never trained) as
    "complete", and the report never mentioned that most trials had diverged (a new-user audit)."""
    from nas.results.report import write_html

    study = _study(tmp_path, 20, (0.60, 0.010, 1.0), (0.65, 0.020, 1.0), test_targets=20)
    skipped = TrialRecord(0, TrialState.COMPLETE, arch=ARCH, arch_summary=ARCH.summary(), skipped_training="params")
    over = {"constraints": [1.0]}  # broke --max-params: recorded, never trained
    study.add_trial(create_trial(values=[0.0, 0.5, 9.0], user_attrs=skipped.to_dict(), system_attrs=over))
    for why in ("diverged: loss became NaN/inf within steps 1-16", "diverged: loss reached 1e+09", "interrupted"):
        study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"failure": why}))
    storage = str(tmp_path / "e.journal")
    assert main(["studies", "--storage", storage]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert dict(zip(header.split("\t"), row.split("\t"), strict=True)) | {"started": "-"} == {
        "study": "e",
        "trained": "2",
        "truncated": "0",
        "over_budget": "1",
        "pruned": "0",
        "failed": "3",
        "running": "0",
        "total": "6",
        "started": "-",
        "proxy_rho": "-",  # never verified
    }
    text = write_html(study, tmp_path / "r.html").read_text()
    assert "2 trained trials, 1 over a budget (not trained), 3 failed (2 diverged, 1 interrupted)" in text


def test_the_pareto_sweep_keeps_what_the_pairwise_definition_keeps():
    """``pareto_set`` compares each trial with the set kept so far only (the progress line asks
    for the front after every trial of a long search); it keeps exactly the trials no other one
    dominates, with ties, duplicates, a trial missing a value, and the input order kept."""
    import random

    from nas.results.pareto import pareto_set
    from nas.search.objectives import CATALOGUE

    rng = random.Random(0)
    two = (CATALOGUE["accuracy"], CATALOGUE["latency"])
    three = (*two, CATALOGUE["memory"])
    for case in range(200):
        objectives = three if case % 2 else two
        n = rng.randrange(1, 40)
        grid = rng.choice([3, 10, 1000])  # coarse grids make ties and duplicates common
        trials = [_rec(rng.randrange(grid) / grid, rng.randrange(1, grid), rng.randrange(1, grid)) for _ in range(n)]
        if case % 5 == 0:
            trials.append(TrialRecord(0, TrialState.COMPLETE, values={"accuracy": 0.5}))  # costs unknown
        rng.shuffle(trials)
        brute = [r for r in trials if not any(epsilon_dominates(o, r, 0.0, objectives, spread=False) for o in trials)]
        assert [id(r) for r in pareto_set(trials, objectives)] == [id(r) for r in brute], case


def test_a_chain_of_noisy_trials_never_drops_the_most_accurate_one():
    """The default study cut to 4 trials (a new user's run): all-attention 0.894 ±0.881 (two seeds
    apart), all-linear 0.127 ±0.392, a hybrid 0.191 ±0.009 and the search's 0.980 ±0.015. The noisy
    all-attention trial is level with 0.980 and cheaper, and the all-linear one is level with it and
    cheaper still; compared with every trial, 0.980 went with all-attention, and the front showed
    0.127 alone. A trial is dropped only in favour of one that stays."""

    def rec(number: int, acc: float, spread: float, lat: float) -> TrialRecord:
        values = {"accuracy": acc, "latency_ms": lat, "memory_mb": 1.0}
        return TrialRecord(number, TrialState.COMPLETE, values=values, accuracy_interval=spread)

    trials = [rec(0, 0.894, 0.881, 0.0948), rec(1, 0.127, 0.392, 0.0797), rec(2, 0.191, 0.009, 0.0835)]
    trials.append(rec(3, 0.980, 0.015, 0.102))
    kept = epsilon_front(trials, 1 / 2048)
    assert 3 in [r.number for r in kept], "the most accurate trial stays"
    for r in trials:  # every trial left out is ε-dominated by one on the front
        assert r in kept or any(epsilon_dominates(o, r, 1 / 2048) for o in kept), r.number
    assert [r.number for r in epsilon_front(trials, 0.0, spread=False)] == [0, 1, 2, 3]  # the plain front
    # the export's pick: the noisy all-attention baseline is cheaper, and within its own spread of
    # 0.980, but 0.980's lead is past 0.980's spread: the sure better trial is taken
    assert cheapest_best(trials, 1 / 2048, CATALOGUE["latency"]).number == 3
    assert cheapest_best(trials, 0.1, CATALOGUE["latency"]).number == 0  # a coarse test set: level
