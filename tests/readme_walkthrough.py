"""Run the README's and the user guide's commands, in order, in a fresh clone: what a new user would type.

    python tests/readme_walkthrough.py [--list] [--first N] [--keep DIR]

Takes every line of the ```bash blocks of README.md and then docs/guide.md (PAGES), in order, and
runs it with bash in a fresh clone of this repository (``git clone`` of the committed HEAD), with
this interpreter's environment (its
``bin/`` first on PATH: install the project there first, as the README's install lines say).
Lines that cannot run on this machine are listed as skipped with the reason: installs (done
before), the test suite (CI runs it), GPU-only and multi-host commands, other installs, and
long runs (``hybrid_long`` and 200-trial studies on a CPU). Not a pytest test: the commands
take half an hour on a 2-core CPU. Exit status 1 if a command that ran failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the pages whose commands a new user types, in the order they read them
PAGES = (ROOT / "README.md", ROOT / "docs" / "guide.md")

# (pattern, why): a line matching one is not run here
SKIPS = (
    (r"^pip install|^sudo apt-get", "an install: done before this script runs"),
    (r"pytest", "the test suite: CI runs it"),
    (r"--gpus|--trials-per-gpu|--device cuda", "needs GPUs"),
    (r"^nas measure", "needs a CUDA GPU the study's profile lists"),
    (r"postgres|NAS_TEST_POSTGRES_URL", "needs a PostgreSQL server"),
    (r"^optuna-dashboard", "a separate install (optuna-dashboard)"),
    (r"hybrid_long", "hours on a CPU: a GPU space"),
    (r"--png", "needs kaleido and Chromium (pip install -e '.[png]')"),
)


def commands(page: str) -> list[str]:
    """Every command line of a page's bash blocks, in order, comments and install prefixes
    (``pip install … &&``) removed."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", page, flags=re.S | re.M):
        block = re.sub(r"[ \t]*\\\n\s*", " ", block)  # a command continued onto the next line: one command
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()  # a trailing "  # comment"
            if line and not line.startswith("#"):
                lines.append(re.sub(r'^pip install -e "\.\[dev\]" && ', "", line))
    return lines


def skipped(line: str) -> str | None:
    return next((why for pattern, why in SKIPS if re.search(pattern, line)), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the commands and what would be skipped")
    parser.add_argument("--first", type=int, default=None, help="run only the first N commands")
    parser.add_argument("--keep", default=None, help="clone into DIR and keep it (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per command")
    args = parser.parse_args()
    lines = [line for page in PAGES for line in commands(page.read_text())][: args.first]
    if args.list:
        for line in lines:
            why = skipped(line)
            print(f"{'skip' if why else 'run '}  {line}" + (f"   ({why})" if why else ""))
        return 0
    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="readme-"))
    if where.exists() and any(where.iterdir()):
        print(f"{where} is not empty: give an empty or new folder", file=sys.stderr)
        return 2
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NAS_STORAGE", None)  # the README's default storage, runs/studies.journal in the clone
    failed = 0
    try:
        for line in lines:
            why = skipped(line)
            if why:
                print(f"skip  {line}   ({why})", flush=True)
                continue
            start = time.monotonic()
            try:
                run = subprocess.run(
                    ["bash", "-c", line], cwd=where, env=env, capture_output=True, text=True, timeout=args.timeout
                )
            except subprocess.TimeoutExpired as e:  # a failure like any other: say so and go on
                out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                run = subprocess.CompletedProcess(line, 124, out, f"timed out after {args.timeout:.0f} s")
            seconds = time.monotonic() - start
            print(
                f"{'ok  ' if run.returncode == 0 else 'FAIL'}  {line}   (rc {run.returncode}, {seconds:.0f} s)",
                flush=True,
            )
            if run.returncode != 0:
                failed += 1
                print((run.stdout + run.stderr)[-2000:], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    print(f"{failed} command(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
