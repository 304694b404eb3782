"""``nas search``: run (or resume) a search study, with a progress bar or one line per trial, then
print its front (and, with ``--verify N``, verify it)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nas.commands._common import (
    STORAGE_HELP,
    UsageError,
    at_most,
    console,
    count,
    latency_shape,
    objectives,
    per_gpu_count,
    positive_float,
    positive_int,
    seed,
)
from nas.commands._front import print_fidelity, print_front
from nas.commands._lines import TrialLines, costing_text, memory_warning, print_untrained
from nas.commands.verify import verify_after_search

if TYPE_CHECKING:
    import optuna

    from nas.search.config import SearchConfig
    from nas.search.objective import TrialContext
    from nas.search.record import VerifySettings
    from nas.search.workers import Slot


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("search", help="run (or resume) a search study")
    _study_flags(s)
    _objective_flags(s)
    _budget_flags(s)
    _run_flags(s)


def _study_flags(s: argparse.ArgumentParser) -> None:
    from nas.search.setup import MAX_TRIALS, SAMPLERS

    s.add_argument("--space", default="hybrid_small", help="shipped space name or a YAML path (default hybrid_small)")
    s.add_argument("--task", default=None, help="task spec, e.g. mqar:seq_len=64 or data.npz (default: the space's)")
    s.add_argument(
        "--trials",
        type=at_most(MAX_TRIALS, "trials"),
        default=20,
        help=f"trained trials to reach (default 20; at most {MAX_TRIALS:,}); candidates that break a hard budget "
        "are not counted",
    )
    s.add_argument("--timeout", type=positive_float, default=None, help="stop starting trials after this many seconds")
    s.add_argument(
        "--study",
        default=None,
        help="study name (default: <space>-<task>-<target>, then the settings that differ from the defaults, "
        "e.g. -accuracy+decode_latency-ctx8192)",
    )
    s.add_argument("--storage", default=None, help=STORAGE_HELP)
    s.add_argument(
        "--sampler", choices=SAMPLERS, default=None, help="Optuna sampler (default tpe; a resume: the study's)"
    )
    s.add_argument(
        "--target",
        default="auto",
        help="auto (this GPU, else the profile calibrated on these kernels) or a profile name/path",
    )


def _objective_flags(s: argparse.ArgumentParser) -> None:
    from nas.search.setup import MAX_BATCH, MAX_CONTEXT

    s.add_argument(
        "--latency-shape",
        type=latency_shape,
        default="1x256",
        help=f"BATCHxSEQ the latency is scored at (default 1x256; at most {MAX_BATCH}x{MAX_CONTEXT})",
    )
    s.add_argument(
        "--objectives",
        type=objectives,
        default=("accuracy", "latency", "memory"),
        help="accuracy and 1-3 of latency, memory (the forward at --latency-shape), prefill_latency, "
        "decode_latency, cache_memory (generation at --context); fixed when the study is created "
        "(default accuracy,latency,memory)",
    )
    s.add_argument(
        "--context",
        type=at_most(MAX_CONTEXT, "tokens"),
        default=None,
        help="tokens each sequence holds for prefill_latency, decode_latency and cache_memory "
        f"(e.g. 32768; at most {MAX_CONTEXT})",
    )
    s.add_argument(
        "--decode-batch",
        type=at_most(MAX_BATCH, "sequences"),
        default=1,
        help=f"sequences prefilled and decoded together for the generation objectives (default 1; at most {MAX_BATCH})",
    )


def _budget_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--max-latency-ms", type=positive_float, default=None, help="hard latency budget")
    s.add_argument("--max-params", type=positive_int, default=None, help="hard parameter budget")
    s.add_argument(
        "--max-memory-mb", type=positive_float, default=None, help="hard memory budget, in MiB (2**20 bytes)"
    )
    s.add_argument(
        "--trial-timeout",
        type=positive_float,
        default=None,
        help="fail a trial that runs longer than this many seconds",
    )
    s.add_argument(
        "--max-train-seconds",
        type=positive_float,
        default=None,
        help="the wall-clock guard on each training, instead of the space's max_train_seconds (a trial it "
        "stops is recorded truncated, off the front); for a machine slower or busier than the space assumed",
    )
    s.add_argument(
        "--retrain-truncated",
        action="store_true",
        help="a resume queues the study's truncated trials again, to train them in full on top of --trials",
    )


def _run_flags(s: argparse.ArgumentParser) -> None:
    from nas.search.setup import MAX_WORKERS

    s.add_argument(
        "--seed",
        type=seed,
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
        type=count,
        default=None,
        metavar="N",
        help="when the search ends, run nas verify on the study: retrain the front and N random other trials "
        "at 4x their steps and report how well the short-run accuracy ranks them",
    )
    s.add_argument("--gpus", default=None, help="comma-separated GPU indices: one worker process per GPU")
    s.add_argument(
        "--trials-per-gpu",
        type=per_gpu_count,
        default=None,
        help=f"worker processes per GPU, with --gpus (default 1; at most {MAX_WORKERS} processes in all); auto: "
        "as many as free memory (from a short probe of the space's heaviest candidates) and the host's cores "
        "allow, up to about 8 training runs in flight per GPU (a population's runs count each)",
    )
    s.add_argument(
        "--workers",
        type=at_most(MAX_WORKERS, "processes"),
        default=None,
        help=f"CPU worker processes (without --gpus; default 1, at most {MAX_WORKERS}); more than one is "
        "refused where the search would train on a GPU (use --gpus 0 --trials-per-gpu N, or --device cpu)",
    )


def run(args: argparse.Namespace) -> None:
    from optuna.trial import TrialState

    from kernels.device import cuda_available
    from nas.search import record
    from nas.search.auto_workers import AUTO, trials_per_gpu
    from nas.search.loop import n_complete
    from nas.search.start import prepare
    from nas.search.workers import check_cpu_workers, parse_gpus, plan_slots

    verify = _verify_settings(args)
    gpus = parse_gpus(args.gpus) if args.gpus else None
    auto = args.trials_per_gpu == AUTO
    # a flag the other one makes moot is refused (auto is checked as 1 here, chosen once the study is open)
    slots = plan_slots(gpus, 1 if auto else args.trials_per_gpu, args.workers)
    check_cpu_workers(slots, args.device, cuda_available())
    config = _config(args, device="cpu" if len(slots) > 1 and not gpus else args.device)
    ctx, study = prepare(config)
    # a study this run created holds nothing yet but the baselines it queued
    fresh = all(t.state == TrialState.WAITING and record.baseline_of(t) for t in study.get_trials(deepcopy=False))
    if auto:
        console.print("--trials-per-gpu auto: probing the space's heaviest candidates on the GPU", soft_wrap=True)
        variants = ctx.space.seeds * len(ctx.space.lr_multipliers)
        try:
            args.trials_per_gpu, why = trials_per_gpu(study.study_name, config.storage, gpus, variants, _data(ctx))
        except BaseException:  # Ctrl-C during the probe: a study this run created leaves nothing behind
            _remove_if_empty(study, config.storage, fresh)
            raise
        console.print(f"--trials-per-gpu auto: {args.trials_per_gpu} per GPU, bounded by {why}", soft_wrap=True)
        slots = plan_slots(gpus, args.trials_per_gpu, args.workers)
    done = n_complete(study)
    config = _print_start(args, config, ctx, study, done)
    _search_with_progress(args, config, ctx, study, done, slots, gpus, fresh)
    print_untrained(study)
    print_front(study)
    if verify is not None:
        verify_after_search(study, verify, ctx, workers=verify_workers(gpus, args.trials_per_gpu, ctx.device))
    else:
        print_fidelity(study, table=False)  # a resumed study verified before: its numbers so far
    # commands to paste into a shell: a name or path with a space or a quote is quoted
    storage_flag = f" --storage {shlex.quote(config.storage)}" if args.storage else ""
    name = shlex.quote(study.study_name)
    console.print(f"next: nas report --study {name}{storage_flag}", soft_wrap=True)
    console.print(f"      nas export --study {name}{storage_flag} --out export/", soft_wrap=True)


def _verify_settings(args: argparse.Namespace) -> VerifySettings | None:
    """``--verify N``'s settings, checked before the study is opened: a bad N leaves nothing behind."""
    if args.verify is None:
        return None
    from nas.results.verify import check_settings
    from nas.search.record import VerifySettings

    verify = VerifySettings(steps_factor=4.0, random=args.verify)
    check_settings(verify)
    return verify


