"""`nas search --target auto` on a GPU: are latencies measured, and what does scoring cost per candidate?

    PYTHONPATH=$PWD python benchmarks/search_measured.py [--trials 10] [--out DIR]

Runs ``nas search --space hybrid_small --trials N --target auto`` twice in fresh processes with
one Triton cache directory: the first ("cold") starts from an empty Triton cache, so its early
candidates pay kernel compiles and autotuning; the second ("warm") is a new study with the same
seed, so it samples the same first candidates, with the kernels and autotune timings now in
Triton's on-disk cache but an empty latency cache (every candidate is really measured again).
Per trial it records the stored latency (source, GPU, versions, median, IQR, notes) and
``latency_seconds``, the wall time of scoring: build, kernel compile/autotune, correctness
check, graph capture and timed replays. Writes ``search_measured_<gpu>.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._timing import environment, write_results  # noqa: E402


def run(label: str, trials: int, workdir: Path, triton_cache: Path) -> dict:
    import optuna

    from nas.search.record import records
    from nas.search.storage import open_storage

    storage, name = str(workdir / f"{label}.journal"), f"measured-{label}"
    env = {**os.environ, "TRITON_CACHE_DIR": str(triton_cache), "NAS_LATENCY_CACHE": str(workdir / f"{label}.json")}
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nas",
            "search",
            "--space",
            "hybrid_small",
            "--trials",
            str(trials),
            "--target",
            "auto",
            "--study",
            name,
            "--storage",
            storage,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.monotonic() - start
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    rows = []
    for r in records(study):
        rows.append(
            {
                "number": r.number,
                "state": r.state.name,
                "arch": r.arch_summary,
                "latency_source": r.latency.source if r.latency else None,
                "latency": r.latency.to_dict() if r.latency else {},
                "latency_seconds": r.latency_seconds,
                "train_seconds": r.train_seconds,
                "failure": r.failure,
            }
        )
    scoring = [r["latency_seconds"] for r in rows if r["latency_seconds"] is not None]
    return {
        "run": label,
        "wall_s": round(wall, 1),
        "returncode": proc.returncode,
        "stdout_tail": proc.stdout[-1500:],
        "stderr_tail": proc.stderr[-1500:],
        "measured": sum(r["latency_source"] == "measured" for r in rows),
        "trials": rows,
        "scoring_seconds_median": statistics.median(scoring) if scoring else None,
        "scoring_seconds_max": max(scoring) if scoring else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    env = environment()
    print(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label in ("cold", "warm"):
            row = run(label, args.trials, work, work / "triton-cache")
            results.append(row)
            print(
                f"{label}: rc {row['returncode']}, {row['measured']}/{len(row['trials'])} measured in "
                f"{row['wall_s']} s; scoring s median {row['scoring_seconds_median']} max "
                f"{row['scoring_seconds_max']}"
            )
            for t in row["trials"]:
                lat = t["latency"]
                print(
                    f"  #{t['number']:<3} {t['state']:8s} {str(t['arch'])[:48]:48s} {t['latency_source']} "
                    f"{lat.get('median_ms')} ms iqr {lat.get('iqr_ms')} scoring {t['latency_seconds']} s "
                    f"{t['failure'] or ''}"
                )
            if row["returncode"]:
                print(row["stderr_tail"])
    gpu = (env["gpu"] or "cpu").lower().replace("nvidia ", "").replace(" ", "_")
    print(f"wrote {write_results(Path(args.out) / f'search_measured_{gpu}.json', results)}")


if __name__ == "__main__":
    main()
