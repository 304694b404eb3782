"""``nas verify``: rank correlations against hand-computed values, the stored rows (merged, typed),
seeds that repeat, and end to end: rows stored, a repeat trains the same, the report's scatter,
the card's numbers, bad input → one line, exit 2, storage bytes unchanged."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import types
from pathlib import Path

import optuna
import pytest

from nas.cli import main
from nas.results.fidelity import Correlation, Fidelity, rank_correlation
from nas.results.verify import long_recipe, training_seeds
from nas.search.record import Verified, VerifySettings, verified, verify_settings, write_verified
from nas.spec import TrainSpec

# ---------------------------------------------------------------- rank correlations

# (x, y, spearman, kendall): worked by hand. With ties y = 5 6 7 8 7 ranks 1 2 3.5 5 3.5 against
# x's 1..5: ρ = Σdxdy / √(Σdx² Σdy²) = 8 / √(10 · 9.5); τ-b: 8 concordant, 1 discordant, 1 pair
# tied in y, so (8 - 1) / √(10 · 9).
CASES = [
    pytest.param([1, 2, 3], [10, 20, 30], 1.0, 1.0, id="same-order"),
    pytest.param([1, 2, 3, 4], [0.9, 0.8, 0.7, 0.1], -1.0, -1.0, id="reversed"),
    pytest.param([1, 2, 3, 4, 5], [5, 6, 7, 8, 7], 8 / math.sqrt(95), 7 / math.sqrt(90), id="tie-in-y"),
    pytest.param([1, 2, 3, 4], [2, 1, 4, 3], 0.6, 1 / 3, id="two-swaps"),  # d = 1,1,1,1: 1 - 6·4/(4·15)
]


@pytest.mark.parametrize(("x", "y", "rho", "tau"), CASES)
def test_rank_correlation_matches_hand_computed(x, y, rho, tau):
    c = rank_correlation(x, y)
    assert c.n == len(x)
    assert c.spearman == pytest.approx(rho, abs=1e-12) and c.kendall == pytest.approx(tau, abs=1e-12)


@pytest.mark.parametrize(
    ("x", "y", "words"),
    [
        pytest.param([0.5, 0.6], [0.7, 0.8], "too few trials to rank (2 < 3)", id="two"),
        pytest.param([], [], "too few trials to rank (0 < 3)", id="none"),
        pytest.param([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], "same value for every trial", id="constant"),
    ],
)
def test_rank_correlation_without_a_number_says_why(x, y, words):
    c = rank_correlation(x, y)
    assert c.spearman is None and c.kendall is None and words in c.text()


def test_rank_correlation_needs_pairs():
    with pytest.raises(ValueError, match="pairs"):
        rank_correlation([1, 2, 3], [1, 2])


def test_fidelity_lines_call_out_a_poor_proxy_and_a_better_baseline():
    poor = Fidelity(4.0, 6, 1, Correlation(6, 0.41, 0.33), Correlation(6, 0.8, 0.6))
    lines = poor.lines()
    assert "6 trial(s) retrained at 4× steps; 1 long run(s) failed" in lines[0]
    assert "Spearman ρ 0.41, Kendall τ 0.33" in lines[0] and "Spearman ρ 0.80" in lines[1]
    assert "ranks these architectures poorly (ρ 0.41 < 0.7)" in lines[2]
    assert "parameter count ranks them better" in lines[3]
    good = Fidelity(2.0, 5, 0, Correlation(5, 0.9, 0.8), Correlation(5, 0.1, 0.0))
    assert not good.poor and len(good.lines()) == 2
    few = Fidelity(4.0, 2, 0, Correlation(2, None, None), Correlation(2, None, None))
    assert few.lines() == [
        "proxy fidelity over 2 trial(s) retrained at 4× steps (short-run vs long-run accuracy): "
        "too few trials to rank (2 < 3)"
    ]
    assert Fidelity.from_dict(poor.to_dict()) == poor


# ---------------------------------------------------------------- stored rows and seeds


def _row(trial: int, acc: float, steps: int = 80) -> Verified:
    return Verified(trial, steps, (11, 12), (acc, acc + 0.1), 1e-3, "cpu")


def test_rows_merge_with_earlier_runs_and_another_length_replaces_them():
    study = optuna.create_study(directions=["maximize", "minimize"])
    assert verified(study) == {} and verify_settings(study) is None
    four = VerifySettings(steps_factor=4.0, random=2, seed=0)
    write_verified(study, {3: _row(3, 0.5), 1: _row(1, 0.2)}, four)
    write_verified(study, {7: _row(7, 0.4), 3: _row(3, 0.6)}, VerifySettings(steps_factor=4.0, random=5, seed=1))
    rows = verified(study)
    assert list(rows) == [1, 3, 7]  # int keys, in order, through JSON's string keys
    assert rows[3] == _row(3, 0.6) and rows[3].accuracy == pytest.approx(0.65)
    assert verify_settings(study) == VerifySettings(steps_factor=4.0, random=5, seed=1)
    json.dumps(study.user_attrs["verify"])  # what any storage can hold
    write_verified(study, {7: _row(7, 0.9, steps=160)}, VerifySettings(steps_factor=8.0))
    assert list(verified(study)) == [7]  # one correlation never mixes two lengths of long run


def test_a_failed_long_run_has_no_accuracy():
    row = Verified(2, 80, (5,), (), 1e-3, "cpu", failure="diverged: loss became NaN")
    assert row.accuracy is None
    assert Verified.from_dict(2, row.to_dict()) == row


def _trial(seed: int = 3, population: dict | None = None) -> types.SimpleNamespace:
    from nas.spec import ArchSpec, LayerSpec

    arch = ArchSpec(d_model=16, layers=(LayerSpec("attention", heads=1),), vocab_size=16, n_out=16)
    spec = TrainSpec(optimizer="adamw", lr=2e-3, steps=20, seed=seed)
    return types.SimpleNamespace(number=seed, arch=arch, train=spec, population=population)


def test_training_seeds_repeat_and_differ_from_the_search():
    seeds = training_seeds(_trial(), 3)
    assert seeds == training_seeds(_trial(), 3) and len(set(seeds)) == 3
    assert training_seeds(_trial(), 1) == seeds[:1]  # more seeds extend the same list
    assert training_seeds(_trial(seed=4), 1) != seeds[:1] and 3 not in seeds


def test_long_recipe_scales_steps_and_takes_a_population_best_lr():
    assert long_recipe(_trial(), 4.0) == TrainSpec(optimizer="adamw", lr=2e-3, steps=80, seed=3)
    assert long_recipe(_trial(), 0.01).steps == 1
    assert long_recipe(_trial(population={"best_lr": 5e-3}), 2.5) == TrainSpec(
        optimizer="adamw", lr=5e-3, steps=50, seed=3
    )


# ---------------------------------------------------------------- end to end (the CLI)


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Path:
    """A hybrid_tiny study of 5 trained trials (3 baselines), never verified, and an empty study."""
    tmp = tmp_path_factory.mktemp("verify")
    storage = tmp / "s.journal"
    argv = ["search", "--space", "hybrid_tiny", "--trials", "5", "--storage", str(storage), "--study", "v"]
    # the guard must not cut a trial on a loaded runner: a truncated trial is never verified
    assert main([*argv, "--device", "cpu", "--max-train-seconds", "600"]) == 0
    from nas.search.study import open_study

    open_study("empty", str(storage))  # a study as nas search creates one, before its first trial
    return storage


def _copy(searched: Path, to: Path) -> str:
    """The searched study's journal and weights in ``to``: each test verifies its own copy."""
    shutil.copy(searched, to / "s.journal")
    shutil.copytree(searched.with_suffix(".artifacts"), to / "s.artifacts")
    return str(to / "s.journal")


