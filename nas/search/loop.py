"""The search loop: evaluate candidates until N trials have been trained in storage, in one or
several processes on one study (the budget is counted in storage). A trial left RUNNING by a dead
process is failed and its parameters are queued again (same host: by pid; RDB: by Optuna's
heartbeat), so a killed search resumes where it stopped."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from nas.search import interrupt, record
from nas.search.config import SearchConfig, SearchError
from nas.search.objective import TrialContext, evaluate
from nas.search.start import prepare
from nas.search.storage import claim_lock

__all__ = [
    "n_complete",
    "n_infeasible",
    "n_pruned",
    "n_truncated",
    "recover_stale_trials",
    "run_search",
]

# one logger for the study's lines, whichever module of it writes them (``nas -v`` shows its name)
logger = logging.getLogger("nas.search.study")


MAX_FAILURES_IN_A_ROW = 20  # a space where nothing trains should stop, not spin


# candidates in a row that were not trained (they break a hard budget, or repeat a configuration
# already tried): each costs a sample and a latency score, so a space with too few feasible (or
# too few distinct) candidates stops with a message instead of sampling forever
MAX_UNTRAINED_IN_A_ROW = 100


POLL_SECONDS = 1.0  # while other workers finish the last trials of the budget


def _pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether the worker process ``pid`` (started at ``started``, ``record.process_start``; None:
    not recorded) still runs: a live pid whose process started at another time is a reuse."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = record.process_start(pid)
    return started is None or now is None or now == started


# A worker records its host and then its pid right after it takes a trial (``record.write_start``):
# a RUNNING trial still without a pid this long after its start lost its process in between (a kill
# in that window), and nothing else would ever fail it (a resume then waited on it for good).
UNCLAIMED_GRACE_S = 60.0


def _now() -> datetime.datetime:
    return datetime.datetime.now()  # naive local time, as Optuna stamps datetime_start


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker process on this host is gone and re-queue their params.

    Returns the numbers of the trials that were failed. Trials of live processes, or of other
    hosts (covered by RDB heartbeats), are left alone; so is a trial not yet claimed (no pid,
    whatever else ``record.write_start`` got to write), until ``UNCLAIMED_GRACE_S`` after its start
    (a guard: it is logged when it fires).
    """
    host, recovered = socket.gethostname(), []
    now = _now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        r = record.record(study, t)
        if r.pid is None:  # written last: a host without it is a claim cut short, not another host's
            started = t.datetime_start
            if started is None or (now - started).total_seconds() < UNCLAIMED_GRACE_S:
                continue
            reason = f"no worker claimed it within {UNCLAIMED_GRACE_S:.0f} s of its start (its process died first)"
            if record.fail_stale(study, t, f"{reason}; parameters re-queued"):
                logger.warning("trial %d: %s", t.number, reason)
                recovered.append(t.number)
            continue
        if r.host != host or _pid_alive(int(r.pid), r.pid_start):
            continue
        if record.fail_stale(study, t, f"worker died (pid {r.pid}); parameters re-queued"):
            recovered.append(t.number)
    if recovered:
        logger.warning("re-queued trials of dead workers: %s", recovered)
    return recovered


def n_complete(study: optuna.Study) -> int:
    """Completed trials that trained their candidate: what ``--trials`` counts."""
    return sum(r.trained for r in record.records(study, (TrialState.COMPLETE,)))


def n_infeasible(study: optuna.Study) -> int:
    """Completed trials recorded without training (they break a hard budget); not counted by --trials."""
    return sum(not r.trained for r in record.records(study, (TrialState.COMPLETE,)))


def n_pruned(study: optuna.Study) -> int:
    """Trials early stopping stopped at a rung (PRUNED, partly trained); not counted by --trials."""
    return sum(r.pruned_at is not None for r in record.records(study, (TrialState.PRUNED,)))


def n_truncated(study: optuna.Study) -> int:
    """Trained trials whose training the wall-clock guard stopped early (kept off the front)."""
    return sum(r.truncated for r in record.records(study, (TrialState.COMPLETE,)))


def _n_running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


@contextlib.contextmanager
def _heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record Optuna heartbeats for ``trial`` while it runs (RDB storages with heartbeat on), so
    another worker can tell this trial from one whose worker died."""
    storage = study._storage  # noqa: SLF001
    interval = storage.get_heartbeat_interval() if isinstance(storage, RDBStorage) else None
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
            stop.wait(interval)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _recover(study: optuna.Study) -> None:
    recover_stale_trials(study)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # RDB heartbeats; a no-op elsewhere


def _finished_elsewhere(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether ``trial``, which this process is running, was finished by another one: on a
    storage that handed it to two processes, or failed as stale by a worker that missed its
    heartbeats. Writing to it then fails (``UpdateFinishedTrialError``, "Cannot tell a COMPLETE
    trial"), and what the other process recorded stands."""
    return study._storage.get_trial(trial._trial_id).state.is_finished()  # noqa: SLF001 - no public single-trial read


