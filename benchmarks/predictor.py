"""How well does the calibrated latency predictor match measurements on architectures it never saw?

    PYTHONPATH=$PWD python benchmarks/predictor.py --gpu [--calibrate] [--out DIR]     # on the GPU
    PYTHONPATH=$PWD python benchmarks/predictor.py --rows DIR/predictor_rows.json       # anywhere

On a GPU (``--gpu``): draws its held-out architectures (``--seed``, 3) from ``--held GENERATOR``:
``preset`` (the default: candidates of the shipped search spaces, ``preset_arch``), a generator
neither fit draw uses, or ``space`` (``space_arch``: a random search space as a user's YAML
writes one, which ``--fit-draw mixed``, the calibration's own draw, also fits on), so the check
says how far the fit carries — and measures each at 1×256, 8×1024 and 32×512 with
``nas.latency.measure``, and one decoding step of the first ``--decode-archs`` of them at
``DECODE_HELD_OUT`` with ``measure_decode``. With ``--calibrate`` it first calibrates this GPU's
profile in the same process (kernel grid, fit set, check set: ``nas.latency.calibrate``) and
writes the profile with its new ``calibrated:`` section to ``--out``. Rows are written as they
are measured, so a run cut short still leaves its data. For a check on a lease the fit never
used, calibrate and measure in two runs.

Everywhere (``--rows``): predicts every measured row with the profile's calibration (or with the
one ``--profile`` names) and reports, per shape: share within ±10 %, Spearman, median ratio
predicted/measured, the share inside the predicted interval — and the same for two baselines on
the same rows: FLOPs only (one scale per shape, fitted on the calibration's whole-model rows,
``--calibration-rows``) and the uncalibrated roofline; the decode steps per (batch, context); and
with ``--transfer-from P``, forwards and steps predicted by ``P``'s calibration transferred to
this GPU (what a GPU without its own calibration gets). Writes ``predictor_<gpu>.json`` with GPU
name, versions, date.

``--parts kernels,fit`` (any of kernels, fit, check, held, decode) times only those and writes
the rows, nothing else: one lease's work split over several calls of at most ten minutes on the
same warm machine (``--fit-seed``/``--fit-start`` give each call its own fit architectures), the
files pooled afterwards on any machine.

To refit a profile from saved rows (one run's or several): ``nas profiles refit --rows A.json …``.
``--dry-run``: the ``--gpu`` path without a GPU (rows get the prediction × noise as their
"measured" time), to test the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hardware_profiles import load_profile  # noqa: E402
from nas.latency import op_costs, parse_shape, predict  # noqa: E402
from nas.latency._model import nnls_relative  # noqa: E402
from nas.latency.calibrate import (  # noqa: E402
    SHAPES,
    calibration_section,
    check_summary,
    fit,
    fit_draws,
    kernel_grid,
    measure_models,
    preset_archs,
    random_archs,
    space_archs,
    stacked_archs,
    time_kernels,
    warm,
    write_calibration,
)

CALIBRATION_ROWS = Path(__file__).resolve().parent / "results" / "predictor_rows_h200.json"
from nas.spec import ArchSpec  # noqa: E402

FIT_SEED, CHECK_SEED = 1, 1001
# decode steps of the held-out architectures: one sequence at a short context, a batch at a long one
DECODE_HELD_OUT = ((1, 4096), (8, 16384))
PARTS = ("kernels", "fit", "check", "held", "decode")  # what --parts can time


def as_generator(arch: ArchSpec) -> ArchSpec:
    """``arch`` with the token readout: the decode steps' model generates."""
    return dataclasses.replace(arch, readout="token")


