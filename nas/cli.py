"""``nas`` command line: search, worker, studies, report, export, verify, measure, profiles, spaces.

The CLI owns the terminal."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import re
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleDimensions
from rich.table import Table

from nas.search import interrupt

if TYPE_CHECKING:  # the CLI imports torch/optuna only when a command needs them (nas --help stays fast)
    import optuna

    from hardware_profiles import HardwareProfile
    from nas.latency import Latency
    from nas.results.verify import Planned
    from nas.search.objective import TrialContext
    from nas.search.objectives import Objective
    from nas.search.record import TrialRecord, Verified, VerifySettings

__all__ = ["main"]

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


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # a token that starts "-<digit>" is a value (no flag of ours looks so): argparse takes only
        # plain negative numbers so, and "--latency-shape -1x256" or "--max-latency-ms -1e3" ended in
        # "expected one argument" instead of the value's own check (argparse has no public hook)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message, self.prog)


_EPSILON_HELP = (
    "accuracies closer than this count as level on the front and in the picks (default: 1 / the task's scored "
    "test targets, its resolution, or either trial's spread over seeds where larger; 0: the plain front)"
)
_PICK_HELP = (
    "how to choose from the feasible front: cheapest-best (default: the cheapest trial, by the study's first "
    "latency objective, whose accuracy is within ε of the best one's; see --accuracy-epsilon), knee (closest "
    "to the best accuracy and lowest latency, both min-max scaled), accuracy (most accurate, then cheapest) or "
    "latency (cheapest, then most accurate)"
)


def _epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _objectives(text: str) -> tuple[str, ...]:
    from nas.search.objectives import parse_objectives

    try:
        return parse_objectives(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--objectives: ")) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _at_most(most: int, unit: str) -> Callable[[str], int]:
    """An argparse type: a positive integer of at most ``most`` ``unit`` (bounds: nas.search.setup)."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,} {unit}, got {value:,}")
        return value

    return parse


def _latency_shape(text: str) -> str:
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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _count(text: str) -> int:
    """A whole number >= 0 (its upper bound is checked where the setting is)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _number(text: str) -> float:
    """A number; its range is checked where the setting is (nas.results.verify.check_settings)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _seed(text: str) -> int:
    """A seed the samplers and numpy accept: a whole number in [0, 2**32 - 1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32 - 1], got {text}")
    return value


_STORAGE_HELP = "journal file path (in a folder that exists) or RDB URL (default $NAS_STORAGE or runs/studies.journal)"


def _data_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--data PATH``: where the study's data file is on this host (``nas.tasks.task_moved``)."""
    parser.add_argument("--data", default=None, metavar="PATH", help=f"{what} (its SHA-256 must match)")