def _config(args: argparse.Namespace, *, device: str) -> SearchConfig:
    """The search the flags ask for (``device``: cpu for several CPU workers)."""
    from nas.search.config import SearchConfig
    from nas.search.storage import resolve_storage

    return SearchConfig.parse(args, storage=resolve_storage(args.storage), device=device)


def _print_start(
    args: argparse.Namespace, config: SearchConfig, ctx: TrialContext, study: optuna.Study, done: int
) -> SearchConfig:
    """What the search is and costs, before its first trial; returns ``config`` with the trials to
    reach raised by the truncated trials ``--retrain-truncated`` queued again."""
    console.print(
        f"study {study.study_name} in {config.storage}: space {ctx.space.name}, "
        f"task {ctx.task.description or ctx.task.name}, {costing_text(ctx)}, "
        f"device {ctx.device}; {done} trial(s) already trained",
        soft_wrap=True,
    )
    if (warning := memory_warning(ctx)) is not None:
        console.print(warning, markup=False, highlight=False, soft_wrap=True)
    if args.retrain_truncated:
        config = dataclasses.replace(config, trials=ctx.budgets.trials)  # --trials and the re-queued ones
        console.print(
            f"re-queued {len(ctx.retrained)} truncated trial(s) ({', '.join(map(str, ctx.retrained))}) to train in "
            f"full, on top of --trials: {config.trials} trained trials to reach"
            if ctx.retrained
            else "no truncated trial to retrain",
            soft_wrap=True,
        )
    return config


