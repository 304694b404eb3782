"""Refit a profile's decode model from stored GPU timing rows, on any machine (no GPU needed).

`nas profiles calibrate --decode` times random architectures of the forward calibration's kind
(d_model ≤ 512, vocab < 10 000: a few MiB of weights), so the weights' coefficient is fitted where
weights are a small share of a step. Against the whole-model rows of `decode_models.py` (width
1024, 16 blocks, vocab 32 000: ~450 MiB of weights per step) that fit over-predicted every row by
about 56 %. This script fits the calibration rows and the whole-model rows together, checks the
result three ways, and writes the profile's `calibrated.decode_model`:

- cross-validated by architecture over all rows (the interval: its 95th percentile |error|);
- each whole-model mix held out in turn (fitted on the others and every calibration row);
- the calibration rows alone, as the committed fit saw them.

    python benchmarks/decode_refit.py --profile h200 \
        --rows benchmarks/results/decode_rows_h200.json --models benchmarks/results/decode_models_h200.json \
        --out hardware_profiles/h200.yaml --report benchmarks/results/decode_refit_h200.json

Every row should come from the same decode kernels (the profile records their fingerprint: run it
at the commit the calibration rows were timed at); where the whole-model rows are older, say so
with `--note` (it goes into the report).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_models import MIXES, arch  # noqa: E402

from hardware_profiles import load_profile  # noqa: E402
from nas.latency.calibrate_decode import _predict, decode_section, fit_decode, write_decode  # noqa: E402


def model_rows(path: Path) -> list[dict]:
    """decode_models.py's rows in the calibration's row form (arch, batch, context, ms)."""
    return [
        {"arch": arch(MIXES[r["model"]]).to_dict(), "batch": r["batch"], "context": r["context"], "ms": r["median_ms"]}
        for r in json.loads(path.read_text())["results"]
    ]


def _errors(coef: list[float], rows: list[dict]) -> dict:
    e = sorted(abs(_predict(coef, r) / r["ms"] - 1) for r in rows)
    return {"n": len(e), "median": statistics.median(e), "p95": e[min(len(e) - 1, int(0.95 * len(e)))], "max": e[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--rows", type=Path, default=Path("benchmarks/results/decode_rows_h200.json"))
    parser.add_argument("--models", type=Path, default=Path("benchmarks/results/decode_models_h200.json"))
    parser.add_argument("--out", type=Path, help="profile YAML to write (default: print only)")
    parser.add_argument("--report", type=Path, help="JSON of the checks")
    parser.add_argument("--note", default="", help="recorded in the report (e.g. where the rows' kernels differ)")
    args = parser.parse_args()

    meta = json.loads(args.rows.read_text())
    calib = [r for r in meta["decode_rows"] if "ms" in r]
    models = model_rows(args.models)
    calib_only, _ = fit_decode(calib)
    coef, report = fit_decode(calib + models)
    held_out = []
    for mix in MIXES:
        key = arch(MIXES[mix]).to_dict()
        c, _ = fit_decode(calib + [r for r in models if r["arch"] != key], folds=len(calib) + len(models))
        held_out += [r | {"predicted_ms": _predict(c, r)} for r in models if r["arch"] == key]
    e = sorted(abs(r["predicted_ms"] / r["ms"] - 1) for r in held_out)
    result = {
        "gpu": meta["gpu"],
        "torch": meta["torch"],
        "triton": meta["triton"],
        "date": meta["date"],
        "sources": [str(args.rows), str(args.models)],
        "coefficients": coef,
        "coefficients_calibration_rows_only": calib_only,
        "interval": report["interval"],
        "cv": report["cv"],
        "whole_models_by_calibration_rows_only": _errors(calib_only, models),
        "whole_models_mix_held_out": {
            "n": len(e),
            "median": statistics.median(e),
            "p95": e[min(len(e) - 1, int(0.95 * len(e)))],
            "max": e[-1],
        },
        "calibration_rows_by_joint_fit": _errors(coef, calib),
        **({"note": args.note} if args.note else {}),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "cv"}, indent=1))
    if args.report:
        args.report.write_text(json.dumps(result, indent=1) + "\n")
    if args.out:
        env = {"date": meta["date"], "gpu": meta["gpu"]}
        path = write_decode(load_profile(args.profile), decode_section(coef, report, env), args.out)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
