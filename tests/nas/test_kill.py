"""``kill -9`` of ``nas search`` mid-trial, then the same command again: nothing finished is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from nas.search.storage import open_storage
from tests.conftest import write_space

pytestmark = pytest.mark.slow  # end-to-end: kills a running nas search and resumes it


def _trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name="k", storage=open_storage(storage)).get_trials()
    except KeyError:
        return []


def test_sigkill_mid_trial_then_resume(tmp_path):
    space = write_space(tmp_path, steps=150)  # ~0.5 s a trial: wide windows to land mid-trial
    storage = str(tmp_path / "s.journal")
    cmd = [
        sys.executable,
        "-m",
        "nas",
        "search",
        "--space",
        str(space),
        "--trials",
        "6",
        "--storage",
        storage,
        "--study",
        "k",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        trials = _trials(storage)
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if len(done) >= 2 and any(t.state == TrialState.RUNNING and "pid" in t.user_attrs for t in trials):
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    else:
        raise AssertionError("the search never reached a running trial after two completed ones")
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    before = {t.number: t.values for t in _trials(storage) if t.state == TrialState.COMPLETE}
    killed = [t for t in _trials(storage) if t.state == TrialState.RUNNING]
    assert len(before) >= 2 and killed

    rerun = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()
    after = _trials(storage)
    complete = {t.number: t.values for t in after if t.state == TrialState.COMPLETE}
    assert len(complete) == 6
    assert all(complete.get(n) == v for n, v in before.items())  # every finished trial kept as it was
    for k in killed:
        assert after[k.number].state == TrialState.FAIL and "worker died" in after[k.number].user_attrs["failure"]
        retried = [t for t in after if t.user_attrs.get("requeued_from") == k.number]
        # parameters drawn before the kill are kept; any not yet drawn are sampled afresh
        assert retried and all(retried[0].params[key] == v for key, v in k.params.items())