def _study(storage: str, name: str = "v") -> optuna.Study:
    from nas.search.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


VERIFY = ["verify", "--study", "v", "--steps-factor", "2", "--device", "cpu"]


@pytest.mark.slow
def test_verify_stores_rows_prints_the_table_and_repeats_exactly(searched, tmp_path, capsys):
    from nas.results.pareto import front

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    storage = _copy(searched, first)
    assert main([*VERIFY, "--storage", storage, "--random", "1"]) == 0
    out = capsys.readouterr().out
    study = _study(storage)
    rows = verified(study)
    on_front = {r.number for r in front(study)}
    assert on_front < set(rows) and len(rows) == len(on_front) + 1
    assert all(row.steps == 40 and len(row.seeds) == 1 and row.device == "cpu" for row in rows.values())
    assert verify_settings(study) == VerifySettings(steps_factor=2.0, seeds=1, random=1, seed=0)
    assert "short acc" in out and "long acc" in out and "retrained at 2× steps" in out
    assert "(short-run vs long-run accuracy): " in out
    assert ("Spearman ρ" in out and "parameter-count baseline" in out) or "too few trials to rank" in out

    # the same verify of an untouched copy trains the same
    other = _copy(searched, second)
    assert main([*VERIFY, "--storage", other, "--random", "1"]) == 0
    capsys.readouterr()
    assert verified(_study(other)) == rows

    # more random trials: the earlier rows are kept (not retrained), one more is added
    assert main([*VERIFY, "--storage", storage, "--random", "2"]) == 0
    out = capsys.readouterr().out
    again = verified(_study(storage))
    assert len(again) == len(rows) + 1 and all(again[n] == row for n, row in rows.items())
    assert out.count("stored, not retrained") == len(rows)

    # another length of long run replaces the rows, and says so
    assert main([*VERIFY, "--storage", storage, "--random", "0", "--steps-factor", "1.5"]) == 0
    out = capsys.readouterr().out
    assert f"replacing the {len(again)} row(s) retrained at 2× steps with 1 seed(s) each" in out
    assert set(verified(_study(storage))) == on_front


