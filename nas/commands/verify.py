"""``nas verify``: retrain the front and random trials for longer, and report how well the short
run ranks them (the proxy's fidelity)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from nas.commands._common import STORAGE_HELP, console, count, data_flag, number, open_existing, seed
from nas.commands._front import print_fidelity

if TYPE_CHECKING:
    import optuna

    from nas.results.verify import Planned
    from nas.search.objective import TrialContext
    from nas.search.record import Verified, VerifySettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser(
        "verify", help="retrain the front and random trials for longer: how well the short run ranks them"
    )
    v.add_argument("--study", required=True, help="name of the study to verify")
    v.add_argument(
        "--workers",
        type=count,
        default=1,
        metavar="N",
        help="long runs at once, each in its own process on --device (default 1; on a GPU 4-5 keep it busy)",
    )
    v.add_argument("--storage", default=None, help=STORAGE_HELP)
    v.add_argument(
        "--random",
        type=count,
        default=5,
        metavar="N",
        help="random trained trials off the front to retrain too (default 5)",
    )
    v.add_argument(
        "--steps-factor",
        type=number,
        default=4.0,
        metavar="M",
        help="train each trial's recipe for M times its steps (default 4; at most 100)",
    )
    v.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="long runs per trial, from different seeds, averaged (default 1; at most 16)",
    )
    v.add_argument(
        "--seed", type=seed, default=None, help="seed of the random trials' draw (default: the study's seed)"
    )
    v.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    data_flag(v, "the study's data file, where it is now if it moved")


def run(args: argparse.Namespace) -> None:
    import optuna

    from nas.results.export import study_task
    from nas.results.verify import MAX_WORKERS, VerifyError, check_settings, plan, run_verify
    from nas.search.record import VerifySettings, study_setup
    from nas.search.start import resolve_device
    from nas.search.storage import open_storage

    asked = VerifySettings(steps_factor=args.steps_factor, seeds=args.seeds, random=args.random)
    check_settings(asked)  # before the storage is opened
    if not 1 <= args.workers <= MAX_WORKERS:
        raise VerifyError(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    study, storage = open_existing(args)  # read only until every check has passed
    setup = study_setup(study)
    seed = args.seed if args.seed is not None else (setup.seed if setup is not None else 0)
    settings = dataclasses.replace(asked, seed=seed)
    plan(study, settings)  # a study with no trained trial ends here
    task = study_task(study, args.data)
    device = resolve_device(args.device)
    writable = optuna.load_study(study_name=study.study_name, storage=open_storage(storage))
    console.print(
        f"verifying study {study.study_name}: the front and {settings.random} random trial(s), "
        f"{settings.steps_factor:g}× their steps, {settings.seeds} seed(s) each, on {device}"
        + (f", {args.workers} at once" if args.workers > 1 else ""),
        soft_wrap=True,
    )
    note_replaced(writable, settings)
    run_verify(writable, settings, task, device, on_row=verify_line, workers=args.workers)
    print_fidelity(writable, table=True)


def note_replaced(study: optuna.Study, settings: VerifySettings) -> None:
    """Say so when this run's long runs are of another length or seed count than the stored rows,
    which it replaces (one correlation never mixes two references)."""
    from nas.search.record import verified, verify_settings

    earlier = verify_settings(study)
    if earlier is not None and not earlier.same_reference(settings) and (rows := verified(study)):
        console.print(
            f"replacing the {len(rows)} row(s) retrained at {earlier.steps_factor:g}× steps with {earlier.seeds} "
            f"seed(s) each: this run's long runs are {settings.steps_factor:g}× with {settings.seeds}",
            soft_wrap=True,
        )


def verify_line(i: int, n: int, planned: Planned, row: Verified, seconds: float | None) -> None:
    """``verify 2/6: trial 4 (front) L M | d=32, 80 steps: acc 0.812 → 0.900 (2.1 s)``."""
    r = planned.record
    if row.failure is not None:
        outcome = f"long run failed ({row.failure})"
    else:
        outcome = f"acc {r.accuracy:.3f} → {row.accuracy:.3f}"
    took = "stored, not retrained" if seconds is None else f"{seconds:.1f} s"
    console.print(
        f"verify {i}/{n}: trial {r.number} ({planned.why}) {r.arch_summary}, {row.steps} steps: {outcome} ({took})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def verify_after_search(study: optuna.Study, settings: VerifySettings, ctx: TrialContext, workers: int = 1) -> None:
    """``nas search --verify N``: nas verify on the study just searched, on its task and device,
    drawing the random trials with the study's seed, ``workers`` long runs at once (the search's
    processes per GPU on a GPU); a study with nothing to verify says so."""
    from nas.results.verify import VerifyError, plan, run_verify
    from nas.search.record import study_setup

    setup = study_setup(study)
    settings = dataclasses.replace(settings, seed=setup.seed if setup is not None else 0)
    try:
        plan(study, settings)
    except VerifyError as e:
        console.print(f"--verify: nothing to retrain: {e}", soft_wrap=True)
        return
    console.print(
        f"verifying: the front and {settings.random} random trial(s) at {settings.steps_factor:g}× their steps"
        + (f", {workers} at once" if workers > 1 else ""),
        soft_wrap=True,
    )
    note_replaced(study, settings)
    run_verify(study, settings, ctx.task, ctx.device, on_row=verify_line, workers=workers)
    print_fidelity(study, table=True)
