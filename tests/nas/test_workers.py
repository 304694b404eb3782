"""Several workers on one study (journal file and a real PostgreSQL), and SIGKILLs mid-study."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from nas.search.storage import open_storage
from nas.search.study import SearchConfig, prepare
from tests.conftest import unique_name, write_space

pytestmark = pytest.mark.slow  # end-to-end: worker processes of the CLI on one study


def _start(tmp_path, storage: str, trials: int, steps: int) -> str:
    name = unique_name("w")
    prepare(
        SearchConfig(
            space=str(write_space(tmp_path, steps=steps)), trials=trials, storage=storage, study=name, device="cpu"
        )
    )
    return name


def _worker(name: str, storage: str, index: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "nas",
        "worker",
        "--study",
        name,
        "--storage",
        storage,
        "--worker-index",
        str(index),
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _trials(name: str, storage: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(storage)).get_trials()


def test_two_workers_complete_the_budget_once(tmp_path, storage_url):
    name = _start(tmp_path, storage_url, trials=50, steps=3)
    procs = [_worker(name, storage_url, i) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read().decode()
    trials = _trials(name, storage_url)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 50
    assert len({t.number for t in trials}) == len(trials)  # numbers unique
    assert not [t for t in trials if t.state in (TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)]
    assert all(t.user_attrs.get("surplus") for t in trials if t.state == TrialState.PRUNED)
    assert len({t.user_attrs["pid"] for t in complete}) == 2  # both workers did part of it


def test_sigkill_ten_times_loses_nothing(tmp_path, storage_url):
    name = _start(tmp_path, storage_url, trials=30, steps=40)
    rng = random.Random(0)
    seen_complete: dict[int, list[float]] = {}
    for kill in range(10):
        proc = _worker(name, storage_url, kill)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until this worker is inside a trial
            running = [
                t
                for t in _trials(name, storage_url)
                if t.state == TrialState.RUNNING and t.user_attrs.get("pid") == proc.pid
            ]
            if running or proc.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))  # then a random point of the trial (or a later one)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = {t.number: t.values for t in _trials(name, storage_url) if t.state == TrialState.COMPLETE}
        assert all(now.get(n) == v for n, v in seen_complete.items()), f"kill {kill} lost a finished trial"
        seen_complete = now
    final = _worker(name, storage_url, 99)
    assert final.wait(timeout=600) == 0, final.stderr.read().decode()
    trials = _trials(name, storage_url)
    complete = {t.number: t.values for t in trials if t.state == TrialState.COMPLETE}
    assert len(complete) == 30
    assert all(complete.get(n) == v for n, v in seen_complete.items())
    killed = [t for t in trials if t.state == TrialState.FAIL]
    assert killed and all("worker died" in t.user_attrs.get("failure", "") for t in killed)
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def test_heartbeat_requeues_a_trial_of_a_dead_remote_worker(tmp_path, postgres_url, monkeypatch):
    """A trial whose worker (on another host, so no pid check applies) stops beating is failed by
    Optuna's heartbeat check and re-queued with its parameters by the retry callback."""
    monkeypatch.setenv("NAS_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("NAS_HEARTBEAT_SECONDS", "1")
    config = SearchConfig(
        space=str(write_space(tmp_path, steps=3)), trials=2, storage=postgres_url, study=unique_name("hb"), device="cpu"
    )
    ctx, study = prepare(config)
    remote = study.ask({"depth": optuna.distributions.IntDistribution(1, 2)})
    remote.set_user_attr("host", "another-host")
    remote.set_user_attr("pid", 1)
    study._storage.record_heartbeat(remote._trial_id)  # noqa: SLF001 — then that worker goes silent
    time.sleep(5)  # > grace period (4 heartbeats of 1 s)
    from nas.search.study import run_search

    run_search(config, ctx_study=(ctx, study))
    trials = study.get_trials()
    assert trials[remote.number].state == TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == remote.number]
    assert len(retried) == 1 and retried[0].params["depth"] == remote.params["depth"]
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2


def _server_connections(url: str) -> int:
    """Client connections the PostgreSQL server holds now, counted by the server itself."""
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("select count(*) from pg_stat_activity where backend_type = 'client backend'")
        (count,) = cur.fetchone()
    conn.close()
    return int(count) - 1  # less the connection asking


def test_opening_a_server_storage_in_a_loop_holds_a_bounded_number_of_connections(tmp_path, postgres_url):
    """A poll loop (or an API user's loop) that opens the storage per call reuses one engine: the
    server's connection count does not grow with the number of calls (it reached the server's limit
    of 100 when each call made an engine whose pool kept its connection)."""
    name = _start(tmp_path, postgres_url, trials=1, steps=1)
    assert open_storage(postgres_url) is open_storage(postgres_url)
    assert open_storage(postgres_url, write=False) is not open_storage(postgres_url)  # a reader creates nothing
    before = _server_connections(postgres_url)
    for _ in range(100):
        _trials(name, postgres_url)
    # the other tests' workers may open or close connections meanwhile: allow them some room
    assert _server_connections(postgres_url) - before < 20
