"""The README and docs/ hold: every ``nas`` command in their bash blocks parses with the CLI's own
parser, and every relative link or image points at a file that exists (and a heading, where it
names one)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# written in another branch (the benchmarks' page); the one link allowed to point nowhere until it lands
NOT_YET = {ROOT / "docs" / "benchmarks.md"}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _bash_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) for each line of the page's bash blocks, ``\\`` continuations joined;
    a line ending in ``# template`` is a pattern to fill in, not a command."""
    text = page.read_text()
    lines = []
    for block in FENCE.finditer(text):
        if block.group(1) != "bash":
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        pending, start = "", 0
        for offset, line in enumerate(block.group(2).splitlines()):
            if not pending:
                start = first + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command, pending = pending + line, ""
            if command.strip() and not re.search(r"#\s*template\s*$", command):
                lines.append((start, command))
    return lines


def _nas_commands() -> list[tuple[str, list[str]]]:
    """Each ``nas ...`` command of every page's bash blocks, split as a shell would (comments
    dropped, ``&&`` / ``;`` / ``|`` separating commands), with an id naming its page and line."""
    found = []
    for page in PAGES:
        for lineno, line in _bash_lines(page):
            lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|")
            lexer.whitespace_split = True
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token in {"&&", "||", ";", "|", "&"}:
                    if command[:1] == ["nas"]:
                        found.append((f"{_name(page)}:{lineno}", command))
                    command = []
                else:
                    command.append(token)
    return found


COMMANDS = _nas_commands()


def test_the_pages_hold_nas_commands():
    """So the test below cannot pass on nothing: the Quickstart's searches are among them."""
    readme = [argv for where, argv in COMMANDS if where.startswith("README.md:")]
    assert ["nas", "search"] in readme and ["nas", "search", "--trials", "40"] in readme
    assert any(where.startswith("docs/guide.md:") for where, _ in COMMANDS)


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_every_documented_nas_command_parses(argv, capsys):
    from nas.cli import UsageError, _build_parser

    try:
        _build_parser().parse_args(argv[1:])
    except (UsageError, SystemExit) as error:  # a bad flag, or --help
        pytest.fail(f"{shlex.join(argv)!r} does not parse: {error} {capsys.readouterr().err.strip()}")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links() -> list[tuple[str, Path, str]]:
    """(id, page, target) for each relative link and image outside code, in every page."""
    found = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code: `[--trial N | ...]` and the like
        for match in LINK.finditer(text):
            target = match.group(1)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                found.append((f"{_name(page)}->{target}", page, target))
    return list(dict.fromkeys(found))  # a link given twice on a page is checked once


LINKS = _links()


@pytest.mark.parametrize(("page", "target"), [link[1:] for link in LINKS], ids=[link[0] for link in LINKS])
def test_every_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if file in NOT_YET and not file.exists():
        return
    assert file.exists(), f"{_name(page)} links to {target}, which does not exist"
    if anchor and file.suffix == ".md":
        text = FENCE.sub("", file.read_text())
        anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
        assert anchor in anchors, f"{_name(page)} links to {target}: no such heading in {_name(file)}"


def test_the_readme_reaches_every_page_of_docs():
    """The README links the index, and the index links every other page of docs/."""
    targets = {where.split("->")[0]: set() for where, _, _ in LINKS}
    for where, page, target in LINKS:
        targets[where.split("->")[0]].add((page.parent / target.partition("#")[0]).resolve())
    assert (ROOT / "docs" / "README.md") in targets["README.md"]
    pages = {page for page in PAGES[1:] if page.name != "README.md"} | NOT_YET
    assert pages <= targets["docs/README.md"], pages - targets["docs/README.md"]


def test_the_precision_section_shows_a_label_a_prediction_gives():
    """docs/spaces.md quotes the label of a latency that does not price a narrower KV cache: it is
    the one the shipped H100 calibration gives at the default shape, not a blend of the forward's
    date and the decode model's interval."""
    from hardware_profiles import load_profile
    from nas.latency import LatencyShape, predict
    from nas.spec import ArchSpec, LayerSpec

    arch = ArchSpec(64, (LayerSpec("attention", heads=2, mlp_ratio=2, kv_dtype="fp8"),), 64, 64)
    label = predict(arch, LatencyShape(1, 256), load_profile("h100_sxm")).label()
    section = (ROOT / "docs" / "spaces.md").read_text().split("## Precision", 1)[1].split("\n## ", 1)[0]
    assert "not priced at kv fp8" in label and f"`{label}`" in " ".join(section.split()), label