def _dump(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _dry_measure(profile):
    """``measure_models`` without a GPU: the prediction × 1 ± 5 % noise, for ``--dry-run``."""

    rng = random.Random(0)

    def measure(models, *, on_row=None, deadline=float("inf")):
        rows = []
        for arch, shape in models:
            if time.monotonic() > deadline:
                break
            row = {
                "arch": arch.to_dict(),
                "shape": str(shape),
                "ms": predict(arch, shape, profile).median_ms * rng.uniform(0.95, 1.05),
                "iqr_ms": 0.0,
            }
            rows.append(row)
            if on_row:
                on_row(row)
        return rows

    return measure


def run_gpu(args: argparse.Namespace) -> Path:
    from nas.latency.calibrate import environment, require_gpu

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    profile = load_profile(args.profile)
    if args.dry_run:
        sms, env = profile.sm_count, {"gpu": "dry run", "date": time.strftime("%Y-%m-%d")}
        measure = _dry_measure(profile)
    else:
        sms, env, measure = require_gpu(profile), environment(), measure_models
    run = f"{env['date']} {time.strftime('%H:%M:%S')}"
    parts = set(args.parts.split(",")) if args.parts else ({"kernels", "fit", "check"} if args.calibrate else set())
    parts |= {"held", "decode"} if not args.parts else set()
    drawn = {"preset": preset_archs, "space": space_archs}[args.held]
    held_archs = drawn(args.seed, args.archs) if parts & {"held", "decode"} else []
    held = [(a, s) for a in held_archs for s in SHAPES] if "held" in parts else []
    held_decode = [(as_generator(a), b, n) for a in held_archs[: args.decode_archs] for b, n in DECODE_HELD_OUT]
    held_decode = held_decode if "decode" in parts else []
    fit_draw = {"mixed": fit_draws, "random": random_archs}[args.fit_draw]
    fit_archs = fit_draw(args.fit_seed, args.fit_start + args.fit_archs)[args.fit_start :]
    fit_set = [(a, s) for a in fit_archs for s in SHAPES] if "fit" in parts else []
    check_set = (
        [(a, s) for a in stacked_archs(CHECK_SEED, args.check_archs) for s in SHAPES] if "check" in parts else []
    )
    cases = kernel_grid() if "kernels" in parts else []
    data: dict = {
        **env,
        "sm_count": sms,
        "seeds": {"fit": args.fit_seed, "fit_start": args.fit_start, "check": CHECK_SEED, "held_out": args.seed},
        "generators": {
            "fit": {"mixed": "fit_draws (random_arch and space_arch in turn)", "random": "random_arch"}[args.fit_draw],
            "check": "stacked_arch",
            "held_out": f"{args.held}_arch",
        },
        "kernel_rows": [],
        "fit_rows": [],
        "check_rows": [],
        "held_out_rows": [],
        "held_out_decode_rows": [],
        "timeline": {},
    }
    rows_path = out / "predictor_rows.json"

    def mark(what: str) -> None:
        data["timeline"][what] = round(time.monotonic() - start, 1)
        print(f"[{data['timeline'][what]:7.1f} s] {what}", flush=True)
        _dump(rows_path, data)

    if not args.dry_run:
        warm(cases, fit_set + check_set + held, workers=args.workers)
    mark(f"warm-up: {len(cases)} kernels, {len(fit_set) + len(check_set) + len(held)} forwards compiled")

    def keep(key: str):
        def on_row(row: dict) -> None:
            data[key].append({**row, "run": run})
            if len(data[key]) % 25 == 0:
                _dump(rows_path, data)

        return on_row

    if cases:
        time_kernels(cases, on_row=keep("kernel_rows"), deadline=deadline)
        mark("kernel grid timed")
    if fit_set:
        measure(fit_set, on_row=keep("fit_rows"), deadline=deadline)
        mark("fit set measured")
    if check_set:
        measure(check_set, on_row=keep("check_rows"), deadline=deadline)
        mark("check set measured")
    if args.calibrate:
        model, report = fit(data["kernel_rows"], data["fit_rows"], data["check_rows"], sm_count=sms)
        path = write_calibration(profile, calibration_section(model, report, env, sms), out / Path(profile.path).name)
        mark(f"calibration written to {path}: {json.dumps(report.get('check', {}).get('all'))}")
    if held:
        measure(held, on_row=keep("held_out_rows"), deadline=deadline)
        mark("held-out set measured")
    if held_decode and not args.dry_run:
        from nas.latency.calibrate_decode import measure_decodes

        measure_decodes(held_decode, on_row=keep("held_out_decode_rows"), deadline=deadline)
        mark("held-out decode steps measured")
    return rows_path


def _flops(arch: ArchSpec, shape: str) -> float:
    return float(sum(op.flops for op in op_costs(arch, parse_shape(shape))))


def _flops_scales(calibration_rows: Path) -> dict[str, float]:
    """The FLOPs-only baseline: ms per FLOP per shape, fitted (relative error) on the whole-model
    rows the calibration was fitted on."""
    data = json.loads(calibration_rows.read_text())
    rows = [r for key in ("fit_rows", "check_rows", "held_out_rows") for r in data[key] if "ms" in r]
    return {
        shape: nnls_relative(
            [[_flops(ArchSpec.from_dict(r["arch"]), shape)] for r in rows if r["shape"] == shape],
            [r["ms"] for r in rows if r["shape"] == shape],
        )[0]
        for shape in sorted({r["shape"] for r in rows})
    }


def _inside(latencies: list, measured: list[float]) -> float | None:
    """The share of measurements inside the predictions' intervals."""
    inside = sum(lat.low_ms <= m <= lat.high_ms for lat, m in zip(latencies, measured, strict=True))
    return inside / len(measured) if measured else None


def _uncalibrated(profile):
    """``profile`` without its calibration: what a GPU no one calibrated predicts with."""
    return dataclasses.replace(profile, calibrated=type(profile.calibrated)())


def _transfer_check(held: list[dict], profile, source) -> dict:
    """The held-out forwards predicted by ``source``'s calibration transferred to ``profile``'s GPU
    (as ``predict`` does for a GPU with no calibration of its own), per shape and overall: the
    error a transfer makes, and whether its interval covers it."""
    target = _uncalibrated(profile)
    out: dict = {"source": source.name}
    for shape in [*sorted({r["shape"] for r in held}), "all"]:
        rows = [r for r in held if shape in ("all", r["shape"])]
        lats = [predict(ArchSpec.from_dict(r["arch"]), parse_shape(r["shape"]), target, reference=source) for r in rows]
        measured = [r["ms"] for r in rows]
        out[shape] = {
            **check_summary([lat.median_ms for lat in lats], measured),
            "inside_interval": _inside(lats, measured),
            "label": lats[0].label() if lats else None,
        }
    return out


def _decode_check(rows: list[dict], profile, source=None) -> dict:
    """The held-out decode steps per (batch, context) and overall, by ``profile``'s own decode
    model and, given ``source``, by ``source``'s transferred to it."""
    from nas.latency import predict_decode

    out: dict = {}
    keys = sorted({(r["batch"], r["context"]) for r in rows})
    for key in [*keys, "all"]:
        sub = [r for r in rows if key in ("all", (r["batch"], r["context"]))]
        measured = [r["ms"] for r in sub]
        entry = {}
        for name, prof, ref in (("calibrated", profile, "auto"), ("transferred", _uncalibrated(profile), source)):
            if name == "transferred" and source is None:
                continue
            lats = [
                predict_decode(ArchSpec.from_dict(r["arch"]), r["batch"], r["context"], prof, reference=ref)
                for r in sub
            ]
            entry[name] = {
                **check_summary([lat.median_ms for lat in lats], measured),
                "inside_interval": _inside(lats, measured),
                "label": lats[0].label() if lats else None,
            }
        out["all" if key == "all" else f"{key[0]}x{key[1]}"] = entry
    return out


def report(
    rows_path: Path,
    profile_arg: str,
    out: Path,
    calibration_rows: Path = CALIBRATION_ROWS,
    transfer_from: str | None = None,
) -> Path:
    data = json.loads(rows_path.read_text())
    profile = load_profile(profile_arg)
    roofline_profile = dataclasses.replace(
        profile, calibrated=dataclasses.replace(profile.calibrated, kernel_model_json=None, interval=None)
    )
    fit_rows = [r for r in data.get("fit_rows", []) if "ms" in r]  # a lease that only timed held-out rows has none
    flops_scales = _flops_scales(calibration_rows)
    held = [r for r in data["held_out_rows"] if "ms" in r]
    if calibration_rows.resolve() != rows_path.resolve():  # a held-out row must be one the fit never saw
        seen = json.loads(calibration_rows.read_text())
        fitted = {
            json.dumps(r["arch"], sort_keys=True)
            for key in ("fit_rows", "check_rows", "held_out_rows")
            for r in seen[key]
        }
        overlap = sum(json.dumps(r["arch"], sort_keys=True) in fitted for r in held)
        if overlap:
            raise SystemExit(f"{overlap} held-out rows are architectures the calibration was fitted on")
    results: dict = {}
    shapes = [str(s) for s in SHAPES if any(r["shape"] == str(s) for r in held)]
    for shape in [*shapes, "all"]:
        rows = [r for r in held if shape in ("all", r["shape"])]
        archs = [ArchSpec.from_dict(r["arch"]) for r in rows]
        measured = [r["ms"] for r in rows]
        calibrated = [predict(a, parse_shape(r["shape"]), profile) for a, r in zip(archs, rows, strict=True)]
        entry = {
            "calibrated": check_summary([lat.median_ms for lat in calibrated], measured),
            "uncalibrated_roofline": check_summary(
                [
                    predict(a, parse_shape(r["shape"]), roofline_profile, reference=None).median_ms
                    for a, r in zip(archs, rows, strict=True)
                ],
                measured,
            ),
        }
        if all(r["shape"] in flops_scales for r in rows):
            entry["flops_only"] = check_summary(
                [flops_scales[r["shape"]] * _flops(a, r["shape"]) for a, r in zip(archs, rows, strict=True)], measured
            )
        entry["label"] = calibrated[0].label() if calibrated else None
        inside = sum(lat.low_ms <= m <= lat.high_ms for lat, m in zip(calibrated, measured, strict=True))
        entry["inside_interval"] = inside / len(rows) if rows else None
        if profile.calibrated.interval is not None:  # the calibration's own interval, before any widening
            own = sum(
                abs(m / lat.median_ms - 1) <= profile.calibrated.interval  # the interval spans predicted x (1 ± i)
                for lat, m in zip(calibrated, measured, strict=True)
            )
            entry["inside_calibration_interval"] = own / len(rows) if rows else None
        results[shape] = entry
    if transfer_from:
        results["transferred"] = _transfer_check(held, profile, load_profile(transfer_from))
    decode = [r for r in data.get("held_out_decode_rows", []) if "ms" in r]
    if decode:
        results["decode"] = _decode_check(decode, profile, load_profile(transfer_from) if transfer_from else None)
    errors = sum("error" in r for r in data["held_out_rows"])
    gpu = (data.get("gpu") or "gpu").lower().replace("nvidia ", "").replace(" ", "_")
    summary = {
        k: data.get(k)
        for k in ("gpu", "driver", "torch", "triton", "kernels_fingerprint", "date", "sm_count", "seeds", "timeline")
    }
    summary |= {
        "profile": profile.name,
        "calibration_date": profile.calibrated.get("date"),
        "held_out_architectures": len({json.dumps(r["arch"], sort_keys=True) for r in held}),
        "held_out_rows": len(held),
        "held_out_errors": errors,
        "fit_rows": len(fit_rows),
        "check_rows": sum("ms" in r for r in data.get("check_rows", [])),
        "calibration_interval": profile.calibrated.interval,
        "kernel_rows": sum("us" in r for r in data.get("kernel_rows", [])),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"predictor_{gpu}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{data.get('gpu')}  torch {data.get('torch')}  triton {data.get('triton')}  {len(held)} held-out rows "
        f"({summary['held_out_architectures']} architectures, {errors} errors)"
    )
    print(f"{'shape':8s} {'predictor':22s} {'±10%':>6s} {'spearman':>9s} {'median ratio':>13s} {'p95 |err|':>10s}")
    for shape, entry in results.items():
        for name in ("calibrated", "flops_only", "uncalibrated_roofline"):
            if name in entry:
                s = entry[name]
                print(
                    f"{shape:8s} {name:22s} {s['within_10pct']:6.1%} {s['spearman']:9.4f} {s['median_ratio']:13.3f} "
                    f"{s['p95_abs_error']:10.1%}"
                )
    for key, entry in results.get("decode", {}).items():
        for name, s in entry.items():
            print(
                f"decode {key:10s} {name:12s} {s['within_10pct']:6.1%} {s['spearman']:9.4f} {s['median_ratio']:13.3f} "
                f"{s['p95_abs_error']:10.1%}  inside interval {s['inside_interval']:.1%}"
            )
    for key, s in results.get("transferred", {}).items():
        if isinstance(s, dict):
            print(
                f"{key:8s} transferred   {s['within_10pct']:6.1%} {s['spearman']:9.4f} {s['median_ratio']:13.3f} "
                f"{s['p95_abs_error']:10.1%}  inside interval {s['inside_interval']:.1%}"
            )
    print(f"wrote {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="measure (and with --calibrate, calibrate) on this GPU")
    parser.add_argument("--calibrate", action="store_true", help="calibrate the profile first (with --gpu)")
    parser.add_argument("--rows", default=None, help="report from saved rows (predictor_rows.json)")
    parser.add_argument("--profile", default="h200", help="profile name or YAML path to predict with")
    parser.add_argument("--archs", type=int, default=160, help="held-out architectures (× 3 shapes)")
    parser.add_argument("--decode-archs", type=int, default=40, help="of the held-out ones, decode-timed (× 2 shapes)")
    parser.add_argument("--fit-archs", type=int, default=50)
    parser.add_argument("--fit-seed", type=int, default=FIT_SEED, help="seed of the fit set's architectures")
    parser.add_argument(
        "--fit-start", type=int, default=0, help="skip the fit seed's first N architectures (a later call's share)"
    )
    parser.add_argument(
        "--parts",
        default=None,
        help="with --gpu: time only these, comma-separated, of kernels,fit,check,held,decode and write the rows "
        "(no fit, no report): to split one lease's work over several calls; pool the files on any machine",
    )
    parser.add_argument("--check-archs", type=int, default=30)
    parser.add_argument(
        "--fit-draw",
        choices=("mixed", "random"),
        default="mixed",
        help="the fit set's generator: the calibration's (random_arch and space_arch in turn) or random_arch alone "
        "(how predictor_rows_h100.json's fit rows were drawn)",
    )
    parser.add_argument(
        "--held",
        choices=("preset", "space"),
        default="preset",
        help="the held-out generator: candidates of the shipped search spaces, or of random user-written spaces",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=3,
        help="seed of the held-out set (fit: 1, check: 1001; 2 was held out in the first runs and is now fitted on)",
    )
    parser.add_argument("--workers", type=int, default=None, help="compile warm-up processes")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop measuring after this many seconds")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--calibration-rows",
        default=str(CALIBRATION_ROWS),
        help="the rows the calibration was fitted on (FLOPs baseline; held-out rows must not be in it)",
    )
    parser.add_argument("--dry-run", action="store_true", help="with --gpu: no GPU, predictions × noise as times")
    parser.add_argument(
        "--transfer-from", default=None, help="also predict the rows by this profile's calibration transferred"
    )
    args = parser.parse_args()
    unknown = set((args.parts or "").split(",")) - {"", *PARTS}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}; choose from {','.join(PARTS)}")
    if args.gpu and args.parts:
        if args.calibrate:
            parser.error("--parts only collects rows: drop --calibrate and fit the pooled rows afterwards")
        print(f"rows written to {run_gpu(args)}")
    elif args.gpu:
        rows = run_gpu(args)
        profile = str(Path(args.out) / Path(load_profile(args.profile).path).name) if args.calibrate else args.profile
        report(rows, profile, Path(args.out), rows if args.calibrate else Path(args.calibration_rows))
    elif args.rows:
        report(Path(args.rows), args.profile, Path(args.out), Path(args.calibration_rows), args.transfer_from)
    else:
        parser.error("pass --gpu (on a CUDA machine) or --rows PATH")


if __name__ == "__main__":
    main()
