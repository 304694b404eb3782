"""What every ``nas`` command shares: the consoles, the one-line usage error, the parser class,
the argument types (each refuses a bad value in one line) and the help texts several commands use."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleDimensions

if TYPE_CHECKING:
    import optuna


# rich's width for output that is not a terminal: wide enough that a front table row, a recipe or
# a task spec never wraps (rich wraps piped output at 80 columns, or at the width of whatever
# terminal stdin or stderr is, so CI logs and `nas spaces > file` had lines cut mid-string)
_PIPED_WIDTH = 10_000


class _Console(Console):
    """A rich console that wraps at the terminal's width, and not at all when piped."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        # piped: whatever width rich took from $COLUMNS when this module was imported
        if not self.is_terminal:
            return ConsoleDimensions(_PIPED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


# No console markup: what is printed holds user text (study names, file names, paths) in which
# rich would read "[red]" as a style and drop it, printing a study name that does not exist.
console = _Console(markup=False)
err = _Console(stderr=True, markup=False)


class UsageError(Exception):
    """Bad command-line input: printed as one line, ``PROG: error: message``, exit code 2."""

    def __init__(self, message: str, prog: str = "nas") -> None:
        super().__init__(message)
        self.prog = prog  # "nas search" for a subcommand's flags


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # a token that starts "-<digit>" is a value (no flag of ours looks so): argparse takes only
        # plain negative numbers so, and "--latency-shape -1x256" or "--max-latency-ms -1e3" ended in
        # "expected one argument" instead of the value's own check (argparse has no public hook)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message, self.prog)


EPSILON_HELP = (
    "accuracies closer than this count as level on the front and in the picks (default: 1 / the task's scored "
    "test targets, its resolution, or either trial's spread over seeds where larger; 0: the plain front)"
)


PICK_HELP = (
    "how to choose from the feasible front: cheapest-best (default: the cheapest trial, by the study's first "
    "latency objective, whose accuracy is within ε of the best one's; see --accuracy-epsilon), knee (closest "
    "to the best accuracy and lowest latency, both min-max scaled), accuracy (most accurate, then cheapest) or "
    "latency (cheapest, then most accurate)"
)


def epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def objectives(text: str) -> tuple[str, ...]:
    from nas.search.objectives import parse_objectives

    try:
        return parse_objectives(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--objectives: ")) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def at_most(most: int, unit: str) -> Callable[[str], int]:
    """An argparse type: a positive integer of at most ``most`` ``unit`` (bounds: nas.search.setup)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,} {unit}, got {value:,}")
        return value

    return parse


def per_gpu_count(text: str) -> int | str:
    """``--trials-per-gpu``: a count of processes (at most ``MAX_WORKERS``), or ``auto``."""
    from nas.search.setup import MAX_WORKERS

    if text == "auto":
        return text
    if not text.strip().lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"must be a count of processes or auto, got {text!r}")
    return at_most(MAX_WORKERS, "processes")(text)


def latency_shape(text: str) -> str:
    """``BATCHxSEQ`` within ``MAX_BATCH`` x ``MAX_CONTEXT``; text that is no shape at all goes on to
    ``prepare``, whose one line says what a shape looks like."""
    from nas.search.setup import MAX_BATCH, MAX_CONTEXT

    match = re.fullmatch(r"([0-9]+)x([0-9]+)", text.strip().lower())
    if match is not None:
        batch, seq = int(match[1]), int(match[2])
        if batch > MAX_BATCH:
            raise argparse.ArgumentTypeError(f"batch {batch:,} is above the maximum of {MAX_BATCH:,} sequences")
        if seq > MAX_CONTEXT:
            raise argparse.ArgumentTypeError(f"sequence length {seq:,} is above the maximum of {MAX_CONTEXT:,} tokens")
    return text


def positive_float(text: str) -> float:
    """A finite number > 0 (a budget or a time; leaving the flag out is how to say "none")."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def count(text: str) -> int:
    """A whole number >= 0 (its upper bound is checked where the setting is)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def number(text: str) -> float:
    """A number; its range is checked where the setting is (nas.results.verify.check_settings)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def seed(text: str) -> int:
    """A seed the samplers and numpy accept: a whole number in [0, 2**32 - 1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32 - 1], got {text}")
    return value


STORAGE_HELP = "journal file path (in a folder that exists) or RDB URL (default $NAS_STORAGE or runs/studies.journal)"


def data_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--data PATH``: where the study's data file is on this host (``nas.tasks.task_moved``)."""
    parser.add_argument("--data", default=None, metavar="PATH", help=f"{what} (its SHA-256 must match)")


def open_existing(args: argparse.Namespace) -> tuple[optuna.Study, str]:
    from nas.search.storage import resolve_storage
    from nas.search.studies import open_study

    storage = resolve_storage(args.storage)
    return open_study(args.study, storage, create=False), storage


def write_raw(text: str) -> None:
    """A file's text to stdout exactly as it is (no wrapping, markup or highlighting): what
    ``nas spaces NAME > mine.yaml`` writes must be the file."""
    sys.stdout.write(text)
    sys.stdout.flush()
