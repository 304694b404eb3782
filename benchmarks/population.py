"""Training a candidate as a population (seeds × learning rates): is its accuracy interval honest,
and what does the batching cost?

    python benchmarks/population.py interval [--space hybrid_small] [--pairs 100] [--calibrate 40] [--jobs 2]
    python benchmarks/population.py cost [--space hybrid_small] [--archs 6] [--device cuda] [--no-separately]
    python benchmarks/population.py chance [--space hybrid_long] [--archs 30] [--device cuda] [--jobs 4]

``interval``: draws ``--pairs`` (architecture, recipe) configurations from the space with a
random sampler and trains each twice as the search does (``nas.train.train_population``, the
space's population): once with the training seeds of study seed 0, once with those of study seed
1 (fresh seeds). A pair is covered when the second accuracy falls inside the first one's interval
(``accuracy ± interval``, ``nas.train.accuracy_interval``: a 90 % t prediction interval from the
seeds' pooled spread). The first ``--calibrate`` pairs show which scale on that interval would
reach 90 % coverage; the rest are held out: their coverage at the shipped interval (scale 1) is
the check. A pair whose training diverges (every learning rate) is listed
and left out. Writes part ``interval_<device>`` of ``benchmarks/results/population.json``.

``cost``: for ``--archs`` configurations of the space, the seconds of one single run (1 × 1),
of the population as one batched program, and of its S·L variants trained one after another,
each timed after a warm-up training. Writes part ``cost_<device>`` of ``benchmarks/results/population.json``.

``chance``: trains the same ``--archs`` sampled configurations once as a single run (1 × 1, the
sampled lr and one seed: what the search did before populations) and once as the space's
population, in ``--jobs`` processes sharing the device, and reports the share of each that ended
below ``--chance`` accuracy (did not learn). Writes part ``chance_<device>`` of ``benchmarks/results/population.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._timing import RESULTS, device_slug  # noqa: E402

TARGET = 0.90  # the share of fresh-seed retrainings the interval must hold


def _configs(space_name: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct sampled configurations (params), from a seeded random sampler."""
    import optuna

    from nas.space import load_space
    from nas.tasks import load_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(space_name)
    task = load_task(space.task, seed=0)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    seen, out = set(), []
    while len(out) < n:
        trial = study.ask()
        space.sample(trial, task)
        key = json.dumps(trial.params, sort_keys=True)
        study.tell(trial, 0.0)
        if key not in seen:
            seen.add(key)
            out.append(trial.params)
    return out


def _candidate(space_name: str, params: dict[str, Any], study_seed: int):
    import optuna

    from nas.space import load_space
    from nas.tasks import load_task

    space = load_space(space_name)
    task = load_task(space.task, seed=0)
    rows = task.x_train.shape[0]
    cand = space.sample(optuna.trial.FixedTrial(params), task, study_seed)
    train = dataclasses.replace(cand.train, batch_size=min(cand.train.batch_size, rows))  # as the search clips it
    return space, task, dataclasses.replace(cand, train=train)


def _unfloored(accuracies: list[list[float | None]]) -> float | None:
    """The interval's half-width before the resolution floor (``accuracy_interval`` at 0)."""
    from nas.train import accuracy_interval

    return accuracy_interval([row for row in accuracies if None not in row], 0.0)


def _interval_pair(job: tuple[str, int, dict[str, Any], str]) -> dict[str, Any]:
    import torch

    from nas.train import TrainingDiverged, train_population

    space_name, index, params, device = job
    torch.set_num_threads(1)
    row: dict[str, Any] = {"index": index, "params": params}
    for name, study_seed in (("first", 0), ("fresh", 1)):
        _, task, cand = _candidate(space_name, params, study_seed)
        row["arch"], row["recipe"] = cand.arch.summary(), cand.train.summary()
        row["resolution"] = 1 / task.scored_targets
        start = time.perf_counter()
        try:
            r = train_population(cand.arch, task, cand.train, device=device)
        except TrainingDiverged as e:
            row[name] = {"diverged": str(e)}
            continue
        row[name] = {
            "seed": cand.train.seed,
            "accuracy": r.accuracy,
            "interval": r.interval,
            "half_width": _unfloored([list(a) for a in r.accuracies]),
            "accuracies": [list(a) for a in r.accuracies],
            "best_lr": cand.train.lr * r.best_multiplier,
            "seconds": round(time.perf_counter() - start, 3),
        }
    return row


