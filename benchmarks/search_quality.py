"""Which sampler finds a better front, per trial and per second of wall-clock, with and without early stopping?

    python -m benchmarks search_quality [--seeds 0 … 9] [--samplers tpe nsga2 gp random] [--trials 80] [--jobs 2]
    python -m benchmarks search_quality --quick        # smoke run: 2 seeds, tpe and random, 12 trials
    python -m benchmarks search_quality --device cuda --samplers tpe random --prune off --jobs 4

Runs ``nas search``'s engine (CPU, one torch thread, latency predicted for the h200 profile) on a
small MQAR task (``--device cuda``: on GPU 0 with each candidate's latency measured there, on
``hybrid_small`` unless ``--space`` names another) for every (seed, sampler, early stopping
off/on): each run is one study of ``--trials`` trained trials in its own journal file, with the
engine's defaults otherwise (its baseline trials included: the same three reference architectures
open every study and count toward ``--trials``; ``--no-baselines`` leaves them out). Every trial is
saved (state, objectives, configuration, completion time since the run started, duration, training
seconds, baseline label, why it was stopped), so each number below can be recomputed from the JSON.
A run that raises is recorded with its error and its trials so far, and left out of every score
(listed at the end) instead of ending the benchmark.

Order: seed-major; within a seed the 2 × samplers arms (samplers alternating with early stopping
off/on) start at arm ``k mod 2S`` for the k-th seed, so every arm takes every position and a
drift of the machine's load spreads over the arms. ``--jobs N`` runs N studies at once in
separate processes (all arms under the same load, but slower trials than alone). Each process
first trains a throwaway trial, so no run pays for the process's lazy imports.

Scores:

- Hypervolume of the feasible front (objectives as losses: −accuracy, latency, memory) over the
  trials that count for the engine's front: complete, trained, feasible, not truncated. ONE
  reference point for all runs: the engine's rule (``nas.results.pareto.reference_point``:
  accuracy 0, 1.1 × the worst latency and memory) applied to those trials of every run.
- Budgets: at equal trials (after the ``--trials``-th trained trial; early-stopped trials do not
  count toward ``--trials`` in this engine, so a run with early stopping evaluates more
  candidates), and at equal wall-clock: 25, 50 and 100 % of the shortest run's duration, with the
  trials completed by then. The shortest run bounds the budgets so that every run was observed
  for the whole budget (a run that had stopped would be scored on a front it could still have
  improved).
- Per arm: median and IQR over seeds, ratio of its median to random's (no early stopping), and
  the one-sided Mann–Whitney U p-value of "arm > random without early stopping". Throughput:
  trained trials per hour of the run's wall-clock (and candidates per hour, early-stopped ones
  included); the run's summed trial durations and training seconds.
- Early-stopping savings, per sampler and seed, the run with early stopping against the one
  without: the summed durations (and training seconds) of all trials up to the N-th candidate,
  where a candidate is a trial that went to training (trained, truncated, early-stopped or
  failed; not duplicates or over-budget ones) and N is the smaller candidate count of the two
  runs. Both runs then consider the same number of candidates; with the same sampler and seed
  they propose the same ones until the first stop (``shared`` counts those), and with random
  sampling all of them (trial ``n`` is drawn from (seed, n) alone).
- Best configuration kept: the most accurate sampled (not baseline: those are never stopped)
  front-eligible trial of the run without early stopping (ties: the earliest); its configuration
  (the trial's parameters) is looked up in the run with early stopping at the same seed:
  ``pruned`` if a trial with it was stopped early (the failure the acceptance rules out), ``kept``
  if one trained, ``not proposed`` if the sampler never drew it there (always proposed under
  random sampling: that run reaches every trial number of the other one).

- Proxy fidelity (``--verify N``, default 5): after each run of the default arm, ``nas verify``
  retrains its front and N random trials at 4× their steps (not counted in the run's wall-clock);
  per seed the Spearman and Kendall correlation of the search's accuracy with the long runs', and
  of the parameter count's, and their medians (``summary.fidelity``).

Prints the tables and writes ``search_quality_cpu.json`` (``search_quality_<gpu>.json`` with
``--device cuda``; ``_quick`` before ``.json`` with --quick).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import functools
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna._hypervolume import compute_hypervolume  # Optuna's own WFG implementation (no public one)
from optuna.trial import TrialState
from scipy.stats import mannwhitneyu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._timing import device_slug  # noqa: E402
from nas.results.pareto import reference_point as front_reference  # noqa: E402
from nas.search.record import OBJECTIVES, TrialRecord  # noqa: E402
from nas.search.setup import SAMPLERS  # noqa: E402

DEFAULT_ARM = ("tpe", False)  # what nas search runs with no flags: the TPE sampler, no early stopping
BASELINE = ("random", False)  # the arm every other one is tested against: random sampling, no early stopping
WALL_FRACTIONS = (0.25, 0.5, 1.0)  # wall-clock budgets, as fractions of the shortest run
# smaller trial budgets scored too (``trials N``), where a run reached them: 20 is the default
# study's --trials, so the table shows what the sampler gives a user who runs the default
CURVE_TRIALS = (20, 40)
VERIFY_FACTOR = 4.0  # the long runs of the proxy-fidelity check: nas verify's default
DEFAULT_TRIALS = 80  # per run: the default study's 20 is too few for a model-based sampler to pay (see CURVE_TRIALS)
FRONT = ("complete",)  # trial states on the engine's front: trained, feasible, not truncated
COUNTED = ("complete", "truncated")  # trained trials: what --trials counts
CANDIDATES = ("complete", "truncated", "pruned", "failed")  # trials that went to training

# Small MQAR: half the trials stay near chance and a few reach ~0.99, so the front spans the
# accuracy range and early stopping has dominating trials to stop against; a trial trains in about
# a second on one core. max_train_seconds is only a guard against a runaway candidate, wide enough
# that a loaded machine truncates none (a truncated trial is off the front and changes what the
# sampler proposes next, so the scores would depend on the load): budgets are in steps.
TASK = "mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=2048,n_test=256"
SPACE = """\
name: search_quality
description: benchmark space (2 blocks max, short training)
task: {task}
max_train_seconds: 60
depth: {{low: 1, high: 2}}
d_model: [16, 32, 64]
layer:
  mixer: [attention, linear_attention, none]
  heads: [1, 2]
  feature_map: [identity, elu+1, relu]
  short_conv: [0, 4]
  mlp_ratio: [0, 2]
