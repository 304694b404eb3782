"""``python -m benchmarks``: finds every script by its question's name, refuses an unknown one with
exit 2, and runs a script as its own ``__main__`` from any working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.__main__ import main, questions

ROOT = Path(__file__).resolve().parents[2]


def test_every_script_is_a_question_with_its_docstring():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    known = questions()
    assert set(known) == scripts
    assert all(doc for doc in known.values())  # each names its question


def test_an_unknown_question_is_one_line_and_exit_2(capsys):
    assert main(["no_such_question"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_question" in err[0] and "search_quality" in err[0]


def test_runs_a_script_from_another_directory(tmp_path):
    env_path = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "search_quality", "--help"],
        cwd=tmp_path,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: search_quality.py" in out.stdout