def _coverage(rows: list[dict[str, Any]], factor: float) -> tuple[float, int]:
    inside = [
        abs(r["fresh"]["accuracy"] - r["first"]["accuracy"]) <= max(r["resolution"], factor * r["first"]["half_width"])
        for r in rows
    ]
    return sum(inside) / max(1, len(inside)), len(inside)


def interval(args: argparse.Namespace) -> dict[str, Any]:
    configs = _configs(args.space, args.pairs)
    jobs = [(args.space, i, p, args.device) for i, p in enumerate(configs)]
    rows: list[dict[str, Any]] = []
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
        for row in pool.map(_interval_pair, jobs):
            rows.append(row)
            first, fresh = row.get("first", {}), row.get("fresh", {})
            print(
                f"{row['index']:3d} {row['arch']:28s} {row['recipe']:18s} "
                f"{first.get('accuracy', float('nan')):.3f} ±{first.get('interval') or 0:.3f} -> "
                f"{fresh.get('accuracy', float('nan')):.3f}",
                flush=True,
            )
    usable = [r for r in rows if "accuracy" in r.get("first", {}) and "accuracy" in r.get("fresh", {})]
    usable = [r for r in usable if r["first"]["half_width"] is not None]
    calibration = [r for r in usable if r["index"] < args.calibrate]
    held_out = [r for r in usable if r["index"] >= args.calibrate]
    grid = [round(0.25 * i, 2) for i in range(1, 17)]  # scales 0.25 .. 4 on the shipped interval
    needed = next((k for k in grid if _coverage(calibration, k)[0] >= TARGET), None)
    share, n = _coverage(held_out, 1.0)
    summary = {
        "target_coverage": TARGET,
        "calibration_pairs": len(calibration),
        "scale_reaching_target_on_calibration": needed,
        "calibration_coverage_at_shipped_interval": _coverage(calibration, 1.0)[0],
        "held_out_pairs": n,
        "held_out_coverage_at_shipped_interval": share,
        "held_out_coverage_by_scale": {str(k): _coverage(held_out, k)[0] for k in grid},
        "median_interval_held_out": statistics.median(r["first"]["interval"] for r in held_out) if held_out else None,
        "left_out": [r["index"] for r in rows if r not in usable],
    }
    print(json.dumps(summary, indent=1))
    return {"question": "interval", "summary": summary, "pairs": rows}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cost(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from nas.models import build
    from nas.train import train, train_population

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    rows = []
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for params in _configs(args.space, args.archs, seed=1):
        _, task, cand = _candidate(args.space, params, 0)
        spec = cand.train
        single = dataclasses.replace(spec, seeds=1, lr_multipliers=(1.0,))

        def one(spec=single, task=task, arch=cand.arch):
            train(build(arch, task, seed=spec.seed), task, spec, device=args.device)
            sync()

        def population(spec=spec, task=task, arch=cand.arch):
            train_population(arch, task, spec, device=args.device)
            sync()

        def separately(spec=spec, task=task, arch=cand.arch):
            for seed in spec.variant_seeds():
                for lr in spec.lrs():
                    train(
                        build(arch, task, seed=seed),
                        task,
                        dataclasses.replace(spec, seed=seed, lr=lr),
                        device=args.device,
                    )
            sync()

        one()  # warm-up: the first training of a process pays for lazy imports and first calls
        row = {
            "arch": cand.arch.summary(),
            "recipe": spec.summary(),
            "steps": spec.steps,
            "population": f"{spec.seeds}x{len(spec.lr_multipliers)}",
            "single_s": _timed(one),
            "population_s": _timed(population),
        }
        row["population_over_single"] = row["population_s"] / row["single_s"]
        if not args.no_separately:
            row["separately_s"] = _timed(separately)
            row["population_over_separately"] = row["population_s"] / row["separately_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = ("population_over_single",) + (() if args.no_separately else ("population_over_separately",))
    summary = {key: statistics.median(r[key] for r in rows) for key in keys}
    print(json.dumps(summary, indent=1))
    return {"question": "cost", "summary": summary, "rows": rows}


def _chance_one(job: tuple[str, int, dict[str, Any], str, bool]) -> dict[str, Any]:
    import torch

    from nas.train import TrainingDiverged, train_population

    space_name, index, params, device, population = job
    torch.set_num_threads(1)
    _, task, cand = _candidate(space_name, params, 0)
    spec = cand.train if population else dataclasses.replace(cand.train, seeds=1, lr_multipliers=(1.0,))
    row = {"index": index, "population": population, "arch": cand.arch.summary(), "recipe": spec.summary()}
    start = time.perf_counter()
    try:
        r = train_population(cand.arch, task, spec, device=device)
        row |= {"accuracy": r.accuracy, "interval": r.interval, "accuracies": [list(a) for a in r.accuracies]}
    except TrainingDiverged as e:
        row |= {"accuracy": None, "diverged": str(e)}
    row["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(row), flush=True)
    return row


def chance(args: argparse.Namespace) -> dict[str, Any]:
    configs = list(enumerate(_configs(args.space, args.archs, seed=2)))[args.first :]
    arms = {"1x1": False, "population": True}
    jobs = [(args.space, i, p, args.device, pop) for i, p in configs for pop in arms.values()]  # pairs together
    rows: list[dict[str, Any]] = []
    spawn = multiprocessing.get_context("spawn")  # CUDA in the workers: no fork of an initialised parent
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool:
        for row in pool.map(_chance_one, jobs):
            rows.append(row)
            if args.partial:  # a run cut short keeps what it finished
                args.partial.write_text(json.dumps(rows) + "\n")
    summary = {}
    paired = {r["index"] for r in rows if r["population"]} & {r["index"] for r in rows if not r["population"]}
    for name, pop in arms.items():
        got = [r for r in rows if r["population"] == pop and r["index"] in paired]
        done = [r for r in got if r["accuracy"] is not None]
        summary[name] = {
            "configurations": len(got),
            "diverged": len(got) - len(done),
            "below_threshold": sum(r["accuracy"] < args.chance for r in done),
            "share_below": sum(r["accuracy"] < args.chance for r in done) / max(1, len(done)),
            "median_accuracy": statistics.median(r["accuracy"] for r in done) if done else None,
            "median_seconds": statistics.median(r["seconds"] for r in got) if got else None,
        }
    summary["chance_threshold"] = args.chance
    print(json.dumps(summary, indent=1))
    return {"question": "chance", "summary": summary, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question", choices=["interval", "cost", "chance"])
    parser.add_argument("--chance", type=float, default=0.15, help="accuracy below which a run did not learn")
    parser.add_argument("--first", type=int, default=0, help="chance: start at this configuration (split runs)")
    parser.add_argument("--partial", type=Path, help="chance: rewrite this file with the rows after each one")
    parser.add_argument("--no-separately", action="store_true", help="cost: skip the S·L runs one after another")
    parser.add_argument("--space", default="hybrid_small")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--calibrate", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--archs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    result = {"interval": interval, "cost": cost, "chance": chance}[args.question](args)
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    result |= {
        "date": dt.date.today().isoformat(),
        "torch": torch.__version__,
        "device": device,
        "space": args.space,
        "cpus": os.cpu_count(),
        "argv": sys.argv[1:],
    }
    tag = device_slug(device) if args.device == "cuda" else "cpu"
    out = args.out or RESULTS / "population.json"
    parts = json.loads(out.read_text()) if out.exists() else {}  # the other questions' parts are kept
    parts[f"{args.question}_{tag}"] = result
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(parts, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote part {args.question}_{tag} of {out}")


if __name__ == "__main__":
    main()
