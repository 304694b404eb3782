"""Storage URLs: a malformed one, or one naming a file that holds no studies, is refused in one
line (exit 2) by every command, and the file it names is left byte-identical."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import optuna
import pytest

from nas.cli import main
from nas.search import storage as storage_module
from nas.search.storage import StorageError, artifact_dir, open_storage, redacted
from tests.conftest import write_space

READERS = [
    ("studies", lambda url, out: ["studies", "--storage", url]),
    ("report", lambda url, out: ["report", "--study", "edge", "--storage", url, "--out", str(out / "r.html")]),
    ("export", lambda url, out: ["export", "--study", "edge", "--storage", url, "--out", str(out / "e")]),
    ("worker", lambda url, out: ["worker", "--study", "edge", "--trials", "1", "--storage", url]),
]


def _one_line_exit_2(argv: list[str], capsys, words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nas: error: ") and words in err, err
    return err


def _digests(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` by relative path, with its content's digest."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _foreign(path: Path) -> None:
    """Another application's SQLite database: one table of its own."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (x)")
        db.execute("INSERT INTO notes VALUES (1)")
    db.close()


def _no_tables(path: Path) -> None:
    """A SQLite database holding no table (a page size set, so the file has a header)."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 7")
    db.close()


NOT_STUDIES = [
    ("foreign-tables", _foreign, "is not an Optuna study database (it holds other tables: notes)"),
    ("zero-bytes", lambda p: p.write_bytes(b""), "is not an Optuna study database (it holds no table)"),
    ("no-tables", _no_tables, "is not an Optuna study database (it holds no table)"),
    ("text", lambda p: p.write_text("my notes\n"), "is not a SQLite database file"),
]


@pytest.fixture
def folders(tmp_path) -> tuple[Path, Path]:
    """Where the database lies, and where outputs go: apart, so every file a command creates
    beside the database shows."""
    (tmp_path / "db").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "db", tmp_path / "out"


@pytest.mark.parametrize("content", NOT_STUDIES, ids=[c[0] for c in NOT_STUDIES])
@pytest.mark.parametrize("case", READERS, ids=[c[0] for c in READERS])
def test_a_sqlite_file_without_studies_is_refused_by_readers_and_left_as_it_was(folders, capsys, case, content):
    """Optuna creates its schema in any file it opens: nas export wrote 14 tables into another
    application's database (8 KB became 118 KB), and into an empty file, then failed anyway for
    want of the study."""
    where, out = folders
    db = where / "u.db"
    content[1](db)
    before = _digests(where)
    _one_line_exit_2(case[1](f"sqlite:///{db}", out), capsys, content[2])
    assert _digests(where) == before
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("content", NOT_STUDIES[:1] + NOT_STUDIES[3:], ids=["foreign-tables", "text"])
def test_search_refuses_a_sqlite_file_of_another_application(folders, capsys, content):
    """As a journal path holding something else is refused: a search used to add Optuna's tables
    to the file (and left a lock file beside it)."""
    where, _ = folders
    db = where / "u.db"
    content[1](db)
    before = _digests(where)
    space = write_space(where.parent)
    argv = ["search", "--space", str(space), "--trials", "1", "--device", "cpu", "--storage", f"sqlite:///{db}"]
    _one_line_exit_2(argv, capsys, content[2])
    assert _digests(where) == before


@pytest.mark.parametrize("content", NOT_STUDIES[1:3], ids=["zero-bytes", "no-tables"])
def test_a_writer_creates_its_schema_in_an_empty_sqlite_file(tmp_path, content):
    """An empty file holds nothing to lose: a writer makes it a study database, as before, and
    readers then open it."""
    db = tmp_path / "u.db"
    content[1](db)
    url = f"sqlite:///{db}"
    optuna.create_study(study_name="edge", storage=open_storage(url), directions=["maximize"])
    names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url, write=False), False)]
    assert names == ["edge"]


def test_a_half_made_schema_is_refused_by_readers_and_completed_by_writers(tmp_path, capsys):
    """A nas search killed while it created the file's tables leaves Optuna's first one only:
    opening it, Optuna would create the rest and stamp its version. A reader refuses it untouched;
    a writer completes it."""
    db = tmp_path / "u.db"
    url = f"sqlite:///{db}"
    open_storage(url).engine.dispose()
    with sqlite3.connect(db) as con:
        for (name,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'studies'"
        ).fetchall():
            con.execute(f"DROP TABLE {name}")
    con.close()
    before = db.read_bytes()
    _one_line_exit_2(["studies", "--storage", url], capsys, "its Optuna schema is incomplete")
    assert db.read_bytes() == before
    optuna.create_study(study_name="edge", storage=open_storage(url), directions=["maximize"])
    assert main(["studies", "--storage", url]) == 0
    assert "edge" in capsys.readouterr().out


def test_a_reader_creates_no_table_even_past_the_file_check(tmp_path, monkeypatch):
    """The second guard, for a server database, where the file check cannot look: a reading
    command's Optuna storage creates no table (it fails to find them, in one line)."""
    db = tmp_path / "u.db"
    _foreign(db)
    before = db.read_bytes()
    monkeypatch.setattr(storage_module, "_check_sqlite", lambda *a, **k: None)
    with pytest.raises(StorageError, match="cannot open it"):
        open_storage(f"sqlite:///{db}", write=False)
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    "form",
    [
        lambda db: f"sqlite+pysqlite:///{db}",
        lambda db: f"sqlite:///{db}?timeout=3",
        lambda db: f"sqlite:///{str(db).replace(' ', '%20')}",
    ],
    ids=["driver", "query", "percent-encoded"],
)
def test_every_sqlite_url_form_sqlalchemy_reads_finds_the_database(tmp_path, capsys, form):
    """The file was taken from the text after ``sqlite:///``: a reader said "no such database
    file" for a database named with a driver, a query or a %20, which SQLAlchemy opens."""
    db = tmp_path / "my studies.db"
    optuna.create_study(study_name="edge", storage=open_storage(f"sqlite:///{db}"), directions=["maximize"])
    before = db.read_bytes()
    assert main(["studies", "--storage", form(db)]) == 0
    assert "edge" in capsys.readouterr().out
    assert db.read_bytes() == before


