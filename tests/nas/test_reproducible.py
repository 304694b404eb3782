"""A configuration trains the same however its trial came about: re-queued by Ctrl-C or by
``kill -9``, retrained by ``--retrain-truncated``, or drawn in another study with the same seed."""

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
from nas.spec import ArchSpec, LayerSpec, TrainSpec, training_seed
from tests.conftest import write_space

STUDY_SEED = 3


def test_the_training_seed_is_the_configurations_not_the_trials():
    arch = ArchSpec(16, (LayerSpec("attention", heads=2),), 16, 16)
    recipe = TrainSpec(lr=3e-3, steps=20)
    seed = training_seed(STUDY_SEED, arch, recipe)
    assert seed == training_seed(STUDY_SEED, arch, TrainSpec(lr=3e-3, steps=20, seed=12345))  # its own seed aside
    assert seed != training_seed(STUDY_SEED + 1, arch, recipe)
    assert seed != training_seed(STUDY_SEED, arch, TrainSpec(lr=3e-3, steps=21))
    assert seed != training_seed(STUDY_SEED, ArchSpec(16, (LayerSpec("attention", heads=1),), 16, 16), recipe)
    assert 0 <= seed < 2**31
    seeds = TrainSpec(seed=seed, seeds=3).variant_seeds()
    assert seeds[0] == seed and len(set(seeds)) == 3


def _cmd(space, storage: str, study: str, trials: int = 4) -> list[str]:
    return [
        *(sys.executable, "-m", "nas", "search", "--space", str(space), "--trials", str(trials)),
        *("--storage", storage, "--study", study, "--device", "cpu", "--seed", str(STUDY_SEED), "--no-baselines"),
    ]


def _trials(storage: str, study: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=study, storage=open_storage(storage)).get_trials()
    except KeyError:
        return []


def _by_params(storage: str, study: str) -> dict[str, float]:
    """Each completed trial's accuracy, keyed by its parameters."""
    return {
        repr(sorted(t.params.items())): t.user_attrs["accuracy"]
        for t in _trials(storage, study)
        if t.state == TrialState.COMPLETE
    }


def _interrupt_mid_trial(cmd: list[str], storage: str, study: str, sig: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while True:
        trials = _trials(storage, study)
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if done and any(t.state == TrialState.RUNNING and "arch" in t.user_attrs for t in trials):
            break
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    rerun = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()


@pytest.mark.slow
def test_a_requeued_or_retrained_trial_scores_what_the_uninterrupted_run_scored(tmp_path, monkeypatch):
    """One uninterrupted study; then the same seed in other studies interrupted by Ctrl-C, by
    kill -9, and cut short by the time guard then retrained: every trial they complete scores
    exactly what the uninterrupted study's trial with the same parameters scored."""
    from nas.cli import main

    space = write_space(tmp_path, steps=120)  # a trial of a few seconds: room to land inside one
    storage = str(tmp_path / "s.journal")
    assert main(_cmd(space, storage, "clean")[3:]) == 0
    clean = _by_params(storage, "clean")
    assert len(clean) == 4

    checked = 0
    for study, sig in (("ctrl-c", signal.SIGINT), ("kill-9", signal.SIGKILL)):
        _interrupt_mid_trial(_cmd(space, storage, study), storage, study, sig)
        states = [t.state for t in _trials(storage, study)]
        assert TrialState.FAIL in states, f"{study}: no trial was interrupted ({states})"
        again = [t for t in _trials(storage, study) if "requeued_from" in t.user_attrs]
        assert again and all(t.state == TrialState.COMPLETE for t in again), study
        for key, accuracy in _by_params(storage, study).items():
            if key in clean:
                assert accuracy == clean[key], study
                checked += 1

    monkeypatch.setenv("NAS_FAULT", "slow@1")  # trial 1 is cut short by its guard
    argv = _cmd(space, storage, "cut", trials=2)[3:]
    assert main(argv) == 0
    monkeypatch.delenv("NAS_FAULT")
    assert main([*argv, "--retrain-truncated"]) == 0
    retrained = [t for t in _trials(storage, "cut") if t.user_attrs.get("requeued_from") == 1]
    assert len(retrained) == 1 and retrained[0].state == TrialState.COMPLETE
    assert retrained[0].user_attrs["accuracy"] == clean[repr(sorted(retrained[0].params.items()))]
    assert checked >= 6  # most trials of the interrupted studies had their twin in the clean one