def _build_parser() -> argparse.ArgumentParser:
    from nas.search.setup import DEFAULT_PICK, MAX_BATCH, MAX_CONTEXT, MAX_TRIALS, MAX_WORKERS, PICKS, SAMPLERS

    parser = _Parser(prog="nas", description="Hardware-aware NAS over hybrid attention / linear-attention stacks.")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each trial's candidate, training and scores to stderr; -vv adds debug detail",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("search", help="run (or resume) a search study")
    s.add_argument("--space", default="hybrid_small", help="shipped space name or a YAML path (default hybrid_small)")
    s.add_argument("--task", default=None, help="task spec, e.g. mqar:seq_len=64 or data.npz (default: the space's)")
    s.add_argument(
        "--trials",
        type=_at_most(MAX_TRIALS, "trials"),
        default=20,
        help=f"trained trials to reach (default 20; at most {MAX_TRIALS:,}); candidates that break a hard budget "
        "are not counted",
    )
    s.add_argument("--timeout", type=_positive_float, default=None, help="stop starting trials after this many seconds")
    s.add_argument(
        "--study",
        default=None,
        help="study name (default: <space>-<task>-<target>, then the settings that differ from the defaults, "
        "e.g. -accuracy+decode_latency-ctx8192)",
    )
    s.add_argument("--storage", default=None, help=_STORAGE_HELP)
    s.add_argument(
        "--sampler", choices=SAMPLERS, default=None, help="Optuna sampler (default tpe; a resume: the study's)"
    )
    s.add_argument("--target", default="auto", help="auto (this GPU, else h200) or a hardware profile name/path")
    s.add_argument(
        "--latency-shape",
        type=_latency_shape,
        default="1x256",
        help=f"BATCHxSEQ the latency is scored at (default 1x256; at most {MAX_BATCH}x{MAX_CONTEXT})",
    )
    s.add_argument(
        "--objectives",
        type=_objectives,
        default=("accuracy", "latency", "memory"),
        help="accuracy and 1-3 of latency, memory (the forward at --latency-shape), prefill_latency, "
        "decode_latency, cache_memory (generation at --context); fixed when the study is created "
        "(default accuracy,latency,memory)",
    )
    s.add_argument(
        "--context",
        type=_at_most(MAX_CONTEXT, "tokens"),
        default=None,
        help="tokens each sequence holds for prefill_latency, decode_latency and cache_memory "
        f"(e.g. 32768; at most {MAX_CONTEXT})",
    )
    s.add_argument(
        "--decode-batch",
        type=_at_most(MAX_BATCH, "sequences"),
        default=1,
        help=f"sequences prefilled and decoded together for the generation objectives (default 1; at most {MAX_BATCH})",
    )
    s.add_argument("--max-latency-ms", type=_positive_float, default=None, help="hard latency budget")
    s.add_argument("--max-params", type=_positive_int, default=None, help="hard parameter budget")
    s.add_argument(
        "--max-memory-mb", type=_positive_float, default=None, help="hard memory budget, in MiB (2**20 bytes)"
    )
    s.add_argument(
        "--trial-timeout",
        type=_positive_float,
        default=None,
        help="fail a trial that runs longer than this many seconds",
    )
    s.add_argument(
        "--max-train-seconds",
        type=_positive_float,
        default=None,
        help="the wall-clock guard on each training, instead of the space's max_train_seconds (a trial it "
        "stops is recorded truncated, off the front); for a machine slower or busier than the space assumed",
    )
    s.add_argument(
        "--retrain-truncated",
        action="store_true",
        help="a resume queues the study's truncated trials again, to train them in full on top of --trials",
    )
    s.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="seed of the sampler and the task data (default 0; a resume: the study's)",
    )
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    lat = s.add_mutually_exclusive_group()
    lat.add_argument(
        "--measure",
        dest="measure",
        action="store_const",
        const=True,
        default=None,
        help="time each candidate's Triton kernels on this GPU (CUDA-graph replay); the default on "
        "a CUDA device when --target is auto or this GPU's profile",
    )
    lat.add_argument(
        "--predict",
        dest="measure",
        action="store_const",
        const=False,
        help="predict latency from the --target profile even on a GPU",
    )
    s.add_argument(
        "--prune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="early stopping on known costs: stop a trial at a rung (1/8, 1/4, 1/2 of its steps; of a length "
        "curriculum's last stage) when even its "
        "best case is dominated at its latency and memory; fixed when the study is created (default off)",
    )
    s.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="do not start a new study with its reference architectures (all-attention, all-linear, 3:1 hybrid)",
    )
    s.add_argument(
        "--verify",
        type=_count,
        default=None,
        metavar="N",
        help="when the search ends, run nas verify on the study: retrain the front and N random other trials "
        "at 4x their steps and report how well the short-run accuracy ranks them",
    )
    s.add_argument("--gpus", default=None, help="comma-separated GPU indices: one worker process per GPU")
    s.add_argument(
        "--trials-per-gpu",
        type=_at_most(MAX_WORKERS, "processes"),
        default=None,
        help=f"worker processes per GPU, with --gpus (default 1; at most {MAX_WORKERS} processes in all)",
    )
    s.add_argument(
        "--workers",
        type=_at_most(MAX_WORKERS, "processes"),
        default=None,
        help=f"CPU worker processes (without --gpus; default 1, at most {MAX_WORKERS})",
    )

    w = sub.add_parser("worker", help="join a study started by nas search (from any shell or host)")
    w.add_argument("--study", required=True, help="name of the study to join")
    w.add_argument("--storage", default=None, help=_STORAGE_HELP)
    w.add_argument("--trials", type=_positive_int, default=None, help="trained trials to reach (default: the study's)")
    w.add_argument("--timeout", type=_positive_float, default=None, help="stop starting trials after this many seconds")
    w.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    w.add_argument(
        "--worker-index", type=int, default=None, help="label of this worker's progress lines (default: pid)"
    )
    _data_flag(w, "the study's data file, where this host has it when not at the recorded path")

    st = sub.add_parser("studies", help="list studies in a storage, or show one")
    st.add_argument("--storage", default=None, help=_STORAGE_HELP)
    st.add_argument("--study", default=None, help="show this study only (exit 2 if absent)")

    p = sub.add_parser("profiles", help="hardware profiles")
    psub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    psub.add_parser("list", help="list shipped profiles")
    show = psub.add_parser("show", help="show one profile")
    show.add_argument("name", help="a shipped profile name (nas profiles list) or a YAML path")
    cal = psub.add_parser("calibrate", help="fit the latency model on this GPU and write it into the profile")
    cal.add_argument("--profile", default=None, help="profile name or YAML path (default: the one listing this GPU)")
    cal.add_argument("--out", default=None, help="where to write the calibrated profile (default: over the profile)")
    cal.add_argument("--rows", default=None, metavar="JSON", help="also save every timing row there (to refit later)")
    cal.add_argument("--fit-archs", type=_positive_int, default=60, help="random architectures fitted on (× 3 shapes)")
    cal.add_argument("--check-archs", type=_positive_int, default=40, help="architectures held out as the check")
    cal.add_argument(
        "--decode",
        action="store_true",
        help="fit only the decode-step model (decode_latency's prediction) and keep the forward's calibration",
    )
    cal.add_argument(
        "--decode-archs", type=_positive_int, default=36, help="random architectures for --decode (× 5 shapes)"
    )

    r = sub.add_parser("report", help="write the study's offline HTML report (and optionally PNGs)")
    r.add_argument("--study", required=True, help="name of the study to report")
    r.add_argument("--storage", default=None, help=_STORAGE_HELP)
    r.add_argument("--out", default=None, help="HTML path (default runs/<study>-report.html)")
    r.add_argument("--png", default=None, metavar="DIR", help="also write each figure as PNG into DIR (kaleido)")
    r.add_argument("--accuracy-epsilon", type=_epsilon, default=None, help=_EPSILON_HELP)
    r.add_argument(
        "--force", action="store_true", help="replace --out even where it is not an earlier report (never the study)"
    )

    e = sub.add_parser("export", help="export one architecture: arch.json, safetensors, ONNX, model card")
    e.add_argument("--study", required=True, help="name of the study to export from")
    e.add_argument("--storage", default=None, help=_STORAGE_HELP)
    which = e.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, default=None, help="export this trial number")
    which.add_argument("--pick", choices=PICKS, default=DEFAULT_PICK, help=_PICK_HELP)
    e.add_argument(
        "--max-latency-ms",
        type=_positive_float,
        default=None,
        help="pick only among front trials at or below this latency",
    )
    e.add_argument(
        "--max-memory-mb",
        type=_positive_float,
        default=None,
        help="pick only among front trials at or below this memory, in MiB (2**20 bytes)",
    )
    e.add_argument("--accuracy-epsilon", type=_epsilon, default=None, help=_EPSILON_HELP)
    e.add_argument("--out", required=True, help="bundle directory (must be absent or empty, or see --force)")
    e.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export bundle at --out (a directory holding only arch.json, model.safetensors, "
        "model.onnx, card.md and a large model's model.onnx.data); any other non-empty --out is refused",
    )
    e.add_argument(
        "--retrain-steps", type=_positive_int, default=None, help="retrain this many steps before writing (<= 1000000)"
    )
    e.add_argument("--device", default="auto", help="device for --retrain-steps")
    _data_flag(e, "with --retrain-steps: the study's data file, where it is now if it moved")

    v = sub.add_parser(
        "verify", help="retrain the front and random trials for longer: how well the short run ranks them"
    )
    v.add_argument("--study", required=True, help="name of the study to verify")
    v.add_argument(
        "--workers",
        type=_count,
        default=1,
        metavar="N",
        help="long runs at once, each in its own process on --device (default 1; on a GPU 4-5 keep it busy)",
    )
    v.add_argument("--storage", default=None, help=_STORAGE_HELP)
    v.add_argument(
        "--random",
        type=_count,
        default=5,
        metavar="N",
        help="random trained trials off the front to retrain too (default 5)",
    )
    v.add_argument(
        "--steps-factor",
        type=_number,
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
        "--seed", type=_seed, default=None, help="seed of the random trials' draw (default: the study's seed)"
    )
    v.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    _data_flag(v, "the study's data file, where it is now if it moved")

    m = sub.add_parser("measure", help="time on this GPU the latencies a study predicted for it, beside them")
    m.add_argument("--study", required=True, help="name of the study to measure")
    m.add_argument("--storage", default=None, help=_STORAGE_HELP)
    m.add_argument("--front", action="store_true", help="only the front's trials (default: every trained trial)")
    m.add_argument("--again", action="store_true", help="measure trials measured on this GPU before again")
    m.add_argument("--device", default="cuda", help="the CUDA GPU to time on: cuda or cuda:N (default cuda)")

    sp = sub.add_parser("spaces", help="list shipped search spaces, or print one (nas spaces NAME > my.yaml)")
    sp.add_argument("name", nargs="?", help="show this space's file")
    return parser


