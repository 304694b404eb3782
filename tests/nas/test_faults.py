"""Every way a candidate can fail becomes a failed trial with its reason; the study goes on."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from nas.search.faults import FaultError, check, planned
from nas.search.storage import open_storage
from nas.search.study import SearchConfig, run_search
from tests.conftest import write_space

FAULTS = [
    ("oom", "out of memory at batch 8 x 6 variants (step 3)"),
    ("nan", "diverged: loss became NaN/inf"),
    ("compile", "KernelCompileError: triton compilation failed"),
    ("mismatch", "KernelMismatchError: triton forward differs from the torch reference"),
    ("timeout", "exceeded --trial-timeout of 600 s (stopped at step 1 of 8)"),
]


@pytest.mark.parametrize("kind,reason", FAULTS, ids=[f[0] for f in FAULTS])
def test_injected_fault_fails_one_trial_and_the_study_continues(tmp_path, monkeypatch, kind, reason):
    monkeypatch.setenv("NAS_FAULT", f"{kind}@1")
    # the timeout fault makes trial 1's deadline already past when it trains: the other trials keep a
    # generous --trial-timeout, so none of them can time out however busy the machine is
    config = SearchConfig(
        space=str(write_space(tmp_path, steps=8)),
        trials=3,
        storage=str(tmp_path / "s.journal"),
        study="f",
        device="cpu",
        trial_timeout=600 if kind == "timeout" else None,
    )
    study = run_search(config)
    trials = study.get_trials()
    assert trials[1].state == TrialState.FAIL
    assert reason in trials[1].user_attrs["failure"], trials[1].user_attrs["failure"]
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3
    assert all(t.state == TrialState.COMPLETE for t in trials if t.number != 1)


def test_the_search_summary_counts_failed_trials_by_kind(tmp_path, monkeypatch, capsys):
    """It listed budget breakers and truncated trials but no failure (a new-user audit)."""
    from nas.cli import main

    monkeypatch.setenv("NAS_FAULT", "nan@0,2")
    argv = ["search", "--space", str(write_space(tmp_path, steps=8)), "--storage", str(tmp_path / "s.journal")]
    assert main([*argv, "--trials", "2", "--device", "cpu", "--no-baselines"]) == 0
    out = capsys.readouterr().out
    assert "2 trial(s) failed (2 diverged): recorded with their reason, not counted toward --trials" in out, out


def test_a_truncated_trial_is_recorded_with_its_steps_and_kept_off_the_front(tmp_path, monkeypatch, capsys):
    """The ``slow`` fault spends trial 1's wall-clock guard after its first step, as a busy machine
    would: the trial completes, records 1 of 8 steps, carries the ``truncated`` constraint, counts
    as trained (the budget is not re-spent on it) and is neither on the front nor in the
    hypervolume's feasible set."""
    from nas.results.pareto import front
    from nas.search.record import TRUNCATED, records
    from nas.search.study import n_complete, n_truncated

    monkeypatch.setenv("NAS_FAULT", "slow@1")
    config = SearchConfig(
        space=str(write_space(tmp_path, steps=8)),
        trials=3,
        storage=str(tmp_path / "s.journal"),
        study="slow",
        device="cpu",
        baselines=False,  # a baseline trains without the guard
    )
    study = run_search(config)
    by_number = {r.number: r for r in records(study)}
    slow = by_number[1]
    assert slow.complete and slow.truncated and slow.steps_done == 1 and slow.planned_steps == 8
    assert slow.truncation_text() == "time budget: 1/8 steps" and slow.steps_text() == "1/8"
    assert not slow.feasible and study.trials[1].constraints[TRUNCATED] == 7 / 8
    assert all(not by_number[n].truncated and by_number[n].feasible for n in (0, 2))
    assert n_complete(study) == 3 and n_truncated(study) == 1
    assert 1 not in {r.number for r in front(study)}
    from nas.cli import main  # exported by number, it says so on the terminal (the card said it only)

    monkeypatch.delenv("NAS_FAULT")
    argv = ["export", "--study", "slow", "--storage", config.storage, "--trial", "1", "--out", str(tmp_path / "x")]
    assert main(argv) == 0
    assert "— stopped by its time budget: 1/8 steps → " in capsys.readouterr().out


