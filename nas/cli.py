"""``nas`` command line: search, worker, studies, report, export, verify, measure, profiles, spaces.

The CLI owns the terminal. Each command is a module of ``nas.commands`` with its flags
(``add_parser``) and what it does (``run``); this module assembles the parser, runs the command
and turns bad input into one line and exit code 2."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from nas.commands import export, measure, profiles, report, search, spaces, studies, verify, worker
from nas.commands._common import Parser, UsageError, err
from nas.search import interrupt

__all__ = ["main"]

# in the order ``nas --help`` lists them
_COMMANDS = {
    "search": search,
    "worker": worker,
    "studies": studies,
    "profiles": profiles,
    "report": report,
    "export": export,
    "verify": verify,
    "measure": measure,
    "spaces": spaces,
}


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nas", description="Hardware-aware NAS over hybrid attention / linear-attention stacks.")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each trial's candidate, training and scores to stderr; -vv adds debug detail",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in _COMMANDS.values():
        command.add_parser(sub)
    return parser


def _interrupt_once(signum: int, frame: object) -> None:
    """First Ctrl-C: stop with KeyboardInterrupt; later ones are ignored, so the running trial
    can still be recorded as interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupt.request()
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupt_once) if in_main_thread else None
    interrupted = False
    try:
        with warnings.catch_warnings():
            # nas.latency logs it as well: the log line is the one a terminal shows, once
            warnings.filterwarnings("ignore", message=r"the .* latency calibration was fitted on kernels")
            return _main(argv)
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C, possibly wrapped; anything else re-raised
        if not interrupt.is_interrupt(exc):
            raise
        interrupted = True
        err.print(f"nas: interrupted{_KEPT.get(_command(argv), '')}", markup=False)
        return 130
    finally:
        # after an interrupt, further Ctrl-Cs stay ignored: one landing during the interpreter's
        # shutdown would otherwise kill the process by SIGINT (exit -2) instead of exiting 130
        if in_main_thread and not interrupted:
            signal.signal(signal.SIGINT, previous)


# What an interrupted command leaves stored, by command (the others store nothing as they go).
_KEPT = {
    "search": "; finished trials are kept in the study",
    "worker": "; finished trials are kept in the study",
    "verify": "; trials retrained so far are kept in the study (rerun to retrain the rest)",
    "measure": "; trials measured so far are kept in the study (rerun to measure the rest)",
}


def _command(argv: Sequence[str] | None) -> str | None:
    """The command ``argv`` names (its first word that is not a flag), without parsing it again."""
    return next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)


def _user_errors() -> tuple[type[Exception], ...]:
    """Every error that means bad input: one line, exit 2 (imported once a command runs)."""
    from hardware_profiles import ProfileError
    from kernels.device import DeviceError
    from nas.results.export import ExportError
    from nas.results.measure import MeasureError
    from nas.results.pareto import PickError
    from nas.results.report import ReportError
    from nas.results.verify import VerifyError
    from nas.search.config import SearchError
    from nas.search.faults import FaultError
    from nas.search.storage import StorageError
    from nas.search.workers import WorkerError
    from nas.settings import SettingsError
    from nas.space import SpaceError
    from nas.tasks import TaskError

    return (
        UsageError,
        SearchError,
        SpaceError,
        TaskError,
        ProfileError,
        StorageError,
        ExportError,
        PickError,
        ReportError,
        VerifyError,
        MeasureError,
        WorkerError,
        FaultError,
        SettingsError,
        DeviceError,
    )


def _fail(e: Exception) -> int:
    prog = e.prog if isinstance(e, UsageError) else "nas"
    err.print(f"{prog}: error: {e}", markup=False, highlight=False, soft_wrap=True)
    return 2


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _build_parser().parse_args(argv)  # --help and bad flags end here, before any heavy import
    except UsageError as e:
        return _fail(e)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # -v: the engine's per-trial story (candidate, training, scores); -vv: debug detail and Optuna's own
    logging.getLogger("nas").setLevel({0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG))
    user_errors = _user_errors()
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose >= 2 else optuna.logging.WARNING)
        _COMMANDS[args.command].run(args)
    except user_errors as e:
        return _fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