def _search_with_progress(
    args: argparse.Namespace,
    config: SearchConfig,
    ctx: TrialContext,
    study: optuna.Study,
    done: int,
    slots: Sequence[Slot],
    gpus: Sequence[str] | None,
    fresh: bool,
) -> None:
    """Run the search in this process, or in worker processes, under a progress bar (a terminal)
    or one line per finished trial (a log: CI, nohup, a pipe)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from nas.results.pareto import front
    from nas.search.loop import n_complete, run_search

    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("front {task.fields[front]}  best acc {task.fields[best]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # a terminal gets a live bar; a log (CI, nohup, a pipe) one line per finished trial
    lines = TrialLines(study, config.trials, show_all=not console.is_terminal)
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
            _run_workers(args, config, ctx, study, slots, fresh, on_trial)


def _run_workers(
    args: argparse.Namespace,
    config: SearchConfig,
    ctx: TrialContext,
    study: optuna.Study,
    slots: Sequence[Slot],
    fresh: bool,
    on_trial: Callable[[optuna.Study], None],
) -> None:
    """The search in one worker process per slot; UsageError when one of them failed (a study this
    run created, in which no trial started, is removed)."""
    from nas.search.workers import run_workers

    try:
        codes = run_workers(
            study,
            config.storage,
            config.trials,
            slots,
            timeout=config.timeout,
            on_poll=on_trial,
            verbose=args.verbose,
            data=_data(ctx),
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


def _data(ctx: TrialContext) -> str | None:
    """The data file this run found the study's bytes at (it may have moved since the study recorded
    its path), for the processes it starts."""
    return ctx.task.config.get("path") if "sha256" in ctx.task.config else None


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


def verify_workers(gpus: list[str] | None, per_gpu: int | None, device) -> int:  # noqa: ANN001 — a torch.device
    """How many long runs ``--verify`` trains at once: on a GPU, as many as the search ran trials
    per GPU (all on the parent's device, which one small model leaves mostly idle); on the CPU one,
    whatever ``--workers`` was (processes there share the same cores)."""
    from kernels.device import is_cuda

    return (per_gpu or 1) if gpus and is_cuda(device) else 1
