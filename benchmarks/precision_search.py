"""Does a search over stored precision keep more than one precision on its front, and what does each cost in accuracy?

    python -m benchmarks precision_search --gpus 0 --trials-per-gpu 3 --trials 30   # search, then summarise
    python -m benchmarks precision_search --journal runs/p.journal --study p        # summarise a study run before

Runs ``nas search --space hybrid_long_precision --objectives accuracy,decode_latency,cache_memory
--context 32768`` (KV cache, linear-attention state and weights each searched at two dtypes; decode
latency timed on the GPU at those dtypes), then reads the study back. Each candidate is trained at
full precision and scored twice over the same trained models: with its cache, state and weights
rounded as stored (the objective) and at full precision (``full_precision_accuracy``). Reported:

- every trained trial: its precision setting (the dtypes that differ from the defaults, as
  ``ArchSpec.precision_text`` writes them; "full" for none), accuracy at that precision and at full
  precision, the cost (full minus stored), decode latency and cache memory;
- the front (``nas.results.pareto.front``, the table ``nas search`` prints) and the settings on it;
- per setting over all its trials: count, median and largest accuracy cost, median decode latency.

The cost is the same trained weights scored both ways, so training noise does not enter it; what a
setting buys is in its trials' decode latency and cache memory. Written to
``results/precision_search_<device>.json`` (the device the decode steps were timed on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import RESULTS, device_slug, write_results  # noqa: E402
from nas.results.pareto import completed, front  # noqa: E402

SPACE = "hybrid_long_precision"
OBJECTIVES = "accuracy,decode_latency,cache_memory"


def run_search(args: argparse.Namespace) -> None:
    cmd = [sys.executable, "-m", "nas", "search", "--space", SPACE, "--objectives", OBJECTIVES]
    cmd += ["--context", str(args.context), "--trials", str(args.trials), "--seed", str(args.seed)]
    cmd += ["--storage", args.journal, "--study", args.study, "--gpus", args.gpus]
    cmd += ["--trials-per-gpu", str(args.trials_per_gpu)]
    subprocess.run(cmd, check=True)


def trial_row(rec) -> dict:
    decode = rec.decode_latency
    full = rec.accuracy if rec.full_precision_accuracy is None else rec.full_precision_accuracy
    return {
        "trial": rec.number,
        "architecture": rec.arch_summary,
        "precision": rec.arch.precision_text() or "full",
        "baseline": rec.baseline,
        "accuracy": rec.accuracy,
        "full_precision_accuracy": full,
        "accuracy_cost": full - rec.accuracy,
        "accuracy_interval": rec.accuracy_interval,
        "decode_latency_ms": rec.value("decode_latency_ms"),
        "decode_latency_source": None if decode is None else decode.source,
        "decode_device": None if decode is None else decode.device,
        "cache_memory_mb": rec.value("cache_memory_mb"),
        "params": rec.params,
        "steps": rec.steps_done,
        "train_seconds": rec.train_seconds,
    }


def per_setting(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for setting in sorted({r["precision"] for r in rows}):
        mine = [r for r in rows if r["precision"] == setting]
        costs = [r["accuracy_cost"] for r in mine]
        out[setting] = {
            "trials": len(mine),
            "median_accuracy_cost": statistics.median(costs),
            "max_accuracy_cost": max(costs),
            "median_decode_latency_ms": statistics.median(r["decode_latency_ms"] for r in mine),
            "median_cache_memory_mb": statistics.median(r["cache_memory_mb"] for r in mine),
        }
    return out


def summarise(journal: str, study_name: str) -> dict:
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    study = optuna.load_study(study_name=study_name, storage=storage)
    rows = [trial_row(r) for r in completed(study) if r.accuracy is not None]
    on_front = [trial_row(r) for r in front(study)]
    devices = {r["decode_device"] for r in rows if r["decode_latency_source"] == "measured"}
    return {
        "rows": rows,
        "front": on_front,
        "front_settings": sorted({r["precision"] for r in on_front}),
        "per_setting": per_setting(rows),
        "decode_timed_on": sorted(d for d in devices if d),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--journal", default="runs/precision_search.journal")
    p.add_argument("--study", default="precision_search")
    p.add_argument("--gpus", help="run the search on these GPUs first (e.g. 0); without it, summarise only")
    p.add_argument("--trials-per-gpu", type=int, default=3)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="results JSON (default results/precision_search_<device>.json)")
    p.add_argument("--note", default="", help="how the study was run, when summarising one run elsewhere")
    p.add_argument("--run-env", default="{}", help="JSON: the run machine's gpu, torch, triton, ...")
    args = p.parse_args(argv)
    if args.gpus:
        run_search(args)
    summary = summarise(args.journal, args.study)
    timed = summary["decode_timed_on"]
    out = args.out or RESULTS / f"precision_search_{device_slug(timed[0]) if timed else 'cpu'}.json"
    rows = summary.pop("rows")
    write_results(
        out,
        rows,
        question=__doc__.splitlines()[0],
        space=SPACE,
        objectives=OBJECTIVES,
        context=args.context,
        study=args.study,
        note=args.note,
        **summary,
        **json.loads(args.run_env),
    )
    print(f"{len(rows)} trials; front settings: {summary['front_settings']}")
    for setting, s in summary["per_setting"].items():
        print(
            f"  {setting:<32} {s['trials']:>3} trials  median cost {s['median_accuracy_cost']:+.4f}  "
            f"max {s['max_accuracy_cost']:+.4f}  decode {s['median_decode_latency_ms']:.4f} ms"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