def test_retrain_truncated_trains_the_truncated_trials_again_in_full(tmp_path, monkeypatch, capsys):
    """A resume with --retrain-truncated queues each truncated trial's parameters again on top of
    --trials: they train in full, the cut ones stay on record, and a second resume finds nothing
    left to retrain. The summary's hint to do so goes once they are."""
    from nas.cli import main
    from nas.search.record import records
    from nas.search.study import n_complete

    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path, steps=8)), "--storage", storage, "--study", "cut"]
    argv += ["--trials", "3", "--device", "cpu", "--no-baselines"]  # a baseline trains without the guard
    monkeypatch.setenv("NAS_FAULT", "slow@1")  # trial 1 loses its guard
    assert main(argv) == 0
    assert "resume with --retrain-truncated" in capsys.readouterr().out
    monkeypatch.delenv("NAS_FAULT")
    assert main([*argv, "--retrain-truncated"]) == 0
    out = capsys.readouterr().out
    assert "re-queued 1 truncated trial(s) (1) to train in full, on top of --trials: 4 trained trials to reach" in out
    assert "trial 3 (4/4 trained): retrains trial 1: " in out
    assert "resume with --retrain-truncated" not in out  # trial 1 is retrained: nothing left to do
    study = optuna.load_study(study_name="cut", storage=open_storage(storage))
    by_number = {r.number: r for r in records(study)}
    cut, again = by_number[1], by_number[3]
    assert cut.truncated and not again.truncated and again.steps_done == again.planned_steps == 8
    assert again.requeued_from == 1
    assert study.trials[3].params == study.trials[1].params and n_complete(study) == 4
    assert main([*argv, "--trials", "4", "--retrain-truncated"]) == 0
    assert "no truncated trial to retrain" in capsys.readouterr().out
    assert len(study.get_trials(deepcopy=False)) == 4  # nothing queued, nothing trained


def test_max_train_seconds_replaces_the_spaces_guard_in_workers_too(tmp_path, monkeypatch):
    """--max-train-seconds is the guard every training of this run gets (the space says 600 s), and
    the study records it for the workers that join it, as it does the budgets."""
    from nas.search import faults
    from nas.search.study import worker_config

    guards = []
    real = faults.training_budget
    spy = lambda kind, guard, *rest: guards.append(guard) or real(kind, guard, *rest)  # noqa: E731
    monkeypatch.setattr(faults, "training_budget", spy)
    storage = str(tmp_path / "s.journal")
    space = str(write_space(tmp_path))
    run_search(SearchConfig(space=space, trials=1, storage=storage, study="g", device="cpu", baselines=False))
    run_search(
        SearchConfig(
            space=space, trials=2, storage=storage, study="g", device="cpu", baselines=False, max_train_seconds=7.5
        )
    )
    assert guards == [600.0, 7.5]
    assert worker_config("g", storage, device="cpu").max_train_seconds == 7.5


def test_exporting_a_failed_trial_names_its_failure(tmp_path, monkeypatch, capsys):
    from nas.cli import main

    monkeypatch.setenv("NAS_FAULT", "nan@0")
    storage = str(tmp_path / "s.journal")
    run_search(SearchConfig(space=str(write_space(tmp_path)), trials=1, storage=storage, study="f", device="cpu"))
    assert main(["export", "--study", "f", "--storage", storage, "--trial", "0", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "trial 0 of 'f' is FAIL (diverged: loss became NaN/inf within steps" in err and "), not COMPLETE" in err


def test_fault_spec_is_parsed(monkeypatch):
    monkeypatch.setenv("NAS_FAULT", "oom@0,3")
    assert [planned(n) for n in range(4)] == ["oom", None, None, "oom"]
    monkeypatch.setenv("NAS_FAULT", "nan")
    assert planned(7) == "nan"
    monkeypatch.setenv("NAS_FAULT", "segfault@1")
    with pytest.raises(FaultError, match="'segfault' is not one of"):
        planned(1)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("explode", "kind 'explode' is not one of ['oom'"),
        ("@1", "kind '' is not one of"),
        ("oom@", "trial numbers must be integers >= 0, e.g. oom@0,3"),
        ("oom@x", "trial numbers must be integers >= 0"),
        ("oom@-1", "trial numbers must be integers >= 0"),
        ("oom@1,,2", "trial numbers must be integers >= 0"),
    ],
    ids=["unknown-kind", "no-kind", "no-numbers", "text-number", "negative", "empty-item"],
)
def test_malformed_fault_spec_is_one_fault_error(monkeypatch, spec, needle):
    monkeypatch.setenv("NAS_FAULT", spec)
    with pytest.raises(FaultError) as err:
        check()
    message = str(err.value)
    assert message.startswith(f"NAS_FAULT={spec!r}: ") and needle in message and "\n" not in message, message


def test_malformed_fault_spec_is_refused_before_the_study_is_touched(tmp_path, monkeypatch):
    """A typo in NAS_FAULT stops the search before it creates or opens its study: no new study,
    and an existing one keeps its trials (none left RUNNING)."""
    from tests.conftest import study_checksum

    storage = str(tmp_path / "s.journal")
    config = SearchConfig(space=str(write_space(tmp_path, steps=4)), trials=1, storage=storage, study="f", device="cpu")
    run_search(config)
    before = study_checksum(storage, "f")
    monkeypatch.setenv("NAS_FAULT", "explode")
    for study in ("f", "new"):
        with pytest.raises(FaultError, match="'explode'"):
            run_search(dataclasses.replace(config, trials=2, study=study))
    assert study_checksum(storage, "f") == before
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(storage))] == ["f"]