def _surplus(study: optuna.Study, trial: optuna.Trial, trials: int) -> bool:
    """True when earlier-numbered trials already fill the budget (another worker got there first)."""
    ahead = [
        r
        for r in record.records(study, (TrialState.COMPLETE, TrialState.RUNNING))
        if r.number < trial.number and (r.state == TrialState.RUNNING or r.trained)
    ]
    return len(ahead) >= trials


def run_search(
    config: SearchConfig,
    *,
    on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    ctx_study: tuple[TrialContext, optuna.Study] | None = None,
) -> optuna.Study:
    """Evaluate trials until ``config.trials`` have been trained in storage (or the timeout passes).

    Safe to run in several processes on one study: a worker starts a trial only while trained
    plus running trials are below the budget, and gives a trial back (pruned, ``surplus``) when a
    race let earlier trials fill it. Candidates that break a hard budget, or repeat a configuration
    already tried (pruned, ``duplicate_of``), are recorded without training and not counted, nor
    are trials early stopping stopped at a rung (pruned, ``pruned_at``); after
    ``MAX_UNTRAINED_IN_A_ROW`` of them in a row the search stops with a SearchError.
    """
    ctx, study = ctx_study or prepare(config)
    start, failures, untrained = time.monotonic(), 0, 0
    failed_here: BaseException | None = None  # the error a trial was failed with in this process
    while True:
        with claim_lock(config.storage):
            _recover(study)
        done = n_complete(study)
        if done >= config.trials:
            break
        if config.timeout is not None and time.monotonic() - start > config.timeout:
            logger.info("timeout reached after %d completed trials", done)
            break
        if done + _n_running(study) >= config.trials:
            time.sleep(POLL_SECONDS)  # the rest of the budget is running elsewhere; it may still fail
            continue
        # Optuna warns that heartbeats are meant for optimize(); we beat by hand
        with claim_lock(config.storage), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask()
        try:
            record.write_start(trial)  # at once: a trial without its pid is recovered only after a grace
            if _surplus(study, trial, config.trials):
                record.write_surplus(trial, "the budget was filled by other workers")
                study.tell(trial, state=TrialState.PRUNED)
                continue
            try:
                with _heartbeat(study, trial):
                    state, values = evaluate(ctx, trial)
            except BaseException as exc:  # noqa: BLE001 - only Ctrl-C is handled here; the rest re-raised
                finished = isinstance(exc, optuna.exceptions.UpdateFinishedTrialError | ValueError)
                if finished and _finished_elsewhere(study, trial):
                    raise  # another process finished it while this one evaluated: handled below
                if not interrupt.is_interrupt(exc):
                    # an error no trial outcome covers (a bug): the trial is recorded as failed with
                    # it, not left RUNNING for a resume to re-queue into the same error, then raised
                    with contextlib.suppress(Exception):  # storage gone too: the error itself still surfaces
                        record.write_failure(trial, f"error: {type(exc).__name__}: {exc}"[:500])
                        study.tell(trial, state=TrialState.FAIL)
                    failed_here = exc  # told FAIL here: not "finished by another process" below
                    raise
                # a resume trains it again, as it does a dead worker's trial (a baseline was lost for good)
                record.write_failure(trial, "interrupted; parameters re-queued" if trial.params else "interrupted")
                record.requeue(study, study.tell(trial, state=TrialState.FAIL))
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise KeyboardInterrupt from exc  # Ctrl-C surfaced wrapped (e.g. inside an import)
            frozen = study.tell(trial, values, state=state) if values else study.tell(trial, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as exc:
            if exc is failed_here or not _finished_elsewhere(study, trial):
                raise
            logger.warning("trial %d was finished by another process; its record there stands", trial.number)
            if interrupt.requested():  # a Ctrl-C while writing it still stops the search
                raise KeyboardInterrupt from exc
            continue
        failures = failures + 1 if state == TrialState.FAIL else 0
        done = record.record(study, frozen)
        if done.trained:
            untrained = 0
        elif state != TrialState.FAIL:
            untrained += 1
        if on_trial is not None:
            on_trial(study, frozen)
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SearchError(
                f"{failures} trials in a row failed (last: {done.failure}); check the space's lr ranges and the task"
            )
        if untrained >= MAX_UNTRAINED_IN_A_ROW:
            raise SearchError(_untrained_message(untrained, done, n_complete(study), config.trials))
    return study


def _untrained_message(count: int, last: record.TrialRecord, trained: int, trials: int) -> str:
    if last.pruned_at is not None:
        return (
            f"{count} candidates in a row were not trained to the end (the last stopped early: "
            f"{last.prune_reason}); {trained} of {trials} trained so far: the front may be out of reach of "
            f"this space's remaining candidates (ask for fewer --trials, or run with --no-prune)"
        )
    if last.duplicate_of is not None:
        return (
            f"{count} candidates in a row repeated configurations already tried; the space seems exhausted "
            f"after {trained} of {trials} trained trials (widen the space or ask for fewer --trials)"
        )
    return (
        f"{count} candidates in a row broke a hard budget (last: {last.skipped_training}); "
        f"the space has too few feasible candidates ({trained} of {trials} trained so far): loosen the "
        f"budget or narrow the space"
    )
