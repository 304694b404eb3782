"""Where studies live: an Optuna journal file by default, or any RDB URL Optuna accepts.

The journal file is Optuna's own format, so ``optuna`` CLI commands and optuna-dashboard open
it unchanged (``--storage runs/studies.journal``).
"""

from __future__ import annotations

import fcntl
import os
import warnings
from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from nas import settings

__all__ = [
    "DEFAULT_STORAGE",
    "FlockLock",
    "StorageError",
    "artifact_dir",
    "open_artifact_store",
    "open_storage",
    "resolve_storage",
]

DEFAULT_STORAGE = "runs/studies.journal"
HEARTBEAT_GRACE = 4  # a trial with no heartbeat for this many intervals belongs to a dead worker
_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")


class StorageError(ValueError):
    """The storage URL or path is unusable; the message says which and why."""


class FlockLock:
    """Journal-file lock held with ``fcntl.flock`` on ``<journal>.flock``.

    Optuna's default symlink lock retries with exponential sleeps up to a second and leaves a
    stale lock behind a killed writer (others then wait out a 30 s grace period); measured on an
    H200 host, four workers on one journal finished fewer trials per hour than one. A kernel
    lock queues writers without sleeping and is released by the kernel when its holder dies.
    Local file systems only: for several hosts use a database URL.
    """

    def __init__(self, journal: str) -> None:
        self._path = journal + ".flock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _heartbeat_seconds() -> int:
    """RDB heartbeat interval: ``$NAS_HEARTBEAT_SECONDS`` (tests use 1), default 30."""
    return settings.get().heartbeat_seconds


def resolve_storage(storage: str | None) -> str:
    """``--storage`` if given, else ``$NAS_STORAGE``, else the embedded default journal file."""
    return storage or settings.get().storage or DEFAULT_STORAGE


def open_storage(storage: str) -> BaseStorage:
    """An Optuna storage for a path (journal file, created on first use) or an RDB URL."""
    if "://" in storage:
        scheme = storage.split("://", 1)[0].split("+", 1)[0]
        if scheme not in _RDB_SCHEMES:
            raise StorageError(
                f"storage URL {storage!r}: unsupported scheme {scheme!r}; use a journal file path "
                f"or one of {[s + '://' for s in _RDB_SCHEMES]}"
            )
        if storage.startswith(("postgresql://", "postgres://")):
            # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; this project ships psycopg2
            storage = "postgresql+psycopg2://" + storage.split("://", 1)[1]
        beat = _heartbeat_seconds()
        try:
            with warnings.catch_warnings():  # heartbeat arguments are marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    storage,
                    engine_kwargs={"pool_pre_ping": True} if scheme != "sqlite" else None,
                    heartbeat_interval=beat,
                    grace_period=HEARTBEAT_GRACE * beat,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
                )
        except Exception as e:  # sqlalchemy/driver errors vary by backend; report them as one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StorageError(f"storage URL {storage!r}: cannot open it ({first})") from None
    path = Path(storage)
    if path.is_dir():
        raise StorageError(f"storage {storage!r} is a directory; give a journal file path such as {DEFAULT_STORAGE}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(str(path), lock_obj=FlockLock(str(path)))
        journal = JournalStorage(backend)
    except (OSError, ValueError) as e:
        raise StorageError(f"storage {storage!r}: not a readable Optuna journal file ({e})") from None
    except Exception as e:  # JSON errors from a file that is not a journal
        raise StorageError(f"storage {storage!r}: not an Optuna journal file ({type(e).__name__})") from None
    return journal


def artifact_dir(storage: str) -> Path:
    """Where per-trial files (trained weights) live: ``$NAS_ARTIFACTS``, else beside the study —
    ``runs/studies.journal`` → ``runs/studies.artifacts/``, ``sqlite:///x.db`` → ``x.artifacts/``;
    for a server database, ``runs/artifacts/`` (point every worker at a shared path with $NAS_ARTIFACTS)."""
    if (artifacts := settings.get().artifacts) is not None:
        return Path(artifacts)
    if storage.startswith("sqlite:///"):
        return Path(storage.removeprefix("sqlite:///")).with_suffix(".artifacts")
    if "://" in storage:
        return Path("runs/artifacts")
    return Path(storage).with_suffix(".artifacts")


def open_artifact_store(storage: str) -> FileSystemArtifactStore:
    """Optuna's file-system artifact store for ``storage`` (created on first use)."""
    path = artifact_dir(storage)
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)
