"""benchmarks/pruner_bounds.py's replay on constructed runs (nothing trains)."""

from __future__ import annotations

import pytest

from benchmarks.pruner_bounds import _runs, oracles, replay


def _t(number, acc, lat, mem, rungs=(), baseline=None, secs=8.0):
    return {
        "seed": 0,
        "sampler": "random",
        "number": number,
        "accuracy": acc,
        "latency_ms": lat,
        "memory_mb": mem,
        "rungs": [list(r) for r in rungs],
        "steps": 80,
        "train_seconds": secs,
        "baseline": baseline,
        "eligible": True,
    }


def test_a_rival_at_no_more_cost_stops_a_hopeless_trial_and_a_late_jump_is_counted_against_the_rule():
    rows = [
        _t(0, 0.95, 1.0, 1.0, baseline="all-attention"),
        _t(1, 0.10, 2.0, 2.0, rungs=[(10, 0.05), (40, 0.08)]),  # hopeless: stopped at 1/2 by the square rule
        _t(2, 0.99, 2.0, 2.0, rungs=[(10, 0.05), (40, 0.10)]),  # the run's best: a late jump
    ]
    runs = _runs(rows)
    linear = replay(runs, 1.0, 0.0)  # 1 − 0.95·(1/8) = 0.88 < 0.95 at the first rung: both stopped
    assert linear["stopped"] == 2 and linear["best_stopped_in"] == ["random seed 0"]
    assert linear["saved"] == pytest.approx(2 * 8.0 * 7 / 8 / 24.0)
    square = replay(runs, 2.0, 0.05)  # at 1/2: 1 − 0.92/4 = 0.77 and 0.775: both still stopped, later
    assert square["stopped"] == 2 and square["saved"] == pytest.approx(2 * 8.0 * 0.5 / 24.0)
    never = replay(runs, 3.0, 0.5)
    assert never == {"saved": 0.0, "stopped": 0, "best_stopped_in": []}
    bound = oracles(runs)  # trial 1 ends dominated (by 0 earlier, and by 2); trial 2 by nothing
    assert bound["dominated_by_an_earlier_trial"] == pytest.approx(8.0 * 7 / 8 / 24.0)
    assert bound["dominated_by_any_trial"] == pytest.approx(8.0 * 7 / 8 / 24.0)
