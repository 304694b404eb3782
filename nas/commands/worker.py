"""``nas worker``: join a study started by ``nas search``, from any shell or host."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nas.commands._common import STORAGE_HELP, console, count, data_flag, positive_float, positive_int
from nas.commands._lines import trial_line

if TYPE_CHECKING:
    import optuna

    from hardware_profiles import HardwareProfile


def add_parser(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="join a study started by nas search (from any shell or host)")
    w.add_argument("--study", required=True, help="name of the study to join")
    w.add_argument("--storage", default=None, help=STORAGE_HELP)
    w.add_argument("--trials", type=positive_int, default=None, help="trained trials to reach (default: the study's)")
    w.add_argument("--timeout", type=positive_float, default=None, help="stop starting trials after this many seconds")
    w.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    w.add_argument(
        "--worker-index", type=count, default=None, help="label of this worker's progress lines (default: pid)"
    )
    data_flag(w, "the study's data file, where this host has it when not at the recorded path")


def run(args: argparse.Namespace) -> None:
    from nas.search.loop import n_complete, run_search
    from nas.search.record import record, study_objectives, study_profile
    from nas.search.storage import resolve_storage
    from nas.search.studies import worker_config

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
            line = trial_line(r, n_complete(study), config.trials, study_objectives(study), profile)
            console.print(label + line, markup=False, highlight=False, soft_wrap=True)

    study = run_search(config, on_trial=on_trial)
    console.print(f"{label}study {args.study} has {n_complete(study)} trained trials", soft_wrap=True)