def _search(args: argparse.Namespace) -> None:
    from optuna.trial import TrialState
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from nas.results.pareto import front
    from nas.search import record
    from nas.search.storage import resolve_storage
    from nas.search.study import (
        SearchConfig,
        n_complete,
        n_infeasible,
        n_pruned,
        n_truncated,
        not_retrained,
        prepare,
        run_search,
    )
    from nas.search.workers import parse_gpus, plan_slots, run_workers

    verify = None
    if args.verify is not None:  # checked before the study is opened: a bad N leaves nothing behind
        from nas.results.verify import check_settings
        from nas.search.record import VerifySettings

        verify = VerifySettings(steps_factor=4.0, random=args.verify)
        check_settings(verify)
    gpus = parse_gpus(args.gpus) if args.gpus else None
    slots = plan_slots(gpus, args.trials_per_gpu, args.workers)  # a flag the other one makes moot is refused
    config = SearchConfig(
        space=args.space,
        task=args.task,
        trials=args.trials,
        timeout=args.timeout,
        study=args.study,
        storage=resolve_storage(args.storage),
        sampler=args.sampler,
        target=args.target,
        latency_shape=args.latency_shape,
        max_latency_ms=args.max_latency_ms,
        max_params=args.max_params,
        max_memory_mb=args.max_memory_mb,
        trial_timeout=args.trial_timeout,
        max_train_seconds=args.max_train_seconds,
        retrain_truncated=args.retrain_truncated,
        seed=args.seed,
        measure=args.measure,
        prune=args.prune,
        baselines=args.baselines,
        device="cpu" if len(slots) > 1 and not gpus else args.device,
        objectives=args.objectives,
        context=args.context,
        decode_batch=args.decode_batch,
    )
    ctx, study = prepare(config)
    # a study this run created holds nothing yet but the baselines it queued
    fresh = all(t.state == TrialState.WAITING and record.baseline_of(t) for t in study.get_trials(deepcopy=False))
    done = n_complete(study)
    console.print(
        f"study {study.study_name} in {config.storage}: space {ctx.space.name}, "
        f"task {ctx.task.description or ctx.task.name}, {_costing_text(ctx)}, "
        f"device {ctx.device}; {done} trial(s) already trained",
        soft_wrap=True,
    )
    if (warning := _memory_warning(ctx)) is not None:
        console.print(warning, markup=False, highlight=False, soft_wrap=True)
    if args.retrain_truncated:
        config = dataclasses.replace(config, trials=config.trials + len(ctx.retrained))
        console.print(
            f"re-queued {len(ctx.retrained)} truncated trial(s) ({', '.join(map(str, ctx.retrained))}) to train in "
            f"full, on top of --trials: {config.trials} trained trials to reach"
            if ctx.retrained
            else "no truncated trial to retrain",
            soft_wrap=True,
        )
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("front {task.fields[front]}  best acc {task.fields[best]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # a terminal gets a live bar; a log (CI, nohup, a pipe) one line per finished trial
    lines = _TrialLines(study, config.trials, show_all=not console.is_terminal)
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        shown = front(study)  # a resume starts from the study's front, not from nothing
        bar = progress.add_task(
            "search",
            total=config.trials,
            completed=min(done, config.trials),
            front=len(shown),
            best=f"{shown[0].accuracy:.3f}" if shown else "-",
        )

        def on_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial | None = None) -> None:
            best = front(study)
            progress.update(
                bar,
                completed=min(n_complete(study), config.trials),
                front=len(best),
                best=f"{best[0].accuracy:.3f}" if best else "-",
            )
            for line in lines.new(study):
                progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

        if len(slots) == 1 and not gpus:
            run_search(config, on_trial=on_trial, ctx_study=(ctx, study))
        else:
            progress.console.print(f"{len(slots)} worker processes" + (f" on GPUs {','.join(gpus)}" if gpus else ""))
            try:
                codes = run_workers(
                    study,
                    config.storage,
                    config.trials,
                    slots,
                    timeout=config.timeout,
                    on_poll=on_trial,
                    verbose=args.verbose,
                    data=ctx.task.config.get("path") if "sha256" in ctx.task.config else None,
                )
            except BaseException:
                _remove_if_empty(study, config.storage, fresh)
                raise
            if any(codes):
                kept = (
                    f"study {study.study_name!r} had no trials and was removed"
                    if _remove_if_empty(study, config.storage, fresh)
                    else "finished trials are kept in the study"
                )
                raise UsageError(f"workers exited with codes {codes}; {kept}")
    skipped, truncated, pruned = n_infeasible(study), n_truncated(study), n_pruned(study)
    if failed := study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        reasons = collections.Counter(record.record(study, t).failure_kind() for t in failed)
        console.print(
            f"{len(failed)} trial(s) failed ({', '.join(f'{n} {why}' for why, n in reasons.most_common())}): "
            f"recorded with their reason, not counted toward --trials",
            soft_wrap=True,
        )
    if skipped:
        console.print(
            f"{skipped} candidate(s) broke a hard budget: recorded without training, not counted toward --trials",
            soft_wrap=True,
        )
    if truncated:
        hint = (
            "; to train them in full, resume with --retrain-truncated (and --max-train-seconds if the guard is "
            "too tight for this machine)"
            if not_retrained(study)
            else ""
        )
        console.print(
            f"{truncated} trial(s) stopped early by the time budget (max_train_seconds): recorded with "
            f"their steps, kept off the front and the hypervolume{hint}",
            soft_wrap=True,
        )
    if pruned:
        console.print(
            f"{pruned} trial(s) stopped early at a rung (their best case was dominated at their cost): recorded "
            f"as PRUNED with their partial curve, not counted toward --trials",
            soft_wrap=True,
        )
    _print_front(study)
    if verify is not None:
        _verify_after_search(study, verify, ctx)
    else:
        _print_fidelity(study, table=False)  # a resumed study verified before: its numbers so far
    # commands to paste into a shell: a name or path with a space or a quote is quoted
    storage_flag = f" --storage {shlex.quote(config.storage)}" if args.storage else ""
    name = shlex.quote(study.study_name)
    console.print(f"next: nas report --study {name}{storage_flag}", soft_wrap=True)
    console.print(f"      nas export --study {name}{storage_flag} --out export/", soft_wrap=True)