NO_FILE = [
    ("empty-path", lambda d: "sqlite:///", "in-memory database"),
    ("bare", lambda d: "sqlite://", "in-memory database"),
    ("memory", lambda d: "sqlite:///:memory:", "in-memory database"),
    ("root", lambda d: "sqlite:////", "names a directory"),
    ("dot-slash", lambda d: "sqlite:///./", "names a directory"),
    ("directory", lambda d: f"sqlite:///{d}", "names a directory"),
    ("trailing-slash", lambda d: f"sqlite:///{d}/new/", "names a directory"),
    ("host", lambda d: "sqlite://host/x.db", "a SQLite URL names no host"),
    ("journal-dot", lambda d: ".", "is a directory"),
    ("journal-root", lambda d: "/", "is a directory"),
]
MALFORMED = [
    ("ipv6-unclosed", "postgresql://[::1", "is malformed (Invalid IPv6 URL)"),
    ("ipv6-unclosed-userinfo", "mysql://u:pw@[::1/db", "is malformed (Invalid IPv6 URL)"),
    ("port-not-a-number", "postgresql://u:p@h:notaport/db", "is malformed (invalid literal for int()"),
    ("mysql-without-driver", "mysql://u@localhost/db", "cannot open it (Failed to import DB access module"),
]


@pytest.mark.parametrize("command", ["search", "studies"])
@pytest.mark.parametrize("case", NO_FILE + MALFORMED, ids=[c[0] for c in NO_FILE + MALFORMED])
def test_a_storage_naming_no_file_or_malformed_is_one_line(tmp_path, capsys, command, case):
    """nas search --storage sqlite:/// ended in ``ValueError: PosixPath('.') has an empty name``
    (the artifacts directory beside a file with no name), --storage 'postgresql://[::1' in
    ``ValueError: Invalid IPv6 URL``; readers and writers now say the same one line."""
    url = case[1](tmp_path) if callable(case[1]) else case[1]
    argv = ["studies", "--storage", url]
    if command == "search":
        argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--device", "cpu", "--storage", url]
    before = _digests(tmp_path)
    _one_line_exit_2(argv, capsys, case[2])
    assert _digests(tmp_path) == before


def test_an_artifacts_directory_needs_a_named_file(tmp_path):
    with pytest.raises(StorageError, match="in-memory database"):
        artifact_dir("sqlite:///")
    with pytest.raises(StorageError, match="is a directory"):
        artifact_dir(str(tmp_path))
    assert artifact_dir(f"sqlite:///{tmp_path}/a%20b.db?timeout=3") == tmp_path / "a b.artifacts"


def test_weights_an_older_version_stored_beside_an_escaped_sqlite_name_are_found(tmp_path):
    """Older versions took the text after sqlite:/// as the file (a%20b.db -> a%20b.artifacts),
    where SQLAlchemy reads "a b.db": a study they wrote keeps its weights in a%20b.artifacts, which
    is used while "a b.artifacts" does not exist (export said the weights were missing)."""
    url = f"sqlite:///{tmp_path}/a%20b.db"
    (tmp_path / "a%20b.artifacts").mkdir()
    assert artifact_dir(url) == tmp_path / "a%20b.artifacts"
    (tmp_path / "a b.artifacts").mkdir()
    assert artifact_dir(url) == tmp_path / "a b.artifacts"


def test_only_the_password_of_the_url_is_masked(capsys):
    """Every occurrence of the password in the message was replaced: with password ``p`` the
    port ``notaport`` read ``nota***ort``, and ``psycopg2`` read ``***syco***g2``."""
    err = _one_line_exit_2(["studies", "--storage", "postgresql://u:p@h:notaport/db"], capsys, "'notaport'")
    assert "u:***@h:notaport" in err and "u:p@" not in err and "***ort" not in err
    # nothing listens on port 1: the driver's refusal names itself and the port, unmasked
    err = _one_line_exit_2(["studies", "--storage", "postgresql://u:p@localhost:1/db"], capsys, "psycopg2.")
    assert "u:***@localhost:1" in err and "port 1" in err and "u:p@" not in err


def test_redacted_masks_the_userinfo_wherever_the_url_appears():
    url = "postgresql://nas:s3cret@db.example:5432/studies"
    assert redacted(url) == "postgresql://nas:***@db.example:5432/studies"
    assert redacted("postgresql://nas:p@ss@h/db") == "postgresql://nas:***@h/db"  # a password holding "@"
    assert redacted("postgresql://[::1") == "postgresql://[::1"
    assert redacted("runs/a:b@c.journal") == "runs/a:b@c.journal"
    masked = storage_module._masked(f"could not parse {url} (port 5432)", url)
    assert masked == "could not parse postgresql://nas:***@db.example:5432/studies (port 5432)"
