"""Where studies live: an Optuna journal file by default, or any RDB URL Optuna accepts.

The journal file is Optuna's own format, so ``optuna`` CLI commands and optuna-dashboard open
it unchanged (``--storage runs/studies.journal``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError

from nas import settings

__all__ = [
    "DEFAULT_STORAGE",
    "FlockLock",
    "StorageError",
    "artifact_dir",
    "check_artifact_dir",
    "claim_lock",
    "file_in_the_way",
    "open_artifact_store",
    "open_storage",
    "output_clash",
    "resolve_storage",
    "stored_paths",
]

DEFAULT_STORAGE = "runs/studies.journal"
HEARTBEAT_GRACE = 4  # a trial with no heartbeat for this many intervals belongs to a dead worker
_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")
_FIRST_LINE_LIMIT = 1 << 20  # a journal opens with a create-study record: a few hundred bytes
# a server database's schema creation that lost a race to another process's (a table "already
# exists", the schema version is stamped twice) is tried again this many times: it skips what
# exists by then
_SCHEMA_RETRIES = 3
# a SQLite file a reading command opens must hold these, with their rows: Optuna creates or stamps
# what it misses on opening, and a reader must write nothing (``_check_sqlite``)
_OPTUNA_SCHEMA = ("studies", "version_info", "alembic_version")
# server-database storages this process opened, by (pid, URL, write, heartbeat): each holds an
# SQLAlchemy engine whose pool keeps connections open until the engine is collected, so opening one
# per call (a poll loop, an API user's loop) ran a server out of connections ("too many clients")
_SERVER_STORAGES: dict[tuple[int, str, bool, int], RDBStorage] = {}


class StorageError(ValueError):
    """The storage URL or path is unusable; the message says which and why."""


class FlockLock:
    """Journal-file lock held with ``fcntl.flock`` on ``<journal>.flock`` (a SQLite file's
    ``claim_lock`` is one too).

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
    """``--storage`` if given, else ``$NAS_STORAGE``, else the embedded default journal file.
    An empty ``--storage ""`` is refused rather than falling through to the default file silently."""
    if storage is not None and not storage.strip():
        raise StorageError(f"--storage must be a journal file path or an RDB URL, got {storage!r}")
    return storage or settings.get().storage or DEFAULT_STORAGE


def _check_journal(path: Path, *, write: bool) -> None:
    """StorageError unless ``path`` is a file Optuna can use as a journal, before Optuna touches it.

    Optuna skips a last line it cannot parse, so a file of anything else reads as an empty
    journal (``nas studies`` listed nothing) and a writer appends after it; a last record cut
    off (a full disk, a killed copy) is glued to the next record appended, and the journal no
    longer parses. Reading may skip such a record; writing is refused (``write``).
    """
    if not path.exists():
        if not write:
            raise StorageError(f"storage {str(path)!r}: no such journal file (nas search creates one)")
        if path.parent.is_dir() or path == Path(DEFAULT_STORAGE):
            return  # created on first use (the default's folder runs/ too: it is this tool's own)
        folder = f"{str(path.parent)!r} is not a folder" if path.parent.exists() else f"no folder {str(path.parent)!r}"
        raise StorageError(
            f"storage {str(path)!r}: {folder}; a journal file is created on first use, its folder is not "
            "(a mistyped path would hide a study there): create the folder first, or give another path"
        )
    if not path.is_file():
        raise StorageError(f"storage {str(path)!r} is not a regular file; give a journal file path")
    try:
        with path.open("rb") as f:
            first = f.readline(_FIRST_LINE_LIMIT)
    except OSError as e:
        raise StorageError(f"storage {str(path)!r}: cannot read it ({e.strerror or e})") from None
    if not first:
        return  # an empty journal: Optuna's own starting point
    try:
        record = json.loads(first)
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("op_code"), int) or "worker_id" not in record:
        cut = "" if first.endswith(b"\n") else ", or its only record is cut off"
        raise StorageError(
            f"storage {str(path)!r} is not an Optuna journal file (its first line is not a journal record{cut}); "
            f"nothing was written"
        )
    if write and not _ends_whole(path, locked=False) and not _ends_whole(path, locked=True):
        raise StorageError(
            f"storage {str(path)!r} ends in a partial record (its last line is cut off); nothing was "
            f"written: restore the journal from a copy, or remove the partial last line"
        )


def _unparsable_line(path: Path) -> tuple[int, str] | None:
    """The number (from 1) of the first whole line of journal ``path`` that is not JSON, and the
    decoder's words; None when each is. Optuna's error gives the position inside the record
    only (``line 1 column 2``), which names no place in the file."""
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                return (number, f"{e.msg} at column {e.colno}") if line.endswith(b"\n") else None
            except UnicodeDecodeError:
                return (number, "not UTF-8 text") if line.endswith(b"\n") else None
    return None