def _verify_after_search(study: optuna.Study, settings: VerifySettings, ctx: TrialContext) -> None:
    """``nas search --verify N``: nas verify on the study just searched, on its task and device,
    drawing the random trials with the study's seed; a study with nothing to verify says so."""
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
        f"verifying: the front and {settings.random} random trial(s) at {settings.steps_factor:g}× their steps",
        soft_wrap=True,
    )
    _note_replaced(study, settings)
    run_verify(study, settings, ctx.task, ctx.device, on_row=_verify_line)
    _print_fidelity(study, table=True)


def _remove_if_empty(study: optuna.Study, storage: str, fresh: bool) -> bool:
    """Delete ``study`` when this run created it and no trial started (a failed start leaves
    nothing behind; the baselines it queued are still only waiting); returns whether it was deleted."""
    import optuna
    from optuna.trial import TrialState

    from nas.search.storage import open_storage

    if not fresh or any(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False)):
        return False
    optuna.delete_study(study_name=study.study_name, storage=open_storage(storage))
    return True


class _TrialLines:
    """One line per trial that finished since the last call (failures only, unless ``show_all``),
    in the order they finished, each with the trained count as of its own end: with worker
    processes several finish between two polls, and each line used to show the count at the poll."""

    def __init__(self, study: optuna.Study, trials: int, *, show_all: bool) -> None:
        from nas.search.record import study_profile
        from nas.search.study import n_complete

        self._trials, self._show_all = trials, show_all
        self._profile = study_profile(study)  # the target GPU, whose memory a trial's is compared with
        self._seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
        self._trained = n_complete(study)

    def new(self, study: optuna.Study) -> list[str]:
        import datetime

        from nas.search.record import records, study_objectives

        ended = {t.number: t.datetime_complete or datetime.datetime.max for t in study.get_trials(deepcopy=False)}
        fresh = [
            r for r in records(study) if r.state.is_finished() and r.number not in self._seen and r.surplus is None
        ]
        out = []
        for r in sorted(fresh, key=lambda r: (ended[r.number], r.number)):
            self._seen.add(r.number)
            self._trained += r.trained
            if r.state.name == "FAIL" or r.truncated or self._show_all:
                out.append(_trial_line(r, self._trained, self._trials, study_objectives(study), self._profile))
        return out


def _trial_line(
    r: TrialRecord,
    trained: int,
    trials: int,
    objectives: Sequence[Objective] | None = None,
    profile: HardwareProfile | None = None,
) -> str:
    """``trial 4 (3/8 trained): L A | d=32, acc 0.912, latency 0.0213 ms, memory 0.41 MiB, 20 steps``
    (the costs are the study's ``objectives``; None: the default ones), and ``— memory 2.416e+06 MiB
    is more than h200's 141 GB (134,468 MiB)`` where a memory objective exceeds ``profile``'s GPU."""
    from nas.search.objectives import CATALOGUE, DEFAULT_OBJECTIVES

    objectives = objectives or tuple(CATALOGUE[n] for n in DEFAULT_OBJECTIVES)
    over = "".join(f" — {text}" for text in r.over_device(objectives, profile))
    if r.state.name == "FAIL":
        return f"trial {r.number} failed: {r.failure or '?'}"
    if r.duplicate_of is not None:
        return f"trial {r.number}: same configuration as trial {r.duplicate_of}; not trained again"
    if r.pruned_at is not None:
        return f"trial {r.number}: {r.arch_summary} stopped early — {r.prune_reason}; not counted"
    if r.state.name != "COMPLETE":
        return f"trial {r.number}: {r.state.name.lower()}"
    ref = f" baseline {r.baseline}:" if r.baseline else ""
    if r.requeued_from is not None:  # a dead worker's, an interrupted or a truncated trial, trained again
        ref = f" retrains trial {r.requeued_from}:{ref}"
    if r.skipped_training is not None:  # a baseline is named here too (it was only where trained)
        return (
            f"trial {r.number}:{ref} {r.arch_summary} {r.skipped_training}; not trained, "
            f"not counted ({trained}/{trials} trained){over}"
        )
    line = (
        f"trial {r.number} ({trained}/{trials} trained):{ref} {r.arch_summary}, acc {r.accuracy_text()}, "
        f"{r.costs_text(objectives)}, {r.steps_text()} steps"
    )
    return line + (f" — truncated ({r.truncation_text()}), kept off the front" if r.truncated else "") + over


def _worker(args: argparse.Namespace) -> None:
    from nas.search.record import record, study_objectives, study_profile
    from nas.search.storage import resolve_storage
    from nas.search.study import n_complete, run_search, worker_config

    config = worker_config(
        args.study,
        resolve_storage(args.storage),
        trials=args.trials,
        device=args.device,
        worker=args.worker_index,
        timeout=args.timeout,
        data=args.data,
    )
    label = f"worker {config.worker}: "
    profiles: dict[str, HardwareProfile | None] = {}  # the study's, read once

    def on_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        r = record(study, trial)
        if r.surplus is None:
            profile = profiles[study.study_name] if study.study_name in profiles else study_profile(study)
            profiles[study.study_name] = profile
            line = _trial_line(r, n_complete(study), config.trials, study_objectives(study), profile)
            console.print(label + line, markup=False, highlight=False, soft_wrap=True)

    study = run_search(config, on_trial=on_trial)
    console.print(f"{label}study {args.study} has {n_complete(study)} trained trials", soft_wrap=True)


