"""``nas spaces``: list the shipped search spaces, or print one's file (``nas spaces NAME > my.yaml``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nas.commands._common import console, write_raw


def add_parser(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("spaces", help="list shipped search spaces, or print one (nas spaces NAME > my.yaml)")
    sp.add_argument("name", nargs="?", help="show this space's file")


def run(args: argparse.Namespace) -> None:
    from nas.space import list_spaces, load_space

    if args.name:
        write_raw(Path(load_space(args.name).source).read_text())
        return
    for name in list_spaces():
        space = load_space(name)
        console.print(f"{name}: {space.description}  (default task {space.task})")