def _ends_whole(path: Path, *, locked: bool) -> bool:
    """Whether the journal's last byte is a newline. ``locked``: read under the journal's lock,
    so a record another worker is appending right now is read whole (without a lock file no
    worker of ours is writing: nothing to wait for, and no lock file is created)."""
    lock = FlockLock(str(path)) if locked else None
    if lock is not None:
        if not Path(str(path) + ".flock").exists():
            return False
        lock.acquire()
    try:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    finally:
        if lock is not None:
            lock.release()


def open_storage(storage: str, *, write: bool = True) -> BaseStorage:
    """An Optuna storage for a path (journal file) or an RDB URL. ``write``: the caller may write
    (a journal file is created on first use, in a folder that exists but for the default's
    ``runs/``; one ending in a partial record is refused); else the storage must exist already,
    and nothing is created or written (a SQLite file must hold Optuna's schema: ``_check_sqlite``)."""
    if not storage.strip():
        raise StorageError(f"storage must be a journal file path or an RDB URL, got {storage!r}")
    if "://" in storage:
        scheme, shown = _scheme(storage), redacted(storage)
        _rdb_url(storage)  # refuses a malformed URL, or a SQLite one naming no file, before a driver sees it
        if (database := _sqlite_file(storage)) is not None:
            _check_sqlite(database, shown, write=write)  # a file holding something else is refused
        if storage.startswith(("postgresql://", "postgres://")):
            # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; this project ships psycopg2
            storage = "postgresql+psycopg2://" + storage.split("://", 1)[1]
        if database is not None:  # a file can be replaced between calls: opened afresh each time
            with claim_lock(storage) if write else contextlib.nullcontext():  # one process creates its tables
                return _open_rdb(storage, scheme, shown, write=write)
        key = (os.getpid(), storage, write, _heartbeat_seconds())  # an engine must not cross a fork
        if (cached := _SERVER_STORAGES.get(key)) is None:
            cached = _SERVER_STORAGES[key] = _open_rdb(storage, scheme, shown, write=write)
        return cached
    path = Path(storage)
    if path.is_dir():
        raise StorageError(f"storage {storage!r} is a directory; give a journal file path such as {DEFAULT_STORAGE}")
    _check_journal(path, write=write)
    try:
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
        backend = JournalFileBackend(str(path), lock_obj=FlockLock(str(path)))
        journal = JournalStorage(backend)
    except (OSError, ValueError) as e:
        if isinstance(e, ValueError) and (bad := _unparsable_line(path)) is not None:
            number, why = bad
            raise StorageError(
                f"storage {storage!r}: line {number} is not a journal record ({why}); nothing was written: "
                "restore the journal from a copy"
            ) from None
        raise StorageError(f"storage {storage!r}: not a readable Optuna journal file ({e})") from None
    except Exception as e:  # JSON errors from a file that is not a journal
        raise StorageError(f"storage {storage!r}: not an Optuna journal file ({type(e).__name__})") from None
    return journal


def _open_rdb(storage: str, scheme: str, shown: str, *, write: bool) -> RDBStorage:
    """Optuna's RDBStorage for ``storage`` (``shown``: the URL as given, password masked). Without
    ``write`` Optuna creates no table: a reader finds the schema there, or fails saying so."""
    beat, attempts = _heartbeat_seconds(), 0
    while True:
        try:
            with warnings.catch_warnings():  # heartbeat arguments are marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    storage,
                    engine_kwargs={"pool_pre_ping": True} if scheme != "sqlite" else None,
                    heartbeat_interval=beat,
                    grace_period=HEARTBEAT_GRACE * beat,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
                    skip_table_creation=not write,
                )
        except Exception as e:  # sqlalchemy/driver errors vary by backend; report them as one line
            if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ is not None:
                # a reader's first query (no table creation before it) wraps the driver's error in a vague one
                e = e.__cause__
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if (isinstance(e, IntegrityError) or "already exists" in first) and attempts < _SCHEMA_RETRIES:
                attempts += 1
                continue  # another process created (some of) the tables, or stamped their version, meanwhile
            raise StorageError(f"storage URL {shown!r}: cannot open it ({_masked(first, storage)})") from None