def _memory_warning(ctx: TrialContext) -> str | None:
    """``warning: memory at 4096x1048576 of the baselines (all-attention 2.416e+06 MiB, …) is more
    than h200's 141 GB (134,468 MiB): …``: said before the first trial when the space's reference
    architectures (``nas.search.baselines``, whether or not the study trains them) need more memory
    than the target GPU has at the shapes the study costs; None when they fit or the profile gives
    no ``memory_gb``."""
    from optuna.trial import FixedTrial

    from nas.latency import cache_memory, memory
    from nas.search.baselines import baselines

    if ctx.profile.memory_gb is None:
        return None
    archs = []
    for b in baselines(ctx.space):
        try:
            archs.append((b.label, ctx.space.sample(FixedTrial(b.params), ctx.task, ctx.seed).arch))
        except ValueError:  # a parameter the space draws that the baseline does not fix
            continue
    kinds = []
    if "memory_mb" in ctx.objectives:
        kinds.append((f"memory at {ctx.shape}", "--latency-shape", lambda arch: memory(arch, ctx.shape).total_mb))
    if "cache_memory_mb" in ctx.objectives and ctx.context:
        kinds.append(
            (
                f"cache memory at context {ctx.context:,} × batch {ctx.decode_batch}",
                "--context or --decode-batch",
                lambda arch: cache_memory(arch, ctx.context, ctx.decode_batch).total_mb,
            )
        )
    lines = []
    for what, flag, cost in kinds:
        over = [(label, mb) for label, arch in archs if ctx.profile.over_memory(mb := cost(arch)) is not None]
        if over:
            lines.append(
                f"warning: {what} of the baselines ({', '.join(f'{label} {mb:.4g} MiB' for label, mb in over)}) is "
                f"{ctx.profile.over_memory(over[0][1])}: such models cannot run on one {ctx.profile.name}; "
                f"a smaller {flag} costs what fits"
            )
    return "\n".join(lines) or None


def _costing_text(ctx: TrialContext) -> str:
    """``objectives accuracy, decode latency, cache memory; decode latency per token at the context
    predicted for h200 (not timed here); generation costs at context 32,768 tokens, batch 1``: what
    the search scores and how its times are obtained, so a CPU run says its times are predictions
    before the first trial ends."""
    from nas.search.objectives import objectives_for

    objectives = objectives_for(ctx.objectives)
    how = "measured on this GPU" if ctx.measure else f"predicted for {ctx.profile.name} (not timed here)"
    times = {
        "latency_ms": f"at {ctx.shape}",
        "prefill_latency_ms": "at the context",
        "decode_latency_ms": "per token at the context",
    }
    timed = [f"{o.name.replace('_', ' ')} {times[o.metric]}" for o in objectives if o.metric in times]
    text = "objectives " + ", ".join(o.name.replace("_", " ") for o in objectives)
    if timed:
        text += f"; {' and '.join(timed)} {how}"
    if ctx.context:
        text += f"; generation costs at context {ctx.context:,} tokens, batch {ctx.decode_batch}"
    return text


def _print_front(study: optuna.Study) -> None:
    console.print(_front_table(study))


def _front_table(study: optuna.Study) -> Table:
    """The front as a table: one column per objective of the study, the baselines below it; ★ marks
    the trial ``nas export`` takes by default (listed below the front when ε-dominated there)."""
    from nas.results.pareto import accuracy_epsilon, completed, default_pick, front
    from nas.search.record import study_objectives, study_profile, study_setup

    objectives = study_objectives(study)
    profile = study_profile(study)
    trials = front(study)
    on_front = {r.number for r in trials}
    chosen = default_pick(study)
    star = chosen.number if chosen is not None else None
    # the baselines off the front, trained or over a hard budget (never trained: no accuracy), and
    # the default pick when a cheaper trial level with it stands for it on the displayed front
    refs = [r for r in completed(study) if r.number not in on_front and (r.baseline is not None or r.number == star)]
    caption = []
    for o in objectives:
        shown = trials or [r for r in completed(study) if r.trained]  # an empty front still says how
        sources = sorted({lat.label() for r in shown if (lat := r.latency_of(o.metric)) is not None})
        if sources:
            caption.append(f"{o.name.replace('_', ' ')} {'; '.join(sources)}")
    if any(r.measured is not None for r in trials + refs):
        caption.append("(predicted …): the search's prediction of a latency nas measure has timed since")
    setup = study_setup(study)
    if setup is not None and setup.context:
        caption.append(f"generation costs at context {setup.context:,} tokens, batch {setup.decode_batch}")
    if any(r.baseline is not None for r in refs):
        over = " (over budget: never trained, no accuracy)" if any(not r.trained for r in refs) else ""
        truncated = any(r.truncated for r in refs)
        cut = "; truncated: stopped by the time guard before their planned steps" if truncated else ""
        caption.append(f"below the line: baselines not on the front{over}{cut}")
    if late := [r for r in completed(study) if r.over_budget_text() is not None]:
        caption.append(
            f"{len(late)} trained trial(s) over the study's current budgets (set after they were trained; "
            f"{', '.join(str(r.number) for r in late)}): off the front, not picked"
        )
    if too_big := sorted(r.number for r in trials + refs if r.over_device(objectives, profile)):
        caption.append(
            f"> {profile.memory_gb:g} GB: trial(s) {', '.join(map(str, too_big))} need more memory than "
            f"{profile.name}'s {profile.memory_gb:g} GB ({profile.memory_mib:,.0f} MiB): they cannot run on one "
            f"{profile.name} as costed"
        )
    if chosen is not None:
        caption.append(f"★ nas export's pick: {_pick_text(accuracy_epsilon(study), star in on_front)}")
    table = Table(title=f"Pareto front of {study.study_name}: {len(trials)} trials", caption="\n".join(caption) or None)
    columns = ["trial", "architecture", "params", *(_column(o) for o in objectives), "recipe"]
    if "accuracy" not in [o.metric for o in objectives]:
        columns.insert(3, "acc")
    for col in columns:
        table.add_column(col, justify="left" if col in ("architecture", "recipe") else "right", overflow="fold")
    for r in trials + refs:  # the baselines that missed the front follow it, dimmed
        over = ", over budget" if not r.trained or r.over_budget else ""
        cut = f", truncated {r.steps_done}/{r.planned_steps} steps" if r.truncated else ""
        label = r.arch_summary + (f" ({r.baseline}{over}{cut})" if r.baseline else "")
        values = [_cell(r, o, profile) for o in objectives]
        if "accuracy" not in [o.metric for o in objectives]:
            values.insert(0, r.accuracy_text() if r.trained else "-")
        table.add_row(
            f"★ {r.number}" if r.number == star else str(r.number),
            label,
            r.params_text(),
            *values,
            r.recipe(),
            style="dim" if r.number not in on_front else None,
            end_section=bool(trials and refs) and r is trials[-1],
        )
    return table