@pytest.mark.slow
def test_ctrl_c_marks_the_running_trial_interrupted(tmp_path):
    storage = str(tmp_path / "s.journal")
    cmd = [
        sys.executable,
        "-m",
        "nas",
        "search",
        "--space",
        # a trial of a few seconds: SIGINT lands inside it, and the rerun retrains it in full
        str(write_space(tmp_path, steps=100)),
        "--trials",
        "3",
        "--storage",
        storage,
        "--study",
        "c",
        "--device",
        "cpu",
        "--no-baselines",
    ]
    # one intra-op thread, the rerun too: on a loaded 2-core runner extra threads spin against each other
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def trials() -> list[optuna.trial.FrozenTrial]:
        try:
            return optuna.load_study(study_name="c", storage=open_storage(storage)).get_trials()
        except KeyError:
            return []

    deadline = time.monotonic() + 120
    while not any(t.state == TrialState.RUNNING and "arch" in t.user_attrs for t in trials()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    stderr = proc.stderr.read().decode()
    assert code == 130, stderr
    assert "interrupted" in stderr
    after = trials()
    assert [t.state for t in after] == [TrialState.FAIL, TrialState.WAITING]  # its parameters, queued again
    assert after[0].user_attrs["failure"] == "interrupted; parameters re-queued"
    rerun = subprocess.run([*cmd[:7], "1", *cmd[8:]], capture_output=True, env=env, timeout=300)  # --trials 1
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert [t.state for t in trials()] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials()[1].params == after[0].params and trials()[1].user_attrs["requeued_from"] == 0


# ValueError too: run_search reads a ValueError from Optuna's tell as "finished by another
# process", and a trial it had just told FAIL looked like one (the search looped for ever)
@pytest.mark.parametrize("kind", [RuntimeError, ValueError])
def test_an_unexpected_error_fails_its_trial_before_it_surfaces(tmp_path, monkeypatch, kind):
    """An error no trial outcome covers (a bug; Adam's fp32 step overflowing at lr 1e38 was one)
    still surfaces, but its trial is recorded as failed with it: left RUNNING, every resume
    re-queued it into the same error. The resume then trains other candidates."""
    from nas.search import objective
    from nas.search.record import records

    real = objective.train_population

    def broken(*args, **kwargs):
        raise kind("value cannot be converted to type float without overflow")

    monkeypatch.setattr(objective, "train_population", broken)
    config = SearchConfig(
        space=str(write_space(tmp_path)), trials=2, storage=str(tmp_path / "s.journal"), device="cpu", baselines=False
    )
    with pytest.raises(kind, match="without overflow"):
        run_search(config)
    study = optuna.load_study(study_name=None, storage=open_storage(config.storage))
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state == TrialState.FAIL
    assert (
        trial.user_attrs["failure"]
        == f"error: {kind.__name__}: value cannot be converted to type float without overflow"
    )
    monkeypatch.setattr(objective, "train_population", real)
    resumed = records(run_search(config))
    assert [r.number for r in resumed if r.trained] == [1, 2]  # nothing re-queued trial 0's parameters
    assert not any(r.requeued_from is not None for r in resumed)


def test_a_retrain_is_queued_once_across_interruptions_and_runs_when_an_earlier_run_left_it(tmp_path, monkeypatch):
    """A retrain interrupted by Ctrl-C is queued again from the failed retrain: the truncated trial
    was then counted as not retrained and queued a second time (trained twice). And a retrain an
    earlier run queued but never ran was counted as done, not in the trials to reach: it never ran."""
    from nas.cli import main
    from nas.search import record
    from nas.search.study import not_retrained, requeue_truncated

    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path, steps=4)), "--storage", storage, "--study", "r"]
    argv += ["--device", "cpu", "--no-baselines"]
    monkeypatch.setenv("NAS_FAULT", "slow@0")
    assert main([*argv, "--trials", "1"]) == 0
    monkeypatch.delenv("NAS_FAULT")
    study = optuna.load_study(study_name="r", storage=open_storage(storage))
    assert not_retrained(study) == [0] and requeue_truncated(study) == (0,)
    retrain = study.ask()  # trial 1, the retrain of 0, stopped by Ctrl-C as run_search records it
    record.write_failure(retrain, "interrupted; parameters re-queued")
    record.requeue(study, study.tell(retrain, state=TrialState.FAIL))  # trial 2, requeued_from 1
    assert not_retrained(study) == [] and requeue_truncated(study) == (0,)  # waiting: not queued again
    assert len(study.get_trials(deepcopy=False)) == 3
    assert main([*argv, "--trials", "1", "--retrain-truncated"]) == 0  # 1 trained + the waiting retrain
    trials = study.get_trials(deepcopy=False)
    assert [(t.number, t.state) for t in trials][-1] == (2, TrialState.COMPLETE) and len(trials) == 3
    again = record.record(study, trials[2])
    assert not again.truncated and again.steps_done == 4 and trials[2].params == trials[0].params
    assert not_retrained(study) == [] and requeue_truncated(study) == ()
