"""``python -m benchmarks QUESTION [ARGS...]``: run one benchmark script by its question's name.

    python -m benchmarks --list                       # the questions, one line each
    python -m benchmarks search_quality --quick       # = python benchmarks/search_quality.py --quick

Each script stays runnable on its own; this only finds it, so the repository root need not be on
``PYTHONPATH`` and the results land where the script writes them (``benchmarks/results/``).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def questions() -> dict[str, str]:
    """Script name → the first line of its docstring (the question it answers)."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        text = path.read_text()
        doc = text.split('"""', 2)[1].strip().splitlines()[0] if text.startswith('"""') else ""
        out[path.stem] = doc
    return out


def main(argv: list[str]) -> int:
    known = questions()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.strip().splitlines()[0])
        for name, doc in known.items():
            print(f"  {name:18s} {doc}")
        return 0
    name = argv[0].removesuffix(".py")
    if name not in known:
        print(f"benchmarks: unknown question {argv[0]!r}; choose one of {', '.join(known)}", file=sys.stderr)
        return 2
    root = str(HERE.parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # the scripts import nas and benchmarks._timing from the repository root
    sys.argv = [str(HERE / f"{name}.py"), *argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