def _pick_text(resolution: float, on_front: bool) -> str:
    """``the cheapest trial within ε of the best accuracy (ε: 0.00049 or a trial's seed spread, the
    larger)``, and where a pick off the displayed front is listed."""
    eps = f"ε: {resolution:.2g} or a trial's seed spread, the larger" if resolution else "ε: a trial's seed spread"
    off = "; listed below the line, as a cheaper level trial stands for it on the front" if not on_front else ""
    return f"the cheapest trial within ε of the best accuracy ({eps}){off}"


def _column(o: Objective) -> str:
    """``acc``, ``latency ms``, ``cache memory MiB``: a front table column."""
    return {"accuracy": "acc", "memory_mb": "mem MiB"}.get(o.metric, f"{o.name.replace('_', ' ')} {o.unit}")


def _cell(r: TrialRecord, o: Objective, profile: HardwareProfile | None = None) -> str:
    """A front table cell: the value in the column's unit, with a prediction's interval (accuracy:
    its spread over seeds), a latency ``nas measure`` timed with the search's prediction beside it
    (``0.0250 (predicted 0.0213 ±9%)``); a memory over ``profile``'s GPU memory is marked ``> 141 GB``."""
    value = r.value(o.metric)
    if value is None:
        return "?"
    if o.metric == "accuracy":
        return r.accuracy_text() if r.trained else "-"
    lat = r.latency_of(o.metric)
    interval = f" ±{lat.interval * 100:.0f}%" if lat is not None and lat.interval else ""
    over = f" > {profile.memory_gb:g} GB" if profile is not None and r.over_device((o,), profile) else ""
    # measured by nas measure: the search's prediction beside it
    predicted = f" ({_predicted_text(p).replace(' ms', '')})" if (p := r.prediction_of(o.metric)) is not None else ""
    return (f"{value:.4f}" if o.unit == "ms" else f"{value:.2f}") + interval + predicted + over


def _studies(args: argparse.Namespace) -> None:
    import optuna
    from optuna.trial import TrialState

    from nas.results.fidelity import fidelity
    from nas.search.storage import open_storage, resolve_storage
    from nas.search.study import n_complete, n_infeasible, n_truncated

    storage = resolve_storage(args.storage)
    store = open_storage(storage, write=False)
    summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
    if args.study is not None:
        summaries = [s for s in summaries if s.study_name == args.study]
        if not summaries:
            raise UsageError(f"no study named {args.study!r} in {storage}")
    # "trained": what --trials counts, the truncated ones (cut short by max_train_seconds, off the
    # front) among them; a COMPLETE trial that broke a hard budget was never trained;
    # "proxy_rho": nas verify's Spearman ρ of short- vs long-run accuracy ("-" before a verify)
    columns = (
        *("study", "trained", "truncated", "over_budget", "pruned", "failed", "running", "total", "started"),
        "proxy_rho",
    )
    rows = []
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=store)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        found = fidelity(study)
        rows.append(
            (
                s.study_name,
                str(n_complete(study)),
                str(n_truncated(study)),
                str(n_infeasible(study)),
                *(str(states.count(x)) for x in (TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)),
                str(len(states)),
                f"{s.datetime_start:%Y-%m-%d %H:%M}" if s.datetime_start else "-",
                "-" if found is None or found.proxy.spearman is None else f"{found.proxy.spearman:.2f}",
            )
        )
    if not console.is_terminal:  # piped: whole names, one tab-separated row per study, for scripts
        _write_raw("".join("\t".join(row) + "\n" for row in [columns, *rows]))
        return
    table = Table(title=f"studies in {storage}")
    for col in columns:
        table.add_column(col, overflow="fold")  # a narrow terminal folds a long name, never cuts it
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if args.study is not None:  # one study: its proxy fidelity in words, below its row
        _print_fidelity(optuna.load_study(study_name=args.study, storage=store), table=False)


def _open_existing(args: argparse.Namespace) -> tuple[optuna.Study, str]:
    from nas.search.storage import resolve_storage
    from nas.search.study import open_study

    storage = resolve_storage(args.storage)
    return open_study(args.study, storage, create=False), storage


def _report(args: argparse.Namespace) -> None:
    from nas.results.report import check_outputs, write_html, write_pngs

    study, storage = _open_existing(args)
    html = args.out or f"runs/{re.sub(r'[^A-Za-z0-9._=+-]', '_', study.study_name)}-report.html"  # a name is no path
    check_outputs(html, args.png, storage=storage, force=args.force)  # a bad --png: refused before the HTML
    out = write_html(study, html, args.accuracy_epsilon, storage=storage)
    console.print(f"report: {out}")
    if args.png:
        for path in write_pngs(study, args.png, args.accuracy_epsilon, storage=storage):
            console.print(f"png: {path}")