train:
  optimizer: [adamw, lion, sgd]
  lr: {{low: 1.0e-3, high: 2.0e-2, log: true}}
  steps: [60, 120]
  batch_size: [32]
  seeds: 2
  lr_multipliers: [1.0]
"""


# ---------------------------------------------------------------- running (trains)


def arm_name(sampler: str, prune: bool) -> str:
    return f"{sampler}+prune" if prune else sampler


def schedule(
    seeds: Sequence[int], samplers: Sequence[str], prunes: Sequence[bool] = (False, True)
) -> list[tuple[int, str, bool]]:
    """(seed, sampler, prune) of every run in the order they start (see the module docstring)."""
    arms = [(s, p) for s in samplers for p in prunes]
    return [(seed, *arms[(k + i) % len(arms)]) for k, seed in enumerate(seeds) for i in range(len(arms))]


def trial_state(r: TrialRecord) -> str:
    """The benchmark's name for a trial's outcome (``nas.search.record`` lists the engine's states)."""
    if r.state == TrialState.COMPLETE:
        if r.skipped_training is not None or (not r.feasible and not r.truncated):
            return "infeasible"
        return "truncated" if r.truncated else "complete"
    if r.state == TrialState.PRUNED:
        if r.pruned_at is not None:
            return "pruned"
        return "duplicate" if r.duplicate_of is not None else "surplus"
    return "failed" if r.state == TrialState.FAIL else r.state.name.lower()


@functools.cache
def warm_up(space: str, device: str = "cpu") -> None:
    """Run a throwaway one-trial study in this process, once: the first trial of a process pays
    for lazy imports and torch's first-call set-up (~1.2 s here, 3-6 times a trial), which would
    otherwise be charged to whichever run a process starts first."""
    from nas.search.study import SearchConfig, run_search

    with tempfile.TemporaryDirectory() as tmp:
        warm = str(Path(tmp) / "warm.journal")
        run_search(SearchConfig(space=space, trials=1, storage=warm, sampler="random", device=device))


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One study: ``job`` names the sampler, seed, prune, trials, space file and journal; returns
    the run with every trial (times in seconds since the run started, from Optuna's timestamps)."""
    import torch

    from nas.search.record import record
    from nas.search.study import SearchConfig, open_study, run_search

    device = job.get("device", "cpu")
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warm_up(job["space"], device)
    name, error = arm_name(job["sampler"], job["prune"]), None
    started = dt.datetime.now()  # naive local time, as Optuna's trial timestamps read back
    clock = time.perf_counter()
    try:
        run_search(
            SearchConfig(
                space=job["space"],
                trials=job["trials"],
                storage=job["storage"],
                study=name,
                sampler=job["sampler"],
                seed=job["seed"],
                prune=job["prune"],
                baselines=job["baselines"],
                device=device,
            )
        )
    except Exception as e:  # noqa: BLE001 - one broken run is recorded, not allowed to end the benchmark
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - clock  # the search's wall-clock: the verify below is not part of it
    fidelity = None
    if error is None and job.get("verify", 0) > 0 and (job["sampler"], job["prune"]) == DEFAULT_ARM:
        fidelity = verify_run(name, job["storage"], job["verify"], job["seed"], device)
    study = open_study(name, job["storage"], create=False)
    trials = []
    for t in study.get_trials(deepcopy=False):
        if t.datetime_complete is None:  # left running by an error
            continue
        r = record(study, t)
        trials.append(
            {
                "number": t.number,
                "state": trial_state(r),
                **({name: r.values.get(name) for name in OBJECTIVES} if r.complete else {}),
                **({"baseline": r.baseline} if r.baseline is not None else {}),
                **({"reason": r.prune_reason} if r.prune_reason is not None else {}),
                "params": t.params,
                "end": round((t.datetime_complete - started).total_seconds(), 3),
                "seconds": round((t.datetime_complete - t.datetime_start).total_seconds(), 3),
                "train_seconds": r.train_seconds or 0.0,
                "steps": r.steps_done,  # of params["train.steps"] planned
            }
        )
    return {
        "seed": job["seed"],
        "sampler": job["sampler"],
        "prune": job["prune"],
        "trials_asked": job["trials"],
        "seconds": seconds,
        "error": error,
        "fidelity": fidelity,
        "trials": trials,
    }


def verify_run(name: str, storage: str, random: int, seed: int, device: str) -> dict[str, Any] | None:
    """``nas verify`` on the finished study: its front and ``random`` other trials retrained at
    ``VERIFY_FACTOR`` × their steps with one fresh seed; the proxy's and the parameter count's rank
    correlations with the long runs (``nas.results.fidelity``), None with too few trials."""
    import torch

    from nas.results.export import study_task
    from nas.results.fidelity import fidelity
    from nas.results.verify import run_verify
    from nas.search.record import VerifySettings
    from nas.search.storage import open_storage

    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    settings = VerifySettings(steps_factor=VERIFY_FACTOR, seeds=1, random=random, seed=seed)
    run_verify(study, settings, study_task(study), torch.device(device))
    found = fidelity(study)
    return None if found is None else found.to_dict()


def fidelity_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The proxy's fidelity over the runs that verified: each seed's Spearman and Kendall (proxy
    and parameter count against the long runs) and their medians."""
    rows = [(r["seed"], r["fidelity"]) for r in runs if r.get("fidelity")]
    if not rows:
        return None
    keys = ("spearman", "kendall", "params_spearman", "params_kendall")
    out: dict[str, Any] = {"seeds": [seed for seed, _ in rows], "steps_factor": rows[0][1]["steps_factor"]}
    for key in keys:
        xs = [f[key] for _, f in rows if f.get(key) is not None]
        out[key] = {"median": statistics.median(xs) if xs else None, "values": xs}
    out["trials"] = [f["trials"] for _, f in rows]
    return out


def run_all(jobs: list[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    """Every job, ``workers`` at a time (fresh spawned processes), in the given start order; a line per finished run."""
    runs: list[dict[str, Any] | None] = [None] * len(jobs)

    def done(i: int, run: dict[str, Any]) -> None:
        runs[i] = run
        n = sum(r is not None for r in runs)
        print(f"[{n}/{len(jobs)}] {run_line(run)}", flush=True)

    if workers == 1:
        for i, job in enumerate(jobs):
            done(i, run_one(job))
    else:
        ctx = multiprocessing.get_context("spawn")  # a clean torch per process (no forked thread pools)
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(run_one, job): i for i, job in enumerate(jobs)}
            for future in concurrent.futures.as_completed(futures):
                done(futures[future], future.result())
    return [r for r in runs if r is not None]


def run_line(run: dict[str, Any]) -> str:
    states = Counter(t["state"] for t in run["trials"])
    front = [t for t in run["trials"] if t["state"] in FRONT]
    best = max((t["accuracy"] for t in front), default=float("nan"))
    return (
        f"seed {run['seed']} {arm_name(run['sampler'], run['prune']):13s} {run['seconds']:6.1f} s, "
        f"best accuracy {best:.3f}, "
        + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        + (f"; ERROR {run['error']}" if run["error"] else "")
    )


# ---------------------------------------------------------------- scoring (pure: tests call these)


def losses(trial: dict[str, Any]) -> list[float]:
    """A trial's objectives as minimised losses, in ``OBJECTIVES`` order."""
    return [-trial[name] if direction == "maximize" else trial[name] for name, direction in OBJECTIVES.items()]


def reference_point(runs: Iterable[dict[str, Any]]) -> list[float]:
    """One reference point (as losses) for every run: the engine's rule over the front-eligible
    trials of all of them."""
    recs = [
        TrialRecord(t["number"], TrialState.COMPLETE, values={name: t[name] for name in OBJECTIVES})
        for run in runs
        for t in run["trials"]
        if t["state"] in FRONT
    ]
    ref = front_reference(recs)
    return [-ref[name] if direction == "maximize" else ref[name] for name, direction in OBJECTIVES.items()]


def until(run: dict[str, Any], *, trials: int | None = None, seconds: float | None = None) -> list[dict[str, Any]]:
    """The run's trials up to its ``trials``-th trained one, or those completed within ``seconds``
    of its start (all of them when neither is given)."""
    out, counted = [], 0
    for t in sorted(run["trials"], key=lambda t: t["end"]):
        if seconds is not None and t["end"] > seconds:
            break
        if trials is not None and counted >= trials:
            break
        out.append(t)
        counted += t["state"] in COUNTED
    return out


def hypervolume(trials: Iterable[dict[str, Any]], reference: Sequence[float]) -> float:
    """Hypervolume of the front-eligible ``trials`` against ``reference`` (points not better than
    it in every objective add nothing and are left out)."""
    ref = np.asarray(reference, dtype=float)
    points = np.array([losses(t) for t in trials if t["state"] in FRONT], dtype=float).reshape(-1, len(ref))
    points = points[(points < ref).all(axis=1)]
    return float(compute_hypervolume(points, ref)) if len(points) else 0.0


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median and quartiles (NaN for an empty sample)."""
    if not xs:
        return {"median": float("nan"), "q25": float("nan"), "q75": float("nan")}
    q25, median, q75 = np.quantile(np.asarray(xs, dtype=float), [0.25, 0.5, 0.75])
    return {"median": float(median), "q25": float(q25), "q75": float(q75)}


def greater_p(xs: Sequence[float], baseline: Sequence[float]) -> float:
    """One-sided Mann–Whitney U p-value of "``xs`` tends to be larger than ``baseline``"."""
    return float(mannwhitneyu(xs, baseline, alternative="greater").pvalue)


def wall_budgets(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Wall-clock budgets: ``WALL_FRACTIONS`` of the shortest run (every run was observed that long)."""
    shortest = min(run["seconds"] for run in runs)
    return {f"wall {round(100 * f)}%": f * shortest for f in WALL_FRACTIONS}


def summarise(runs: Sequence[dict[str, Any]], reference: Sequence[float]) -> dict[str, Any]:
    """Per arm: hypervolume at each budget (spread over seeds, ratio of medians to the baseline
    arm, Mann–Whitney p against it), throughput and time spent."""
    walls = wall_budgets(runs)
    arms = sorted({(r["sampler"], r["prune"]) for r in runs}, key=lambda a: (SAMPLERS.index(a[0]), a[1]))
    scores: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for arm in arms:
        mine = sorted((r for r in runs if (r["sampler"], r["prune"]) == arm), key=lambda r: r["seed"])
        scores[arm] = {"trials": [hypervolume(until(r, trials=r["trials_asked"]), reference) for r in mine]}
        for n in CURVE_TRIALS:
            if all(n < r["trials_asked"] for r in mine):
                scores[arm][f"trials {n}"] = [hypervolume(until(r, trials=n), reference) for r in mine]
        for label, seconds in walls.items():
            scores[arm][label] = [hypervolume(until(r, seconds=seconds), reference) for r in mine]
    base = scores.get(BASELINE)
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if (r["sampler"], r["prune"]) == arm]
        hv = {}
        for budget, xs in scores[arm].items():
            row: dict[str, Any] = spread(xs) | {"values": xs}
            if base is not None and arm != BASELINE:
                base_median = statistics.median(base[budget])
                row["ratio"] = row["median"] / base_median if base_median > 0 else float("nan")
                row["p"] = greater_p(xs, base[budget])
            hv[budget] = row
        counted = [sum(t["state"] in COUNTED for t in r["trials"]) for r in mine]
        candidates = [sum(t["state"] in CANDIDATES for t in r["trials"]) for r in mine]
        out[arm_name(*arm)] = {
            "sampler": arm[0],
            "prune": arm[1],
            "seeds": sorted(r["seed"] for r in mine),
            "hypervolume": hv,
            "trials_per_hour": spread([3600 * n / r["seconds"] for n, r in zip(counted, mine, strict=True)]),
            "candidates_per_hour": spread([3600 * n / r["seconds"] for n, r in zip(candidates, mine, strict=True)]),
            "pruned": spread([sum(t["state"] == "pruned" for t in r["trials"]) for r in mine]),
            "run_seconds": spread([r["seconds"] for r in mine]),
            "trial_seconds": spread([sum(t["seconds"] for t in r["trials"]) for r in mine]),
            "train_seconds": spread([sum(t["train_seconds"] for t in r["trials"]) for r in mine]),
        }
    return {"wall_budgets": walls, "default_arm": arm_name(DEFAULT_ARM[0], DEFAULT_ARM[1]), "arms": out}


def first_candidates(run: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The run's trials (in order) up to and including its ``n``-th candidate."""
    out, seen = [], 0
    for t in sorted(run["trials"], key=lambda t: t["number"]):
        if seen >= n:
            break
        out.append(t)
        seen += t["state"] in CANDIDATES
    return out


def best_outcome(unpruned: dict[str, Any], pruned: dict[str, Any]) -> str | None:
    """What happened in ``pruned`` to the configuration of ``unpruned``'s most accurate sampled
    front-eligible trial: ``pruned``, ``kept`` or ``not proposed`` (None: no such trial)."""
    front = [t for t in unpruned["trials"] if t["state"] in FRONT and "baseline" not in t]
    if not front:
        return None
    best = max(front, key=lambda t: (t["accuracy"], -t["number"]))
    same = [t for t in pruned["trials"] if t["params"] == best["params"]]
    if any(t["state"] == "pruned" for t in same):
        return "pruned"
    return "kept" if any(t["state"] in COUNTED for t in same) else "not proposed"


def saving(unpruned: dict[str, Any], pruned: dict[str, Any]) -> dict[str, Any]:
    """Early stopping at one sampler and seed: time for the same number of candidates, the
    configurations both runs share from the start, and what became of the best one."""
    n = min(sum(t["state"] in CANDIDATES for t in r["trials"]) for r in (unpruned, pruned))
    off, on = first_candidates(unpruned, n), first_candidates(pruned, n)
    offs, ons = [t for t in off if t["state"] in CANDIDATES], [t for t in on if t["state"] in CANDIDATES]
    shared = next((i for i, (a, b) in enumerate(zip(offs, ons, strict=True)) if a["params"] != b["params"]), n)
    seconds = (sum(t["seconds"] for t in off), sum(t["seconds"] for t in on))
    train = (sum(t["train_seconds"] for t in off), sum(t["train_seconds"] for t in on))

    def best(run: dict[str, Any]) -> float:
        return max((t["accuracy"] for t in run["trials"] if t["state"] in FRONT), default=float("nan"))

    return {
        "seed": unpruned["seed"],
        "candidates": n,
        "shared": shared,
        "seconds": list(seconds),
        "train_seconds": list(train),
        "saving": 1 - seconds[1] / seconds[0] if seconds[0] > 0 else float("nan"),
        "train_saving": 1 - train[1] / train[0] if train[0] > 0 else float("nan"),
        "pruned": sum(t["state"] == "pruned" for t in on),
        "best": best_outcome(unpruned, pruned),
        "best_accuracy": [best(unpruned), best(pruned)],
    }


def savings(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per sampler: ``saving`` at every seed run both ways, its median and minimum, the pooled
    saving (1 − Σ with / Σ without) and how often the best configuration was kept."""
    by = {(r["sampler"], r["seed"], r["prune"]): r for r in runs}
    out = {}
    for sampler in [s for s in SAMPLERS if any(r["sampler"] == s for r in runs)]:
        seeds = sorted({seed for s, seed, _ in by if s == sampler and (s, seed, False) in by and (s, seed, True) in by})
        rows = [saving(by[sampler, seed, False], by[sampler, seed, True]) for seed in seeds]
        if not rows:
            continue
        out[sampler] = {
            "saving": spread([r["saving"] for r in rows]) | {"min": min(r["saving"] for r in rows)},
            "train_saving": spread([r["train_saving"] for r in rows]) | {"min": min(r["train_saving"] for r in rows)},
            "pooled_saving": 1 - sum(r["seconds"][1] for r in rows) / sum(r["seconds"][0] for r in rows),
            "best": dict(Counter(str(r["best"]) for r in rows)),
            "seeds": rows,
        }
    return out


# ---------------------------------------------------------------- report


def print_report(summary: dict[str, Any], saved: dict[str, Any], trials: int) -> None:
    arms = summary["arms"]
    curve = sorted({b for arm in arms.values() for b in arm["hypervolume"] if b.startswith("trials ")})
    budgets = (
        {b: f"at {b.split()[1]} trained trials" for b in curve}
        | {"trials": f"at {trials} trained trials"}
        | {label: f"at {label} of the shortest run ({s:.1f} s)" for label, s in summary["wall_budgets"].items()}
    )
    base = arm_name(*BASELINE)
    print(f"\nhypervolume ×1e3: median [IQR] over seeds; ×{base}: ratio of medians; p: Mann–Whitney U, arm > {base}")
    for budget, title in budgets.items():
        print(f"\n  {title}")
        print(f"  {'arm':14s} {'seeds':>5s} {'median':>7s} {'IQR':>17s} {'×' + base:>8s} {'p':>7s}")
        for name, arm in arms.items():
            hv = arm["hypervolume"][budget]
            ratio = f"{hv['ratio']:.2f}" if "ratio" in hv else "-"
            p = f"{hv['p']:.3g}" if "p" in hv else "-"
            iqr = f"[{1e3 * hv['q25']:.3f}, {1e3 * hv['q75']:.3f}]"
            print(f"  {name:14s} {len(arm['seeds']):5d} {1e3 * hv['median']:7.3f} {iqr:>17s} {ratio:>8s} {p:>7s}")
    print("\nthroughput (medians over seeds): trained trials and candidates per hour of wall-clock; per run:")
    print(
        f"  {'arm':14s} {'trials/h':>9s} {'cand./h':>8s} {'pruned':>7s} {'run s':>7s} {'trial s':>8s} {'train s':>8s}"
    )
    for name, arm in arms.items():
        print(
            f"  {name:14s} {arm['trials_per_hour']['median']:9.0f} {arm['candidates_per_hour']['median']:8.0f} "
            f"{arm['pruned']['median']:7.1f} {arm['run_seconds']['median']:7.1f} "
            f"{arm['trial_seconds']['median']:8.1f} {arm['train_seconds']['median']:8.1f}"
        )
    if (fid := summary.get("fidelity")) is not None:
        print(
            f"\nproxy fidelity of the default arm ({len(fid['seeds'])} runs; front + random trials at "
            f"{fid['steps_factor']:g}x steps, medians): Spearman {_num(fid['spearman']['median'])}, "
            f"Kendall {_num(fid['kendall']['median'])}; parameter count {_num(fid['params_spearman']['median'])}, "
            f"{_num(fid['params_kendall']['median'])}"
        )
    print("\nearly stopping: time saved for the same number of candidates (trial durations; training seconds)")
    print(
        f"  {'sampler':8s} {'median':>7s} {'min':>7s} {'pooled':>7s} {'train':>7s}   best configuration (run without)"
    )
    for sampler, row in saved.items():
        outcomes = ", ".join(f"{n} {what}" for what, n in sorted(row["best"].items()))
        print(
            f"  {sampler:8s} {row['saving']['median']:7.1%} {row['saving']['min']:7.1%} {row['pooled_saving']:7.1%} "
            f"{row['train_saving']['median']:7.1%}   {outcomes}"
        )


def space_text(name_or_path: str) -> str:
    """The YAML text of a shipped space (by name) or a space file, as the results record it."""
    from importlib import resources

    path = Path(name_or_path)
    if not (name_or_path.endswith((".yaml", ".yml")) or path.exists()):
        path = Path(str(resources.files("search_spaces"))) / f"{name_or_path}.yaml"
    return path.read_text()


def git_commit() -> str | None:
    """The repository's HEAD (with ``+dirty`` when the tree differs from it), or None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def cpu_description() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def to_json(payload: dict[str, Any]) -> str:
    """``payload`` indented, except that each trial of ``payload["runs"]`` is one line: ~4,000
    trials stay readable and diffable."""
    head = json.dumps({key: value for key, value in payload.items() if key != "runs"}, indent=1)
    runs = []
    for run in payload["runs"]:
        meta = json.dumps({key: value for key, value in run.items() if key != "trials"})
        trials = ",\n   ".join(json.dumps(t) for t in run["trials"])
        runs.append(f'  {meta[:-1]}, "trials": [\n   {trials}\n  ]}}')
    return head[: -len("\n}")] + ',\n "runs": [\n' + ",\n".join(runs) + "\n ]\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0-9 (0 1 with --quick)")
    parser.add_argument("--samplers", nargs="+", choices=SAMPLERS, help="default all (tpe random with --quick)")
    parser.add_argument(
        "--trials", type=int, help=f"trained trials per run; default {DEFAULT_TRIALS} (12 with --quick)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="studies run at once, each in its own process")
    parser.add_argument("--quick", action="store_true", help="smoke run; writes search_quality_cpu_quick.json")
    parser.add_argument(
        "--prune", choices=["both", "off"], default="both", help="off: only the arms without early stopping"
    )
    parser.add_argument(
        "--no-baselines", dest="baselines", action="store_false", help="studies without the engine's reference trials"
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: train on GPU 0 and measure each candidate's latency there (default space hybrid_small); "
        "writes search_quality_<gpu>.json",
    )
    parser.add_argument(
        "--space", help="a space name or YAML file instead of the benchmark's own (default: its MQAR space on the CPU)"
    )
    parser.add_argument(
        "--verify",
        type=int,
        default=5,
        metavar="N",
        help="after each default-arm run, retrain its front and N random trials at 4x steps and report the "
        "proxy's rank correlation (0: off; not counted in the run's wall-clock)",
    )
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, "search_quality.py: --device cuda needs a CUDA device; none is visible\n")
    seeds = args.seeds or ([0, 1] if args.quick else list(range(10)))
    samplers = args.samplers or (["tpe", "random"] if args.quick else list(SAMPLERS))
    trials = args.trials or (12 if args.quick else DEFAULT_TRIALS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    start, load = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        space_arg = args.space or ("hybrid_small" if args.device == "cuda" else None)
        if space_arg is None:
            space = Path(tmp) / "space.yaml"
            space.write_text(SPACE.format(task=TASK))
        else:
            space = space_arg
        order = schedule(seeds, samplers, (False,) if args.prune == "off" else (False, True))
        jobs = [
            {
                "seed": seed,
                "sampler": sampler,
                "prune": prune,
                "trials": trials,
                "baselines": args.baselines,
                "space": str(space),
                "device": args.device,
                "verify": args.verify,
                "storage": str(Path(tmp) / f"{arm_name(sampler, prune)}-{seed}.journal"),
            }
            for seed, sampler, prune in order
        ]
        runs = run_all(jobs, args.jobs)
    wall = time.perf_counter() - start
    scored = [run for run in runs if run["error"] is None]
    errors = [f"seed {r['seed']} {arm_name(r['sampler'], r['prune'])}: {r['error']}" for r in runs if r["error"]]
    reference = reference_point(scored)
    summary = summarise(scored, reference) | {"fidelity": fidelity_summary(scored)}
    saved = savings(scored)
    print_report(summary, saved, trials)
    print(f"\n{len(runs)} runs in {wall:.0f} s with --jobs {args.jobs}; reference point (losses) {reference}")
    if errors:
        print(f"\n{len(errors)} runs ended with an error and are left out of every score above:")
        print("\n".join(f"  {line}" for line in errors))

    import torch

    slug = "cpu" if args.device == "cpu" else device_slug()
    out = Path(args.out) / f"search_quality_{slug}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "optuna": optuna.__version__,
        "cpu": cpu_description(),
        "torch_threads": 1,
        "jobs": args.jobs,
        "load_average": {"start": list(load), "end": list(os.getloadavg())},
        "wall_seconds": wall,
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
        "task": TASK if space_arg is None else None,
        "space": SPACE.format(task=TASK) if space_arg is None else space_text(space_arg),
        "samplers": samplers,
        "seeds": seeds,
        "trials": trials,
        "baselines": args.baselines,
        "order": [arm_name(sampler, prune) + f"/{seed}" for seed, sampler, prune in order],
        "objectives": OBJECTIVES,
        "reference_point": reference,
        "summary": summary,
        "savings": saved,
        "errors": errors,
        "runs": runs,
    }
    out.write_text(to_json(payload))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
