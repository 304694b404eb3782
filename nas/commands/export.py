"""``nas export``: one architecture of a study as a bundle (arch.json, safetensors, ONNX, model card)."""

from __future__ import annotations

import argparse
import json

from nas.commands._common import (
    EPSILON_HELP,
    PICK_HELP,
    STORAGE_HELP,
    UsageError,
    console,
    data_flag,
    epsilon,
    open_existing,
    positive_float,
    positive_int,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    from nas.search.setup import DEFAULT_PICK, PICKS

    e = sub.add_parser("export", help="export one architecture: arch.json, safetensors, ONNX, model card")
    e.add_argument("--study", required=True, help="name of the study to export from")
    e.add_argument("--storage", default=None, help=STORAGE_HELP)
    which = e.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, default=None, help="export this trial number")
    which.add_argument("--pick", choices=PICKS, default=DEFAULT_PICK, help=PICK_HELP)
    e.add_argument(
        "--max-latency-ms",
        type=positive_float,
        default=None,
        help="pick only among front trials at or below this latency",
    )
    e.add_argument(
        "--max-memory-mb",
        type=positive_float,
        default=None,
        help="pick only among front trials at or below this memory, in MiB (2**20 bytes)",
    )
    e.add_argument("--accuracy-epsilon", type=epsilon, default=None, help=EPSILON_HELP)
    e.add_argument("--out", required=True, help="bundle directory (must be absent or empty, or see --force)")
    e.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export bundle at --out (a directory holding only arch.json, model.safetensors, "
        "model.onnx, card.md and a large model's model.onnx.data); any other non-empty --out is refused",
    )
    e.add_argument(
        "--retrain-steps", type=positive_int, default=None, help="retrain this many steps before writing (<= 1000000)"
    )
    e.add_argument("--device", default="auto", help="device for --retrain-steps")
    data_flag(e, "with --retrain-steps: the study's data file, where it is now if it moved")


def run(args: argparse.Namespace) -> None:
    from nas.results.export import export
    from nas.results.pareto import DEFAULT_PICK, accuracy_epsilon, more_accurate_within_epsilon, pick, pick_epsilon
    from nas.search.record import study_objectives
    from nas.search.start import resolve_device

    if args.data is not None and args.retrain_steps is None:
        raise UsageError("--data names the data to retrain on: it needs --retrain-steps")
    study, storage = open_existing(args)
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
            eps = pick_epsilon(other, resolution, spread=args.accuracy_epsilon is None)
            if args.accuracy_epsilon is not None:
                why = f"--accuracy-epsilon {args.accuracy_epsilon:g}"
            else:
                why = "the study's resolution" if eps == resolution else "the spread over seeds"
            console.print(
                f"note: trial {other.number} is more accurate ({other.accuracy_text()}) by no more than {why} "
                f"(ε = {eps:.3g}), so it counts as level and costs more; --accuracy-epsilon 0 picks it",
                soft_wrap=True,
            )
    console.print(f"load it with: import nas; model = nas.load({str(out)!r})", soft_wrap=True)
