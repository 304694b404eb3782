"""What the README tells a new user holds (issue #49 items 3, 5 and 10); the commands themselves
run in order in a fresh clone through ``tests/readme_walkthrough.py`` (half an hour: not here)."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

from optuna.trial import FixedTrial

from hardware_profiles import load_profile
from nas.latency import predict
from nas.latency._shape import parse_shape
from nas.search.baselines import baselines
from nas.space import load_space
from nas.tasks import load_task

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _quickstart() -> list[list[str]]:
    block = re.search(r"## Quickstart\n\n```bash\n(.*?)```", README, flags=re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_cpu_install_line_works_anywhere_and_comes_before_the_two_commands():
    """Item 3: a plain ``pip install torch`` pulls the CUDA build; the CPU index must be given, and
    before the commands that install the project."""
    cpu = README.index("--index-url https://download.pytorch.org/whl/cpu")
    two = README.index('pip install -e ".[dev]" && nas search')
    assert cpu < two


def test_the_report_picture_is_there_and_the_readme_says_how_it_is_made():
    """Item 5: the picture exists, is a PNG, and the README names the command that draws it."""
    assert "![report of a default study](docs/report.png)" in README
    assert (ROOT / "docs" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "nas report --png" in README and "front2d.png" in README


def test_every_quickstart_search_parses_and_the_budget_example_leaves_a_front():
    """Item 10: the Quickstart's searches are valid commands; the one with a latency budget puts
    some but not all of the space's baselines under it on its target (the budget shows what it
    excludes and leaves candidates to search), as the README's sentence about it says."""
    from nas.cli import _build_parser

    searches = [argv for argv in _quickstart() if argv[:2] == ["nas", "search"]]
    assert len(searches) >= 2
    parser = _build_parser()
    parsed = [parser.parse_args(argv[1:]) for argv in searches]
    budgeted = [a for a in parsed if a.max_latency_ms is not None]
    assert len(budgeted) == 1
    args = budgeted[0]
    space = load_space(args.space)
    task = load_task(args.task or space.task)
    profile, shape = load_profile(args.target), parse_shape(args.latency_shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a transferred profile warns that it is uncalibrated
        costs = {
            b.label: predict(space.sample(FixedTrial(b.params), task).arch, shape, profile).median_ms
            for b in baselines(space)
        }
    over = {label for label, ms in costs.items() if ms > args.max_latency_ms}
    assert over and over != set(costs), costs
    assert "all-attention" in over and "the all-attention baseline" in README


def test_the_walkthrough_runs_a_command_continued_over_lines_as_one():
    """A bash line ending in a backslash continues on the next one: ``readme_walkthrough`` joins
    them, so the guide's long commands run (or are skipped) whole, never as two broken halves."""
    from tests.readme_walkthrough import commands

    page = "```bash\nnas search --space s \\\n  --context 32768   # note\nnas report\n```\n"
    assert commands(page) == ["nas search --space s --context 32768", "nas report"]
    guide = commands((ROOT / "docs" / "guide.md").read_text())
    assert not [line for line in guide if line.endswith("\\") or line.startswith("--")]