def _export(args: argparse.Namespace) -> None:
    from nas.results.export import export
    from nas.results.pareto import DEFAULT_PICK, accuracy_epsilon, more_accurate_within_epsilon, pair_epsilon, pick
    from nas.search.record import study_objectives
    from nas.search.study import resolve_device

    if args.data is not None and args.retrain_steps is None:
        raise UsageError("--data names the data to retrain on: it needs --retrain-steps")
    study, storage = _open_existing(args)
    chosen = pick(
        study,
        args.pick,
        trial=args.trial,
        max_latency_ms=args.max_latency_ms,
        max_memory_mb=args.max_memory_mb,
        epsilon=args.accuracy_epsilon,
    )
    device = str(resolve_device(args.device))
    out = export(
        study,
        chosen,
        args.out,
        storage=storage,
        retrain_steps=args.retrain_steps,
        force=args.force,
        device=device,
        data=args.data,
    )
    how = "" if args.trial is not None else f" (--pick {args.pick})"  # --trial N: the number is already said
    accuracy = json.loads((out / "arch.json").read_text())["metrics"]["accuracy"]  # the bundle's, retrained or not
    shown = (
        f"{accuracy:.3f} after {args.retrain_steps} retraining steps (study: {chosen.accuracy_text()})"
        if args.retrain_steps
        else chosen.accuracy_text()  # the search's: the bundle's accuracy, with its spread over seeds
    )
    cut = f" — stopped by its {chosen.truncation_text()}" if chosen.truncated and not args.retrain_steps else ""
    console.print(
        f"exported trial {chosen.number}{how}: {chosen.arch_summary}, accuracy "
        f"{shown}, {chosen.costs_text(study_objectives(study))}{cut} → {out}",
        soft_wrap=True,
    )
    if args.trial is None and args.pick in (DEFAULT_PICK, "accuracy"):
        other = more_accurate_within_epsilon(
            study, chosen, max_latency_ms=args.max_latency_ms, max_memory_mb=args.max_memory_mb
        )
        if other is not None:
            resolution = accuracy_epsilon(study, args.accuracy_epsilon)
            eps = pair_epsilon(other, chosen, resolution, spread=args.accuracy_epsilon is None)
            why = "the study's resolution" if eps == resolution else "the spread over seeds"
            console.print(
                f"note: trial {other.number} is more accurate ({other.accuracy_text()}) by no more than {why} "
                f"(ε = {eps:.3g}), so it counts as level and costs more; --accuracy-epsilon 0 picks it",
                soft_wrap=True,
            )
    console.print(f"load it with: import nas; model = nas.load({str(out)!r})", soft_wrap=True)


