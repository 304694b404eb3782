"""Several processes on one SQLite file. SQLite ignores the row lock (SELECT ... FOR UPDATE) that
Optuna's ``ask`` relies on to hand a queued trial to one process only (optuna#4621), and two
processes opening a new file both create its tables. Each race is played out here in one
process, in a fixed order: no sleeps, no timing."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy.exc import IntegrityError, OperationalError

from nas.search import record
from nas.search import storage as storage_module
from nas.search.storage import open_storage
from nas.search.study import SearchConfig, open_study, run_search
from tests.conftest import write_space


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'race.db'}"


def _config(tmp_path: Path, **kw) -> SearchConfig:
    base = dict(space=str(write_space(tmp_path, steps=2)), trials=2, storage=_url(tmp_path), study="t", device="cpu")
    return SearchConfig(**{**base, **kw})


def _held(path: Path) -> bool:
    """Whether some open file description holds an exclusive flock on ``path`` (ours included:
    a second open of the file is another description)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_queued_trial_is_claimed_under_the_database_lock(tmp_path, monkeypatch):
    """Taking a queued trial (WAITING -> RUNNING) is one read and one write; without a lock two
    processes both read WAITING and both write RUNNING, then train the same baseline and the
    second tell crashes (``UpdateFinishedTrialError``, ``Cannot tell a COMPLETE trial``)."""
    lock = tmp_path / "race.db.flock"
    claims: list[bool] = []
    real = RDBStorage.set_trial_state_values

    def observed(self, trial_id, state, values=None):
        if state == TrialState.RUNNING:
            claims.append(_held(lock))
        return real(self, trial_id, state, values)

    monkeypatch.setattr(RDBStorage, "set_trial_state_values", observed)
    run_search(_config(tmp_path))  # the first two of the space's queued baselines
    assert claims == [True, True]


@pytest.mark.parametrize("when", ["before its claim", "before its evaluation", "before its tell"])
def test_a_trial_another_process_finished_is_left_as_that_process_recorded_it(tmp_path, monkeypatch, caplog, when):
    """Had a second process taken the same trial anyway (a database without the lock, a stale
    trial failed by another worker), this one drops it with a warning and goes on: no traceback,
    the other process's result stands."""
    import nas.search.objective as objective

    theirs = [0.5, 1.0, 2.0]
    real = objective.evaluate

    def other_process_finishes(number: int) -> None:
        other = open_study("t", _url(tmp_path), create=False)
        other.tell(number, theirs)

    def racing(ctx, trial):
        if trial.number != 0:
            return real(ctx, trial)
        if when == "before its evaluation":
            other_process_finishes(trial.number)
            return real(ctx, trial)
        result = real(ctx, trial)
        if when == "before its tell":
            other_process_finishes(trial.number)
        return result

    real_start, raced = record.write_start, []

    def claimed_late(trial):  # the other process gets there between this one's ask and its claim
        if trial.number == 0 and when == "before its claim" and not raced:
            raced.append(True)
            other_process_finishes(trial.number)
        return real_start(trial)

    monkeypatch.setattr("nas.search.loop.evaluate", racing)
    monkeypatch.setattr(record, "write_start", claimed_late)
    with caplog.at_level("WARNING", logger="nas.search.study"):
        study = run_search(_config(tmp_path, baselines=False))
    trials = study.get_trials()
    assert trials[0].state == TrialState.COMPLETE and trials[0].values == theirs
    if when == "before its claim":
        assert trials[0].user_attrs == {}
    if when == "before its evaluation":  # only the claim made it: nothing of this process's evaluation
        assert set(trials[0].user_attrs) == {"pid", "pid_start", "host", "record_version"}
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2  # the other process's trial 0 counts
    assert any("trial 0 was finished by another process" in r.getMessage() for r in caplog.records), caplog.text


def test_a_new_database_gets_its_tables_under_the_database_lock(tmp_path, monkeypatch):
    """Two processes opening a new file both create its tables; the second used to fail with
    'table studies already exists', reported as a bad storage URL."""
    held: list[bool] = []

    def observed(url, **kw):
        held.append(_held(tmp_path / "race.db.flock"))
        return RDBStorage(url, **kw)

    monkeypatch.setattr(storage_module, "RDBStorage", observed)
    open_storage(_url(tmp_path))
    assert held == [True]


LOST_SCHEMA_RACES = {  # what SQLite said to the second of two processes opening a new file
    "table": OperationalError("CREATE TABLE studies", {}, Exception("table studies already exists")),
    "version": IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed")),
}


@pytest.mark.parametrize("lost", LOST_SCHEMA_RACES.values(), ids=LOST_SCHEMA_RACES.keys())
def test_tables_another_process_created_meanwhile_are_joined(tmp_path, monkeypatch, lost):
    """A server database has no file to lock: a schema creation that loses the race is retried."""
    calls: list[str] = []

    def racing(url, **kw):
        calls.append(url)
        if len(calls) == 1:
            RDBStorage(url, **kw)  # the other process creates the tables...
            raise lost
        return RDBStorage(url, **kw)

    monkeypatch.setattr(storage_module, "RDBStorage", racing)
    store = open_storage(_url(tmp_path))
    assert len(calls) == 2
    optuna.create_study(study_name="x", storage=store)


def test_a_stale_trial_another_worker_failed_first_is_left_alone(tmp_path):
    """Two workers that see the same dead worker's trial: the second to fail it used to crash
    (``UpdateFinishedTrialError``); it leaves the trial, and queues nothing again."""
    from nas.search.record import fail_stale

    study = optuna.create_study(study_name="x", storage=open_storage(_url(tmp_path)))
    with pytest.warns(UserWarning, match="Heartbeat"):  # our storages beat; run_search silences it
        trial = study.ask()
    stale = study.get_trials(deepcopy=False)[0]
    study.tell(trial, state=TrialState.FAIL)  # the other worker got there first
    assert fail_stale(study, stale, "worker died") is False
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL]
