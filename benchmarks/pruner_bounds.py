"""How optimistic must early stopping be? Pruning rules replayed on full-information runs.

    PYTHONPATH=$PWD python benchmarks/pruner_bounds.py --collect [--seeds 0 … 9] [--samplers random tpe]
    PYTHONPATH=$PWD python benchmarks/pruner_bounds.py                  # replay the saved rows

``--collect`` runs ``benchmarks/search_quality.py``'s MQAR space and task (40 trained trials per
run, CPU, one torch thread) with early stopping *recording* its rungs but never stopping a trial
(``CostAwarePruner.reason`` answers None), so every trial has its rung accuracies (1/8, 1/4, 1/2
of its steps) and its final accuracy, latency, memory and training seconds. Rows go to
``results/pruner_bounds_rows.json``.

The replay walks each run in trial order as the engine would: a sampled trial is stopped at the
first rung where ``margin`` + its best case (``1 - (1 - acc) · f^p`` at fraction ``f`` of its
steps, for ``p`` in 1/2, 1, 2, 3) is at most the accuracy of an earlier, completed (not
stopped), feasible, not truncated trial at no more latency and memory; baselines are never
stopped. For each rule: the share of all training seconds saved (a trial stopped at ``f`` saves
``1 - f`` of its seconds), trials stopped, and the runs in which the run's most accurate sampled
trial would have been stopped (what early stopping must never do). Two oracles bound any rule
that only stops trials which end dominated: stopping at 1/8 every trial that ends dominated by an
earlier trial, or by any trial of the run. Replaying is exact for random sampling (trial ``n`` is
drawn from (seed, n) alone) and approximate for TPE (a stopped trial would change later draws).
Writes ``results/pruner_bounds.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
POWERS = {"sqrt": 0.5, "linear": 1.0, "square": 2.0, "cube": 3.0}
MARGINS = (0.0, 0.02, 0.05)


def collect(seeds: list[int], samplers: list[str], trials: int) -> list[dict]:
    import optuna
    import torch
    from search_quality import SPACE, TASK

    from nas.search import record
    from nas.search.pruning import CostAwarePruner
    from nas.search.study import SearchConfig, run_search

    CostAwarePruner.reason = lambda self, study, trial: None  # record every rung, stop nothing
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE.format(task=TASK))
        for seed in seeds:
            for sampler in samplers:
                journal = str(Path(tmp) / f"{sampler}-{seed}.journal")
                study = run_search(
                    SearchConfig(
                        space=str(space), trials=trials, storage=journal, study="s", sampler=sampler, seed=seed,
                        prune=True, device="cpu",
                    )
                )  # fmt: skip
                for r in record.records(study):
                    if r.trained:
                        rows.append(
                            {
                                "seed": seed,
                                "sampler": sampler,
                                "number": r.number,
                                "accuracy": r.accuracy,
                                "latency_ms": r.latency_ms,
                                "memory_mb": r.memory_mb,
                                "rungs": [list(x) for x in r.rungs],
                                "steps": r.planned_steps,
                                "train_seconds": r.train_seconds,
                                "baseline": r.baseline,
                                "eligible": r.feasible and not r.truncated,
                            }
                        )
                print(f"seed {seed} {sampler}: {len(rows)} trained trials so far", flush=True)
    return rows


def _runs(rows: list[dict]) -> dict[tuple[int, str], list[dict]]:
    runs: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        runs.setdefault((r["seed"], r["sampler"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["number"]) for k, v in sorted(runs.items())}


def _dominates(o: dict, t: dict) -> bool:
    no_worse = (
        o["accuracy"] >= t["accuracy"] and o["latency_ms"] <= t["latency_ms"] and o["memory_mb"] <= t["memory_mb"]
    )
    better = o["accuracy"] > t["accuracy"] or o["latency_ms"] < t["latency_ms"] or o["memory_mb"] < t["memory_mb"]
    return no_worse and better


def replay(runs: dict[tuple[int, str], list[dict]], power: float, margin: float) -> dict:
    """The rule ``best case = 1 - (1 - acc) · f^power``, stop when a rival beats it by ``margin``."""
    total = saved = 0.0
    stopped, best_stopped = 0, []
    for (seed, sampler), trials in runs.items():
        sampled = [t for t in trials if not t["baseline"] and t["eligible"]]
        best = max(sampled, key=lambda t: (t["accuracy"], -t["number"])) if sampled else None
        finished: list[dict] = []
        for t in trials:
            total += t["train_seconds"]
            stop = None
            rivals = [o for o in finished if o["latency_ms"] <= t["latency_ms"] and o["memory_mb"] <= t["memory_mb"]]
            if not t["baseline"] and rivals:
                top = max(o["accuracy"] for o in rivals)
                for step, acc in t["rungs"]:
                    f = step / t["steps"]
                    if top >= 1 - (1 - acc) * f**power + margin:
                        stop = f
                        break
            if stop is None:
                if t["eligible"]:
                    finished.append(t)
                continue
            stopped += 1
            saved += t["train_seconds"] * (1 - stop)
            if t is best:
                best_stopped.append(f"{sampler} seed {seed}")
    return {"saved": saved / total, "stopped": stopped, "best_stopped_in": best_stopped}


def oracles(runs: dict[tuple[int, str], list[dict]]) -> dict:
    total = earlier = anywhere = 0.0
    for trials in runs.values():
        for t in trials:
            total += t["train_seconds"]
            if t["baseline"]:
                continue
            if any(_dominates(o, t) for o in trials if o["number"] < t["number"]):
                earlier += t["train_seconds"] * 7 / 8
            if any(_dominates(o, t) for o in trials if o is not t):
                anywhere += t["train_seconds"] * 7 / 8
    return {"dominated_by_an_earlier_trial": earlier / total, "dominated_by_any_trial": anywhere / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", action="store_true", help="run the full-information studies first (CPU)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--samplers", nargs="+", default=["random", "tpe"])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rows", default=str(RESULTS / "pruner_bounds_rows.json"))
    args = parser.parse_args()
    import optuna
    import torch

    rows_path = Path(args.rows)
    if args.collect:
        rows_path.write_text(json.dumps(collect(args.seeds, args.samplers, args.trials)) + "\n")
    rows = json.loads(rows_path.read_text())
    runs = _runs(rows)
    rules = []
    print(f"{len(rows)} trained trials in {len(runs)} runs ({rows_path.name})")
    print(f"{'bound':8s} {'margin':>6s} {'saved':>7s} {'stopped':>8s}  best trial stopped in")
    for name, power in POWERS.items():
        for margin in MARGINS:
            r = {"bound": name, "power": power, "margin": margin, **replay(runs, power, margin)}
            rules.append(r)
            print(
                f"{name:8s} {margin:6.2f} {r['saved']:7.1%} {r['stopped']:4d}/{len(rows):<4d} "
                f" {len(r['best_stopped_in'])} runs {r['best_stopped_in']}"
            )
    bound = oracles(runs)
    print(
        "oracle (stop at 1/8 every trial that ends dominated): by an earlier trial "
        f"{bound['dominated_by_an_earlier_trial']:.1%}, by any trial of its run "
        f"{bound['dominated_by_any_trial']:.1%} of the training seconds"
    )
    out = RESULTS / "pruner_bounds.json"
    out.write_text(
        json.dumps(
            {
                "date": dt.date.today().isoformat(),
                "torch": torch.__version__,
                "optuna": optuna.__version__,
                "cpu": f"{platform.machine()}, {os.cpu_count()} cores, 1 torch thread",
                "rows": rows_path.name,
                "trials": len(rows),
                "runs": len(runs),
                "rules": rules,
                "oracles": bound,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