@pytest.mark.slow
def test_report_studies_and_card_show_the_fidelity(searched, tmp_path, capsys):
    from nas.results.report import figures, write_html

    storage = _copy(searched, tmp_path)
    assert main([*VERIFY, "--storage", storage, "--random", "3"]) == 0
    capsys.readouterr()
    study = _study(storage)
    fig = figures(study)["fidelity"]
    assert "Short-run vs 2× steps accuracy, " in fig.layout.title.text and "Spearman ρ" in fig.layout.title.text
    points = sum(len(trace.x) for trace in fig.data if trace.mode == "markers+text")
    assert points == len(verified(study))
    page = write_html(study, tmp_path / "r.html", storage=storage).read_text()
    assert 'id="fidelity"' in page and "fidelity-note" in page

    assert main(["studies", "--storage", storage, "--study", "v"]) == 0  # piped: tab-separated
    header, row = capsys.readouterr().out.splitlines()
    assert header.split("\t")[-1] == "proxy_rho" and row.split("\t")[-1] != "-"

    assert main(["export", "--study", "v", "--storage", storage, "--out", str(tmp_path / "bundle")]) == 0
    capsys.readouterr()
    card = (tmp_path / "bundle" / "card.md").read_text()
    n = len(verified(study))  # the front and 3 random trials
    assert f"`nas verify`: proxy fidelity over {n} trial(s) retrained at 2× steps" in card
    bundle = json.loads((tmp_path / "bundle" / "arch.json").read_text())
    assert bundle["proxy_fidelity"]["trials"] == n


@pytest.mark.slow
def test_search_verify_runs_after_the_search(tmp_path, capsys):
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", "hybrid_tiny", "--trials", "2", "--no-baselines", "--storage", storage]
    assert main([*argv, "--study", "sv", "--device", "cpu", "--max-train-seconds", "600", "--verify", "1"]) == 0
    out = capsys.readouterr().out
    assert "verifying: the front and 1 random trial(s) at 4× their steps" in out
    assert "too few trials to rank (2 < 3)" in out  # two trials: no number
    rows = verified(_study(storage, "sv"))
    assert len(rows) == 2 and all(row.steps == 80 for row in rows.values())


