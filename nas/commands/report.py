"""``nas report``: write a study's offline HTML report, and optionally its figures as PNGs."""

from __future__ import annotations

import argparse
import re

from nas.commands._common import EPSILON_HELP, STORAGE_HELP, console, epsilon, open_existing


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="write the study's offline HTML report (and optionally PNGs)")
    r.add_argument("--study", required=True, help="name of the study to report")
    r.add_argument("--storage", default=None, help=STORAGE_HELP)
    r.add_argument("--out", default=None, help="HTML path (default runs/<study>-report.html)")
    r.add_argument("--png", default=None, metavar="DIR", help="also write each figure as PNG into DIR (kaleido)")
    r.add_argument("--accuracy-epsilon", type=epsilon, default=None, help=EPSILON_HELP)
    r.add_argument(
        "--force", action="store_true", help="replace --out even where it is not an earlier report (never the study)"
    )


def run(args: argparse.Namespace) -> None:
    from pathlib import Path

    from nas.results.report import ReportError, check_outputs, write_html, write_pngs

    study, storage = open_existing(args)
    for flag, given in (("--out", args.out), ("--png", args.png)):  # the default runs/ folder is made
        if given is not None and not Path(given).parent.exists():
            raise ReportError(f"{flag} {given}: folder {Path(given).parent} does not exist; create it first")
    html = args.out or f"runs/{re.sub(r'[^A-Za-z0-9._=+-]', '_', study.study_name)}-report.html"  # a name is no path
    check_outputs(html, args.png, storage=storage, force=args.force)  # a bad --png: refused before the HTML
    out = write_html(study, html, args.accuracy_epsilon, storage=storage)
    console.print(f"report: {out}")
    if args.png:
        for path in write_pngs(study, args.png, args.accuracy_epsilon, storage=storage):
            console.print(f"png: {path}")
