"""Does a search's result depend on how busy the machine is? The default ``nas search`` run twice
with the same seed: on an idle machine, then with CPU-bound processes beside it.

Reports each run's wall time, trained and truncated trials, and the front; checks that no
truncated trial is on the front, and that every trial both runs trained fully with the same
configuration reached the same accuracy (±0.01). Trials after the first truncation may differ
(the sampler saw a different history). Writes ``benchmarks/results/search_under_load.json``.

    python benchmarks/search_under_load.py [--busy 2] [--args "--space hybrid_small"]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nas.results.pareto import front  # noqa: E402
from nas.search.record import records  # noqa: E402
from nas.search.storage import open_storage  # noqa: E402

STUDY = "under-load"
TOLERANCE = 0.01


def _run(workdir: Path, label: str, busy: int, args: list[str]) -> dict:
    storage = str(workdir / f"{label}.journal")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "nas", "search", "--study", STUDY, "--storage", storage, *args],
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - start
    finally:
        for hog in hogs:
            hog.kill()
    if proc.returncode:
        raise SystemExit(f"{label}: nas search exited {proc.returncode}: {proc.stderr[-2000:]}")
    study = optuna.load_study(study_name=STUDY, storage=open_storage(storage))
    rows = [
        {
            "number": r.number,
            "params": study.trials[r.number].params,
            "arch": r.arch_summary,
            "accuracy": r.accuracy,
            "steps": r.steps_text(),
            "truncated": r.truncated,
            "train_seconds": r.train_seconds,
        }
        for r in records(study)
        if r.trained
    ]
    best = front(study)
    return {
        "run": label,
        "busy_processes": busy,
        "wall_s": round(wall, 1),
        "trained": len(rows),
        "truncated": sum(r["truncated"] for r in rows),
        "front": [r.number for r in best],
        "truncated_on_front": [r.number for r in best if r.truncated],
        "trials": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the loaded run")
    parser.add_argument("--args", default="", help="extra nas search arguments (default: the default search)")
    parser.add_argument("--out", default="benchmarks/results/search_under_load.json")
    args = parser.parse_args()
    extra = shlex.split(args.args)
    with tempfile.TemporaryDirectory() as tmp:
        idle = _run(Path(tmp), "idle", 0, extra)
        loaded = _run(Path(tmp), "loaded", args.busy, extra)
    by_number = {r["number"]: r for r in loaded["trials"]}
    compared = []
    for a in idle["trials"]:
        b = by_number.get(a["number"])
        if b is None or b["params"] != a["params"] or a["truncated"] or b["truncated"]:
            continue
        compared.append(
            {
                "number": a["number"],
                "arch": a["arch"],
                "idle": a["accuracy"],
                "loaded": b["accuracy"],
                "delta": abs(a["accuracy"] - b["accuracy"]),
            }
        )
    ok = (
        not loaded["truncated_on_front"]
        and not idle["truncated_on_front"]
        and all(c["delta"] <= TOLERANCE for c in compared)
    )
    for run in (idle, loaded):
        print(
            f"{run['run']:7s} ({run['busy_processes']} busy): {run['wall_s']:6.1f} s, {run['trained']} trained, "
            f"{run['truncated']} truncated, front {run['front']}, truncated on front {run['truncated_on_front']}"
        )
    print(
        f"{len(compared)} trials trained fully in both with the same configuration; largest accuracy difference "
        f"{max((c['delta'] for c in compared), default=0):.4f} (tolerance {TOLERANCE}) -> {'OK' if ok else 'FAIL'}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "cpu": platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "optuna": optuna.__version__,
                "search_args": extra,
                "ok": ok,
                "compared": compared,
                "runs": [idle, loaded],
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
