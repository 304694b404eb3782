"""benchmarks/search_quality.py's scoring on constructed runs (nothing trains): which trials a
budget sees, the hypervolume and its reference point, the test against random, the
early-stopping savings and the best-configuration check, the run order and the JSON layout."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from optuna.trial import TrialState

from benchmarks.search_quality import (
    BASELINE,
    best_outcome,
    greater_p,
    hypervolume,
    reference_point,
    saving,
    savings,
    schedule,
    summarise,
    to_json,
    trial_state,
    until,
    wall_budgets,
)
from nas.search.record import TrialRecord
from nas.spec import TrainSpec


def _trial(number, state="complete", *, end=None, acc=0.5, lat=1.0, mem=1.0, seconds=1.0, train=None, config=None):
    t = {
        "number": number,
        "state": state,
        "params": {"config": number if config is None else config},
        "end": float(number + 1) if end is None else end,
        "seconds": seconds,
        "train_seconds": seconds if train is None else train,
        "steps": 10,
    }
    if state in ("complete", "truncated", "infeasible"):
        t |= {"accuracy": acc, "latency_ms": lat, "memory_mb": mem}
    return t


def _run(trials, *, sampler="random", prune=False, seed=0, seconds=None, asked=None):
    return {
        "seed": seed,
        "sampler": sampler,
        "prune": prune,
        "trials_asked": asked if asked is not None else sum(t["state"] in ("complete", "truncated") for t in trials),
        "seconds": seconds if seconds is not None else max(t["end"] for t in trials),
        "trials": trials,
    }


def test_reference_is_the_engines_rule_over_every_run_and_a_dominating_front_scores_higher():
    good = _run([_trial(0, acc=0.9, lat=1.0, mem=1.0)])
    poor = _run([_trial(0, acc=0.5, lat=2.0, mem=2.0)])
    ref = reference_point([good, poor])
    assert ref == pytest.approx([0.0, 2.2, 2.2])  # losses: −accuracy 0, 1.1 × the worst latency and memory
    assert hypervolume(good["trials"], ref) == pytest.approx(0.9 * 1.2 * 1.2)
    assert hypervolume(poor["trials"], ref) == pytest.approx(0.5 * 0.2 * 0.2)
    # only front-eligible trials count: a truncated, infeasible or pruned "better" trial adds nothing
    extra = [_trial(1, s, acc=1.0, lat=0.1, mem=0.1) for s in ("truncated", "infeasible", "pruned")]
    assert hypervolume(good["trials"] + extra, ref) == hypervolume(good["trials"], ref)
    assert reference_point([good, _run(extra)]) == pytest.approx([0.0, 1.1, 1.1])  # and not in the reference
    assert hypervolume([], ref) == 0.0


def test_budgets_see_only_the_trials_done_by_then():
    run = _run(
        [
            _trial(0, end=1.0, acc=0.2),
            _trial(1, "pruned", end=1.5),
            _trial(2, end=2.0, acc=0.4),
            _trial(3, end=3.0, acc=0.8),
        ]
    )
    assert [t["number"] for t in until(run, seconds=2.5)] == [0, 1, 2]
    assert [t["number"] for t in until(run, seconds=2.0)] == [0, 1, 2]  # completed at the budget: in
    assert [t["number"] for t in until(run, trials=2)] == [0, 1, 2]  # the pruned trial does not count
    assert [t["number"] for t in until(run, trials=1)] == [0]
    ref = [0.0, 2.0, 2.0]
    assert hypervolume(until(run, seconds=2.5), ref) == pytest.approx(0.4)
    assert hypervolume(until(run), ref) == pytest.approx(0.8)
    assert wall_budgets([run, _run([_trial(0)], seconds=8.0)]) == {"wall 25%": 0.75, "wall 50%": 1.5, "wall 100%": 3.0}


def test_mann_whitney_is_one_sided():
    low, high = [float(x) for x in range(10)], [float(x) for x in range(10, 20)]
    assert greater_p(high, low) < 1e-3
    assert greater_p(low, high) > 0.99
    assert 0.3 < greater_p(low, low) < 0.7


def test_summary_compares_every_arm_with_random_at_each_budget():
    runs = []
    for seed in range(10):
        # random: one mediocre trial per run; tpe+prune: a dominating one, reached at the same time
        runs.append(_run([_trial(0, acc=0.3 + 0.01 * seed, end=1800.0)], seed=seed, seconds=3600.0))
        runs.append(
            _run([_trial(0, acc=0.8 + 0.01 * seed, end=1800.0)], sampler="tpe", prune=True, seed=seed, seconds=3600.0)
        )
    summary = summarise(runs, reference_point(runs))
    tpe, random = summary["arms"]["tpe+prune"], summary["arms"]["random"]
    assert BASELINE == ("random", False) and "p" not in random["hypervolume"]["trials"]
    for budget in ("trials", "wall 50%", "wall 100%"):
        assert tpe["hypervolume"][budget]["ratio"] > 2 and tpe["hypervolume"][budget]["p"] < 1e-3
    assert tpe["hypervolume"]["wall 25%"]["median"] == 0.0  # nothing had completed by 900 s
    assert tpe["trials_per_hour"]["median"] == pytest.approx(1.0)
    assert tpe["hypervolume"]["trials"]["values"] == sorted(tpe["hypervolume"]["trials"]["values"])  # by seed


def test_savings_compare_the_same_number_of_candidates():
    # without early stopping: four candidates of 10 s; the best is the third (accuracy 0.9)
    off = _run([_trial(i, seconds=10.0, acc=a) for i, a in enumerate((0.2, 0.3, 0.9, 0.4))])
    # with it: the same four configurations first (a repeat in between costs 0.1 s and is no candidate), two
    # stopped after 2 s, then two more trained to fill --trials
    on_trials = [
        _trial(0, seconds=10.0, acc=0.2, config=0),
        _trial(1, "duplicate", seconds=0.1, config=0),
        _trial(2, "pruned", seconds=2.0, config=1),
        _trial(3, seconds=10.0, acc=0.9, config=2),
        _trial(4, "pruned", seconds=2.0, config=3),
        _trial(5, seconds=10.0),
        _trial(6, seconds=10.0),
    ]
    row = saving(off, _run(on_trials, prune=True))
    assert row["candidates"] == 4 and row["shared"] == 4 and row["pruned"] == 2
    assert row["seconds"] == [40.0, pytest.approx(24.1)] and row["saving"] == pytest.approx(1 - 24.1 / 40)
    assert row["best"] == "kept" and row["best_accuracy"] == [0.9, 0.9]

    stopped_best = [dict(t) for t in on_trials]
    stopped_best[3] = _trial(3, "pruned", seconds=2.0, config=2)
    assert saving(off, _run(stopped_best, prune=True))["best"] == "pruned"
    # a baseline is never stopped: the check is on the most accurate sampled trial, even below a baseline
    reference = _trial(9, acc=0.99, config="all-attention") | {"baseline": "all-attention"}
    assert best_outcome(_run(off["trials"] + [reference]), _run(stopped_best, prune=True)) == "pruned"
    elsewhere = [_trial(t["number"], t["state"], seconds=t["seconds"], config=100 + t["number"]) for t in on_trials]
    row = saving(off, _run(elsewhere, prune=True))
    assert row["best"] == "not proposed" and row["shared"] == 0

    both = savings([off, _run(on_trials, prune=True), _run(on_trials, sampler="tpe", prune=True)])
    assert list(both) == ["random"]  # tpe has no run without early stopping to compare with
    assert both["random"]["pooled_saving"] == pytest.approx(1 - 24.1 / 40) and both["random"]["best"] == {"kept": 1}


def test_runs_are_seed_major_and_every_arm_takes_every_position():
    order = schedule(range(4), ["tpe", "random"])
    assert [seed for seed, *_ in order] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    per_seed = [order[i : i + 4] for i in range(0, 16, 4)]
    assert all(
        sorted((s, p) for _, s, p in block) == sorted(per_seed[0][i][1:] for i in range(4)) for block in per_seed
    )
    assert per_seed[0][0][1:] == ("tpe", False) and per_seed[0][1][1:] == ("tpe", True)
    positions = Counter((s, p, i) for block in per_seed for i, (_, s, p) in enumerate(block))
    assert set(positions.values()) == {1} and len(positions) == 16


def test_trial_states_follow_the_record():
    spec = TrainSpec("adamw", 3e-3, 0.0, 0.0, 150, 32)

    def state(state, **fields):
        return trial_state(TrialRecord(0, state, train=spec, **fields))

    assert state(TrialState.COMPLETE, steps_done=150) == "complete"
    assert state(TrialState.COMPLETE, steps_done=8, feasible=False) == "truncated"
    assert state(TrialState.COMPLETE, skipped_training="breaks the hard budget on latency_ms", feasible=False) == (
        "infeasible"
    )
    assert state(TrialState.PRUNED, pruned_at=19) == "pruned"
    assert state(TrialState.PRUNED, duplicate_of=3) == "duplicate"
    assert state(TrialState.PRUNED, surplus="filled") == "surplus"
    assert state(TrialState.FAIL, failure="diverged") == "failed"


def test_json_keeps_one_line_per_trial_and_reads_back():
    payload = {"date": "d", "summary": {"a": [1, 2]}, "runs": [_run([_trial(0), _trial(1, "pruned")])]}
    text = to_json(payload)
    assert json.loads(text) == payload
    assert sum(line.lstrip().startswith('{"number"') for line in text.splitlines()) == 2


def test_smaller_trial_budgets_are_scored_where_every_run_reached_them():
    from benchmarks.search_quality import CURVE_TRIALS

    trials = [_trial(n, acc=0.1 + 0.01 * n) for n in range(45)]
    runs = [_run(trials, seed=s) for s in range(3)] + [_run(trials, sampler="tpe", seed=s) for s in range(3)]
    summary = summarise(runs, [0.0, 2.0, 2.0])
    hv = summary["arms"]["tpe"]["hypervolume"]
    assert {f"trials {n}" for n in CURVE_TRIALS if n < 45} <= set(hv)  # 20 and 40 are below the 45 asked
    assert hv["trials 20"]["median"] < hv["trials 40"]["median"] < hv["trials"]["median"]  # later trials are better
    short = summarise([_run(trials[:30], seed=0), _run(trials[:30], sampler="tpe", seed=0)], [0.0, 2.0, 2.0])
    assert "trials 40" not in short["arms"]["tpe"]["hypervolume"]  # never scored past what a run asked


def test_fidelity_is_summarised_over_the_runs_that_verified():
    from benchmarks.search_quality import fidelity_summary

    f = {"steps_factor": 4.0, "trials": 9, "spearman": 0.8, "kendall": 0.6, "params_spearman": 0.5}
    runs = [
        _run([_trial(0)], sampler="tpe", seed=0) | {"fidelity": f},
        _run([_trial(0)], sampler="tpe", seed=1) | {"fidelity": f | {"spearman": 0.6, "params_kendall": 0.4}},
        _run([_trial(0)], seed=0) | {"fidelity": None},
    ]
    out = fidelity_summary(runs)
    assert out["seeds"] == [0, 1] and out["trials"] == [9, 9]
    assert out["spearman"]["median"] == pytest.approx(0.7) and out["kendall"]["values"] == [0.6, 0.6]
    assert out["params_kendall"]["values"] == [0.4]  # a missing correlation is left out, not zero
    assert fidelity_summary([_run([_trial(0)])]) is None


def test_cuda_mode_without_a_gpu_is_one_line_and_exit_2():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "search_quality", "--device", "cuda", "--quick"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["search_quality.py: --device cuda needs a CUDA device; none is visible"]


def test_space_text_reads_a_shipped_space_or_a_file(tmp_path):
    from benchmarks.search_quality import space_text

    assert "name: hybrid_small" in space_text("hybrid_small")
    (tmp_path / "s.yaml").write_text("name: mine\n")
    assert space_text(str(tmp_path / "s.yaml")) == "name: mine\n"
