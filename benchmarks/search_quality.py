"""Which sampler finds a better front for the same trial budget? Hypervolume after N trials.

    python benchmarks/search_quality.py [--trials 40] [--seeds 0 1] [--out DIR]

Runs ``nas search``'s engine (CPU, latency predicted for the h200 profile) on the small-MQAR
task with each sampler and seed, then scores every study's feasible front by its hypervolume
(Optuna's) against one reference point shared by all runs: accuracy 0, and 1.1 × the worst
latency and memory seen in any run (objectives as minimised losses: −accuracy, latency, memory).
Prints a table (mean over seeds) and writes ``search_quality.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
import torch
from optuna._hypervolume import compute_hypervolume  # Optuna's own WFG implementation

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nas.results.pareto import completed, front  # noqa: E402
from nas.search.study import SAMPLERS, SearchConfig, run_search  # noqa: E402

TASK = "mqar:vocab_size=32,seq_len=24,num_kv_pairs=3,n_train=2048,n_test=256"
SPACE = """\
name: search_quality
description: benchmark space (2 blocks max, short training)
task: {task}
max_train_seconds: 5
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
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS))
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE.format(task=TASK))
        for sampler in args.samplers:
            for seed in args.seeds:
                start = time.perf_counter()
                study = run_search(
                    SearchConfig(
                        space=str(space),
                        trials=args.trials,
                        storage=str(Path(tmp) / "s.journal"),
                        study=f"{sampler}-{seed}",
                        sampler=sampler,
                        seed=seed,
                        device="cpu",
                    )
                )
                runs.append(
                    {
                        "sampler": sampler,
                        "seed": seed,
                        "seconds": time.perf_counter() - start,
                        "values": [[r.accuracy, r.latency_ms, r.memory_mb] for r in completed(study)],
                        "front": [[r.accuracy, r.latency_ms, r.memory_mb] for r in front(study)],
                    }
                )
                print(
                    f"{sampler:7s} seed {seed}: best accuracy {max(v[0] for v in runs[-1]['values']):.3f}, "
                    f"front {len(runs[-1]['front'])}, {runs[-1]['seconds']:.0f} s",
                    flush=True,
                )

    worst = np.max(np.array([v for r in runs for v in r["values"]]), axis=0)
    reference = np.array([0.0, 1.1 * worst[1], 1.1 * worst[2]])
    for r in runs:
        losses = np.array([[-a, lat, mem] for a, lat, mem in r["front"]])
        r["hypervolume"] = float(compute_hypervolume(losses, reference)) if len(losses) else 0.0
    summary = {}
    for sampler in args.samplers:
        mine = [r for r in runs if r["sampler"] == sampler]
        summary[sampler] = {
            "hypervolume_mean": statistics.mean(r["hypervolume"] for r in mine),
            "best_accuracy_mean": statistics.mean(max(v[0] for v in r["values"]) for r in mine),
            "seconds_mean": statistics.mean(r["seconds"] for r in mine),
        }
    print(
        f"\n{'sampler':8s} {'hypervolume':>12s} {'best acc':>9s} {'s/run':>7s}   "
        f"({args.trials} trials, seeds {args.seeds})"
    )
    for sampler, row in sorted(summary.items(), key=lambda kv: -kv[1]["hypervolume_mean"]):
        print(
            f"{sampler:8s} {row['hypervolume_mean']:12.5f} {row['best_accuracy_mean']:9.3f} {row['seconds_mean']:7.0f}"
        )
    out = Path(args.out) / "search_quality.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "torch": torch.__version__,
                "optuna": optuna.__version__,
                "cpu": f"{platform.machine()}, {torch.get_num_threads()} torch thread",
                "task": TASK,
                "trials": args.trials,
                "seeds": args.seeds,
                "reference_point": reference.tolist(),
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
