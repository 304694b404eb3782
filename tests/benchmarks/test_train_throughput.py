"""``benchmarks/train_throughput.py --host-scaling`` on the CPU: one small search, a row per study
size with the window's trials timed from Optuna's timestamps."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a real nas search of a few dozen 2-step trials


def test_host_scaling_times_a_window_at_each_size():
    from benchmarks.train_throughput import host_scaling

    rows = host_scaling([0, 6], 4)
    assert [(r["study_size"], r["window"]) for r in rows] == [(0, 4), (6, 4)]
    for r in rows:
        assert 0 < r["inside_median_s"] <= r["per_trial_s"] * r["window"]
        assert 0 <= r["between_median_s"] < r["per_trial_s"] * r["window"]
        assert r["search_wall_s"] > 0