@pytest.mark.slow
def test_worker_processes_store_the_same_rows_as_one_process(searched, tmp_path, capsys):
    """--workers 2 retrains in two spawned processes; the rows (accuracies bit for bit, seeds,
    steps) are the serial run's, each printed once, and a rerun retrains nothing."""
    serial, parallel = tmp_path / "a", tmp_path / "b"
    serial.mkdir(), parallel.mkdir()
    one, two = _copy(searched, serial), _copy(searched, parallel)
    assert main([*VERIFY, "--storage", one, "--random", "2"]) == 0
    capsys.readouterr()
    assert main([*VERIFY, "--storage", two, "--random", "2", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    rows = verified(_study(two))
    assert rows == verified(_study(one)) and len(rows) >= 3
    assert "2 at once" in out and sorted(
        int(line.split()[1].split("/")[0]) for line in out.splitlines() if line.startswith("verify ")
    ) == list(range(1, len(rows) + 1))
    assert main([*VERIFY, "--storage", two, "--random", "2", "--workers", "2"]) == 0
    assert capsys.readouterr().out.count("stored, not retrained") == len(rows)


BAD = [
    ("unknown-study", ["verify", "--study", "ghost"], "no study named 'ghost'"),
    ("no-trained-trial", ["verify", "--study", "empty"], "has no trained trial to verify"),
    ("steps-factor-zero", [*VERIFY, "--steps-factor", "0"], "--steps-factor must be in (1, 100], got 0"),
    ("steps-factor-negative", [*VERIFY, "--steps-factor", "-2"], "--steps-factor must be in (1, 100]"),
    ("steps-factor-shorter", [*VERIFY, "--steps-factor", "0.5"], "--steps-factor must be in (1, 100], got 0.5"),
    ("steps-factor-the-same", [*VERIFY, "--steps-factor", "1"], "--steps-factor must be in (1, 100], got 1"),
    ("steps-factor-absurd", [*VERIFY, "--steps-factor", "1000"], "--steps-factor must be in (1, 100], got 1000"),
    ("steps-factor-nan", [*VERIFY, "--steps-factor", "nan"], "--steps-factor must be in (1, 100], got nan"),
    ("steps-factor-text", [*VERIFY, "--steps-factor", "four"], "'four' is not a number"),
    ("random-negative", [*VERIFY, "--random", "-1"], "--random: must be >= 0, got -1"),
    ("seeds-zero", [*VERIFY, "--seeds", "0"], "--seeds must be in [1, 16], got 0"),
    ("workers-zero", [*VERIFY, "--workers", "0"], "--workers must be in [1, 64], got 0"),
    ("workers-absurd", [*VERIFY, "--workers", "1000"], "--workers must be in [1, 64], got 1000"),
    ("data-of-a-generated-task", [*VERIFY, "--data", "x.npz"], "has no data file; drop --data"),
    ("search-verify-negative", ["search", "--space", "hybrid_tiny", "--verify", "-3"], "--verify: must be >= 0"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "words"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_one_line_exit_2_storage_untouched(searched, capsys, argv, words):
    before = hashlib.sha256(searched.read_bytes()).hexdigest()
    assert main([*argv, "--storage", str(searched)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nas") and words in err, err
    assert hashlib.sha256(searched.read_bytes()).hexdigest() == before
    assert verified(_study(str(searched))) == {}


def test_search_verify_trains_as_many_at_once_as_the_search_did_per_gpu():
    import torch

    from nas.commands.search import verify_workers

    assert verify_workers(["0"], 4, torch.device("cuda", 0)) == 4
    assert verify_workers(["0", "1"], None, torch.device("cuda", 0)) == 1
    assert verify_workers(None, None, torch.device("cpu")) == 1  # --workers N on the CPU: one long run at a time
    assert verify_workers(["0"], 4, torch.device("cpu")) == 1