@contextlib.contextmanager
def claim_lock(storage: str) -> Iterator[None]:
    """Held while a process creates a new SQLite file's tables, or takes a trial from a SQLite
    study's queue (and fails the trials of dead workers): SQLite ignores the row lock
    (``SELECT ... FOR UPDATE``) Optuna relies on to hand a queued trial to one process only
    (optuna#4621), so two processes could both take the same baseline. A ``FlockLock`` on
    ``<file>.flock``, as a journal's writers hold; a journal and a server database need none (a
    journal's claims are decided in its append order, a server honours the row lock)."""
    path = _sqlite_file(storage)
    if path is None or not path.parent.is_dir():
        yield  # not a file other processes open (or one SQLite cannot create: it says so)
        return
    lock = FlockLock(str(path))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def redacted(storage: str) -> str:
    """``storage`` with a URL's password replaced by ``***`` (``postgresql://nas:***@host/db``):
    what error messages and logs may show."""
    return _masked(storage, storage)


def _masked(text: str, storage: str) -> str:
    """``text`` with the user information of URL ``storage`` (``nas:secret@``) shown as
    ``nas:***@`` wherever the URL appears in it. Only that: the password's characters elsewhere
    (a port, a driver's name) are left as they are, or the message would garble them."""
    netloc = re.split(r"[/?#]", storage.split("://", 1)[1], maxsplit=1)[0] if "://" in storage else ""
    if "@" not in netloc:
        return text
    userinfo = netloc.rsplit("@", 1)[0]  # a password may hold an "@"; the host cannot
    if ":" not in userinfo or not userinfo.split(":", 1)[1]:
        return text
    return text.replace(f"{userinfo}@", f"{userinfo.split(':', 1)[0]}:***@")


def _scheme(storage: str) -> str:
    """A URL's scheme without its driver: ``postgresql+psycopg2://...`` → ``postgresql``."""
    return storage.split("://", 1)[0].split("+", 1)[0]


def _rdb_url(storage: str) -> URL:
    """URL ``storage`` as SQLAlchemy reads it; StorageError, naming what is wrong, for one that
    cannot hold studies: another scheme, a malformed URL (an unclosed IPv6 bracket ended in a
    ``ValueError`` traceback), a SQLite URL naming no file (``sqlite:///`` did, in the artifacts
    directory's name), or a host (SQLAlchemy's refusal spans lines)."""
    scheme, shown = _scheme(storage), redacted(storage)
    if scheme not in _RDB_SCHEMES:
        raise StorageError(
            f"storage URL {shown!r}: unsupported scheme {scheme!r}; use a journal file path "
            f"or one of {[s + '://' for s in _RDB_SCHEMES]}"
        )
    try:
        urlsplit(storage)  # an unclosed IPv6 bracket, which make_url reports as a bad port number
        url = make_url(storage)
    except (ValueError, ArgumentError) as e:
        raise StorageError(f"storage URL {shown!r} is malformed ({_masked(str(e), storage)})") from None
    if scheme != "sqlite":
        return url
    if url.host or url.port or url.username or url.password:
        raise StorageError(
            f"storage URL {shown!r}: a SQLite URL names no host; give sqlite:///relative/path.db "
            "(three slashes) or sqlite:////absolute/path.db (four)"
        )
    if url.database in (None, "", ":memory:"):
        raise StorageError(
            f"storage URL {shown!r} is an in-memory database, lost when this process exits; "
            "give a file (sqlite:///runs/studies.db) or a journal path"
        )
    if url.database.endswith("/") or Path(url.database).is_dir():
        raise StorageError(
            f"storage URL {shown!r} names a directory; give a database file such as sqlite:///runs/studies.db"
        )
    return url


def _sqlite_file(storage: str) -> Path | None:
    """The database file of a SQLite URL (``sqlite:///runs/studies.db``, with a driver or a
    query too), as SQLAlchemy reads it (``%20`` is a space); None for another storage.
    StorageError for a SQLite URL that names no file (``_rdb_url``)."""
    if "://" not in storage or _scheme(storage) != "sqlite":
        return None
    return Path(_rdb_url(storage).database)


def _check_sqlite(path: Path, shown: str, *, write: bool) -> None:
    """StorageError unless ``path`` is a SQLite file Optuna may open, before Optuna touches it.

    Optuna creates its tables in any file it opens: a reading command wrote its schema into an
    empty file, or another application's database, and then failed for want of the study. A
    reader needs Optuna's whole schema, stamped with its version. A writer also takes a new or
    empty file, or one a killed ``nas search`` left half made (Optuna creates ``studies`` first,
    and completes the rest); another application's tables are refused, as a journal path that
    holds something else is (``_check_journal``).
    """
    if not path.exists():
        if write:
            return  # SQLite creates it (or says why it cannot)
        raise StorageError(f"storage URL {shown!r}: no such database file (nas search creates one)")
    if not path.is_file():
        raise StorageError(f"storage URL {shown!r}: {str(path)!r} is not a regular file; give a database file")
    tables, stamped = _sqlite_schema(path, shown)
    if write and (not tables or "studies" in tables):
        return
    if "studies" not in tables:
        held = f"it holds other tables: {', '.join(sorted(tables))}" if tables else "it holds no table"
        raise StorageError(
            f"storage URL {shown!r} is not an Optuna study database ({held}); nothing was written"
            + (": give another file" if tables else " (nas search creates one)")
        )
    if not stamped:
        raise StorageError(
            f"storage URL {shown!r}: its Optuna schema is incomplete (a nas search creating it was cut "
            "short); nothing was written: nas search on it completes it"
        )


