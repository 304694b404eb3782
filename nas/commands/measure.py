"""``nas measure``: time on this GPU the latencies a study predicted for it, beside the predictions."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nas.commands._common import STORAGE_HELP, console, open_existing
from nas.commands._front import predicted_text, print_front

if TYPE_CHECKING:
    from nas.search.record import TrialRecord


def add_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("measure", help="time on this GPU the latencies a study predicted for it, beside them")
    m.add_argument("--study", required=True, help="name of the study to measure")
    m.add_argument("--storage", default=None, help=STORAGE_HELP)
    m.add_argument("--front", action="store_true", help="only the front's trials (default: every trained trial)")
    m.add_argument("--again", action="store_true", help="measure trials measured on this GPU before again")
    m.add_argument("--device", default="cuda", help="the CUDA GPU to time on: cuda or cuda:N (default cuda)")


def run(args: argparse.Namespace) -> None:
    import optuna

    from nas.results.measure import check_gpu, local_gpu, misses, plan, run_measure, searched_setup
    from nas.search.record import study_objectives
    from nas.search.storage import open_storage

    study, storage = open_existing(args)  # read only until every check has passed
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
    print_front(writable)


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
                parts.append(f"{name} {found.median_ms:.4g} ms ({predicted_text(predicted)})")
        outcome = ", ".join(parts)
    console.print(
        f"measure {i}/{n}: trial {r.number} {r.arch_summary}: {outcome}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