def _verify(args: argparse.Namespace) -> None:
    import optuna

    from nas.results.export import study_task
    from nas.results.verify import MAX_WORKERS, VerifyError, check_settings, plan, run_verify
    from nas.search.record import VerifySettings, study_setup
    from nas.search.storage import open_storage
    from nas.search.study import resolve_device

    asked = VerifySettings(steps_factor=args.steps_factor, seeds=args.seeds, random=args.random)
    check_settings(asked)  # before the storage is opened
    if not 1 <= args.workers <= MAX_WORKERS:
        raise VerifyError(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    study, storage = _open_existing(args)  # read only until every check has passed
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
    _note_replaced(writable, settings)
    run_verify(writable, settings, task, device, on_row=_verify_line, workers=args.workers)
    _print_fidelity(writable, table=True)


def _note_replaced(study: optuna.Study, settings: VerifySettings) -> None:
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


def _verify_line(i: int, n: int, planned: Planned, row: Verified, seconds: float | None) -> None:
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


def _print_fidelity(study: optuna.Study, *, table: bool) -> None:
    """The study's proxy fidelity lines (nothing before its first nas verify); ``table``: the
    verified trials first, short- beside long-run accuracy."""
    from nas.results.fidelity import fidelity, pairs
    from nas.results.pareto import front

    found = fidelity(study)
    if found is None:
        return
    if table:
        on_front = [r.number for r in front(study)]
        place = {n: i for i, n in enumerate(on_front)}  # the front's trials first, in its order
        rows = sorted(pairs(study), key=lambda p: (place.get(p[0].number, len(place)), p[0].number))
        out = Table(title=f"{study.study_name}: {len(rows)} trial(s) retrained at {found.steps_factor:g}× steps")
        for col in ("trial", "architecture", "params", "short acc", "long acc", "on front"):
            out.add_column(col, justify="left" if col == "architecture" else "right", overflow="fold")
        for r, row in rows:
            out.add_row(
                str(r.number),
                r.arch_summary,
                r.params_text(),
                f"{r.accuracy:.3f}",
                _long_text(row),
                "yes" if r.number in on_front else "",
            )
        console.print(out)
    for line in found.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _long_text(row: Verified) -> str:
    """``0.900``, ``0.900 (0.890-0.910)`` over several seeds, or ``failed`` for a diverged run."""
    if row.accuracy is None:
        return "failed"
    spread = f" ({min(row.accuracies):.3f}-{max(row.accuracies):.3f})" if len(row.accuracies) > 1 else ""
    return f"{row.accuracy:.3f}{spread}"


def _measure(args: argparse.Namespace) -> None:
    import optuna

    from nas.results.measure import check_gpu, local_gpu, misses, plan, run_measure, searched_setup
    from nas.search.record import study_objectives
    from nas.search.storage import open_storage

    study, storage = _open_existing(args)  # read only until every check has passed
    setup = searched_setup(study)
    if setup.measure:
        console.print(
            f"study {study.study_name} measured its latencies on {setup.profile} during the search: nothing to measure",
            soft_wrap=True,
        )
        return
    device, gpu = local_gpu(args.device)
    check_gpu(study, setup, gpu)
    chosen = plan(study, gpu, front_only=args.front, again=args.again)
    which = "front trial(s)" if args.front else "trained trial(s)"
    if not chosen.todo:
        why = (
            f"all {len(chosen.done)} {which} with a predicted latency were measured on {gpu} already "
            "(--again measures them again)"
            if chosen.done
            else f"study {study.study_name} has no {which.removesuffix('(s)')} with a predicted latency"
        )
        console.print(f"nothing to measure: {why}", soft_wrap=True)
        return
    writable = optuna.load_study(study_name=study.study_name, storage=open_storage(storage))
    skipped = f"; {len(chosen.done)} measured already, skipped" if chosen.done else ""
    console.print(
        f"measuring study {study.study_name}: {len(chosen.todo)} {which} predicted for {setup.profile}, "
        f"on {gpu} ({device}){skipped}",
        soft_wrap=True,
    )
    objectives = study_objectives(writable)
    done = run_measure(writable, chosen.todo, setup, device, again=args.again, on_trial=_measure_line)
    missed = [m for r in done for m in misses(r, objectives)]
    for m in missed:
        console.print(f"outside its interval: {m.text()}", markup=False, highlight=False, soft_wrap=True)
    compared = sum(r.prediction_of(o.metric) is not None for r in done for o in objectives)
    failed = len(chosen.todo) - len(done)
    console.print(
        f"measured {len(done)} trial(s) on {gpu}"
        + (f", {failed} could not be measured (left as predicted)" if failed else "")
        + f": {len(missed)} of {compared} prediction(s) outside their interval",
        soft_wrap=True,
    )
    _print_front(writable)


def _measure_line(i: int, n: int, r: TrialRecord, failure: str | None) -> None:
    """``measure 2/6: trial 4 L A | d=32: latency 0.0250 ms (predicted 0.0213 ms ±9%)``."""
    if failure is not None:
        outcome = f"not measured ({failure})"
    else:
        parts = []
        for metric in ("latency_ms", "prefill_latency_ms", "decode_latency_ms"):
            name = metric.removesuffix("_latency_ms").removesuffix("_ms")
            found, predicted = r.measured.of(metric), r.prediction_of(metric)
            if found is not None and predicted is not None:
                parts.append(f"{name} {found.median_ms:.4g} ms ({_predicted_text(predicted)})")
        outcome = ", ".join(parts)
    console.print(
        f"measure {i}/{n}: trial {r.number} {r.arch_summary}: {outcome}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _predicted_text(lat: Latency) -> str:
    """``predicted 0.0213 ms ±9%``: a prediction a measurement replaced, shown beside it."""
    spread = f" ±{lat.interval * 100:.0f}%" if lat.interval else ""
    return f"predicted {lat.median_ms:.4g} ms{spread}"


def _profiles(args: argparse.Namespace) -> None:
    from hardware_profiles import list_profiles, load_profile

    if args.action == "list":
        from nas.latency import prediction_status

        table = Table(title="hardware profiles: how latency is predicted for each (interval at the checked shapes)")
        for col in ("name", "GPU", "memory", "forward", "±", "kernels", "decode", "± ", "decode kernels"):
            table.add_column(col)
        for name in list_profiles():
            p = load_profile(name)
            forward, decode = prediction_status(p), prediction_status(p, decode=True)
            table.add_row(
                name,
                p.description.split(",")[0],
                "-" if p.memory_gb is None else f"{p.memory_gb:g} GB",
                forward.label,
                f"{forward.interval:.0%}",
                forward.fingerprint or "-",
                decode.label,
                f"{decode.interval:.0%}",
                decode.fingerprint or "-",
            )
        console.print(table)
        console.print(
            "calibrated: fitted on that GPU (nas profiles calibrate); transferred: another GPU's fit rescaled by "
            "datasheet ratios, not checked on this GPU; roofline: datasheet peaks only. kernels: whether the "
            "fit timed the kernels this checkout runs (if not, the interval is doubled)."
        )
    elif args.action == "calibrate" and args.decode:
        from nas.latency.calibrate_decode import calibrate_decode

        path, report = calibrate_decode(
            args.profile, args.out, archs=args.decode_archs, rows_out=args.rows, on_progress=console.print
        )
        for context, s in report.get("cv", {}).items():
            console.print(
                f"decode {context:>6s}: {s['within_10pct']:.1%} within ±10 %, Spearman {s['spearman']:.4f}, "
                f"95th pct |error| {s['p95_abs_error']:.1%} ({s['n']} steps, cross-validated by architecture)"
            )
        console.print(f"wrote {path}")
    elif args.action == "calibrate":
        from nas.latency.calibrate import calibrate

        path, report = calibrate(
            args.profile,
            args.out,
            fit_archs=args.fit_archs,
            check_archs=args.check_archs,
            on_progress=console.print,
            rows_out=args.rows,
        )
        for shape, s in report.get("check", {}).items():
            console.print(
                f"check {shape:7s}: {s['within_10pct']:.1%} within ±10 %, Spearman {s['spearman']:.4f}, "
                f"median ratio {s['median_ratio']:.3f}, 95th pct |error| {s['p95_abs_error']:.1%} "
                f"({s['n']} forwards the fit never saw)"
            )
        console.print(f"wrote {path}")
    else:
        p = load_profile(args.name)
        _write_raw(Path(p.path).read_text())


def _spaces(args: argparse.Namespace) -> None:
    from nas.space import list_spaces, load_space

    if args.name:
        _write_raw(Path(load_space(args.name).source).read_text())
        return
    for name in list_spaces():
        space = load_space(name)
        console.print(f"{name}: {space.description}  (default task {space.task})")


def _write_raw(text: str) -> None:
    """A file's text to stdout exactly as it is (no wrapping, markup or highlighting): what
    ``nas spaces NAME > mine.yaml`` writes must be the file."""
    sys.stdout.write(text)
    sys.stdout.flush()


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
        err.print("nas: interrupted; finished trials are kept in the study", markup=False)
        return 130
    finally:
        # after an interrupt, further Ctrl-Cs stay ignored: one landing during the interpreter's
        # shutdown would otherwise kill the process by SIGINT (exit -2) instead of exiting 130
        if in_main_thread and not interrupted:
            signal.signal(signal.SIGINT, previous)


def _user_errors() -> tuple[type[Exception], ...]:
    """Every error that means bad input: one line, exit 2 (imported once a command runs)."""
    from hardware_profiles import ProfileError
    from kernels.device import DeviceError
    from nas.results.export import ExportError
    from nas.results.measure import MeasureError
    from nas.results.pareto import PickError
    from nas.results.report import ReportError
    from nas.results.verify import VerifyError
    from nas.search.faults import FaultError
    from nas.search.storage import StorageError
    from nas.search.study import SearchError
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
        commands = {
            "search": _search,
            "worker": _worker,
            "studies": _studies,
            "report": _report,
            "export": _export,
            "verify": _verify,
            "measure": _measure,
            "profiles": _profiles,
            "spaces": _spaces,
        }
        commands[args.command](args)
    except user_errors as e:
        return _fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