def _sqlite_schema(path: Path, shown: str) -> tuple[set[str], bool]:
    """The tables of SQLite file ``path``, and whether Optuna's schema there is whole and stamped
    with its version (``_OPTUNA_SCHEMA``, each with a row). Read through a read-only connection:
    nothing is created, not even a rollback journal beside the file."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            stamped = all(
                name in tables and db.execute(f"SELECT EXISTS (SELECT 1 FROM {name})").fetchone()[0]
                for name in _OPTUNA_SCHEMA
            )
    except sqlite3.DatabaseError as e:
        if e.sqlite_errorname == "SQLITE_NOTADB":
            raise StorageError(f"storage URL {shown!r} is not a SQLite database file; nothing was written") from None
        raise StorageError(f"storage URL {shown!r}: cannot read it ({e})") from None
    return tables, stamped


def artifact_dir(storage: str) -> Path:
    """Where per-trial files (trained weights) live: ``$NAS_ARTIFACTS``, else beside the study —
    ``runs/studies.journal`` → ``runs/studies.artifacts/``, ``sqlite:///x.db`` → ``x.artifacts/``;
    for a server database, ``runs/artifacts/`` (point every worker at a shared path with $NAS_ARTIFACTS)."""
    if (artifacts := settings.get().artifacts) is not None:
        return Path(artifacts)
    if (database := _sqlite_file(storage)) is not None:
        here = database.with_suffix(".artifacts")
        # versions before URLs were read as SQLAlchemy reads them took the text after sqlite:///
        # as it was (a%20b.db -> a%20b.artifacts): a study they wrote keeps its weights there
        written = Path(storage.removeprefix("sqlite:///")).with_suffix(".artifacts")
        if storage.startswith("sqlite:///") and written != here and not here.exists() and written.is_dir():
            return written
        return here
    if "://" in storage:
        return Path("runs/artifacts")
    if Path(storage).is_dir():  # "." or "/" has no name to give a suffix (a ValueError traceback)
        raise StorageError(f"storage {storage!r} is a directory; give a journal file path such as {DEFAULT_STORAGE}")
    return Path(storage).with_suffix(".artifacts")


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` that is not a directory (nothing can be made
    below it), or None."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_artifact_dir(storage: str) -> Path:
    """The artifacts directory of ``storage``, or StorageError when it cannot be one (a file is
    there, or above it); a search checks this before it writes to the study."""
    path = artifact_dir(storage)
    where = " ($NAS_ARTIFACTS)" if settings.get().artifacts is not None else ""
    if path.exists() and not path.is_dir():
        raise StorageError(f"artifacts directory {str(path)!r}{where} is a file; give a directory for trained weights")
    if (blocker := file_in_the_way(path)) is not None:
        raise StorageError(f"artifacts directory {str(path)!r}{where}: {str(blocker)!r} is a file, not a directory")
    return path


def open_artifact_store(storage: str, *, create: bool = True) -> FileSystemArtifactStore:
    """Optuna's file-system artifact store for ``storage`` (``create``: made on first use)."""
    path = check_artifact_dir(storage)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"artifacts directory {str(path)!r}: cannot create it ({e.strerror or e})") from None
    return FileSystemArtifactStore(path)


def stored_paths(storage: str) -> dict[str, Path]:
    """What holds ``storage``'s studies on this machine, by what it is: the journal file and its
    lock, or the SQLite file, and the artifacts directory. Outputs must stay clear of them."""
    paths: dict[str, Path] = {}
    if (database := _sqlite_file(storage)) is not None:
        paths |= {"database": database, "database lock": Path(str(database) + ".flock")}
    elif "://" not in storage:
        paths |= {"journal": Path(storage), "journal lock": Path(storage + ".flock")}
    return paths | {"artifacts directory": artifact_dir(storage)}


def output_clash(out: str | Path, storage: str) -> str | None:
    """How writing, or replacing, ``out`` would hit ``storage``'s files (``stored_paths``): it is
    one, lies inside one, or holds one (``"holds the study's journal runs/studies.journal"``);
    None when they are apart."""
    target = Path(out).resolve()
    for what, stored in stored_paths(storage).items():
        held = stored.resolve()
        if target == held:
            return f"is the study's {what}"
        if held in target.parents:
            return f"lies inside the study's {what} {stored}"
        if target in held.parents:
            return f"holds the study's {what} {stored}"
    return None
