"""``nas verify``'s long runs spread over several worker processes sharing one GPU.

    PYTHONPATH=$PWD python benchmarks/verify_parallel.py --study NAME --storage PATH [--random 5] [--workers 4]

``nas verify`` retrains its plan one trial at a time; on a GPU that one small model leaves mostly
idle, that is most of a lease. This runs the same plan (``nas.results.verify.plan`` with the
study's seed), the same recipes (``long_recipe``), seeds (``training_seeds``) and training
(``retrain``, no time guard, so the accuracies do not depend on the sharing) in ``--workers``
processes, and stores each row through ``write_verified`` from this process alone (the rows live
in one study attribute, so writers must not race). A ``nas verify`` with the same settings
afterwards finds every row stored, retrains nothing, and prints the fidelity (Spearman, Kendall,
the parameter-count baseline). Rows already stored the same way are not trained again.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _settings(study, steps_factor: float, seeds: int, random: int, seed: int | None):
    from nas.search.record import VerifySettings, study_setup

    setup = study_setup(study)
    if seed is None:
        seed = setup.seed if setup is not None else 0
    return VerifySettings(steps_factor=steps_factor, seeds=seeds, random=random, seed=seed)


def _load(storage: str, name: str):
    import optuna

    from nas.search.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


def _work(job: tuple[str, str, float, int, int, int | None, str, int]):
    """Retrain the plan's ``index``-th trial (a fresh process: the study is read from storage)."""
    storage, name, steps_factor, seeds, random, seed, device, index = job
    from nas.results.export import study_task
    from nas.results.verify import long_recipe, plan, retrain, training_seeds
    from nas.search.study import resolve_device

    study = _load(storage, name)
    settings = _settings(study, steps_factor, seeds, random, seed)
    planned = plan(study, settings)[index]
    spec = long_recipe(planned.record, settings.steps_factor)
    start = time.perf_counter()
    row = retrain(
        planned.record,
        study_task(study),
        spec,
        training_seeds(planned.record, settings.seeds),
        resolve_device(device),
    )
    return index, planned.why, row, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--random", type=int, default=5)
    parser.add_argument("--steps-factor", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    from nas.results.verify import check_settings, long_recipe, plan, training_seeds
    from nas.search.record import verified, verify_settings, write_verified

    study = _load(args.storage, args.study)
    settings = _settings(study, args.steps_factor, args.seeds, args.random, args.seed)
    check_settings(settings)
    chosen = plan(study, settings)
    earlier = verify_settings(study)
    stored = verified(study) if earlier is not None and earlier.same_reference(settings) else {}
    write_verified(study, {}, settings)  # as run_verify: this run's settings, rows of another reference go
    todo = []
    for i, p in enumerate(chosen):
        row = stored.get(p.record.number)
        spec = long_recipe(p.record, settings.steps_factor)
        if row is None or row.seeds != training_seeds(p.record, settings.seeds) or row.steps != spec.steps:
            todo.append(i)
    print(
        f"plan: {len(chosen)} trial(s) ({sum(p.why == 'front' for p in chosen)} front), {len(todo)} to retrain "
        f"at {settings.steps_factor:g}x steps in {args.workers} process(es)",
        flush=True,
    )
    jobs = [
        (args.storage, args.study, args.steps_factor, args.seeds, args.random, args.seed, args.device, i) for i in todo
    ]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for index, why, row, seconds in pool.imap_unordered(_work, jobs):
            write_verified(study, {row.trial: row}, settings)
            r = chosen[index].record
            outcome = row.failure or f"acc {r.accuracy:.3f} -> {row.accuracy:.3f}"
            print(
                f"trial {r.number} ({why}) {r.arch_summary}, {row.steps} steps: {outcome} ({seconds:.1f} s, "
                f"{time.perf_counter() - start:.0f} s in)",
                flush=True,
            )
    print(f"done: {len(todo)} long run(s) in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
