"""``nas profiles``: list the hardware profiles, show one, or calibrate one on this GPU."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from nas.commands._common import Parser, console, positive_float, positive_int, write_raw


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profiles", help="hardware profiles")
    psub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    psub.add_parser("list", help="list shipped profiles")
    show = psub.add_parser("show", help="show one profile")
    show.add_argument("name", help="a shipped profile name (nas profiles list) or a YAML path")
    cal = psub.add_parser("calibrate", help="fit the latency model on this GPU and write it into the profile")
    cal.add_argument("--profile", default=None, help="profile name or YAML path (default: the one listing this GPU)")
    cal.add_argument("--out", default=None, help="where to write the calibrated profile (default: over the profile)")
    cal.add_argument("--rows", default=None, metavar="JSON", help="also save every timing row there (to refit later)")
    cal.add_argument(
        "--fit-archs",
        type=positive_int,
        default=60,
        help="architectures fitted on (× 3 shapes): random stacks and random spaces' candidates in turn",
    )
    cal.add_argument("--check-archs", type=positive_int, default=40, help="architectures held out as the check")
    cal.add_argument(
        "--budget-s",
        type=positive_float,
        default=None,
        help="stop timing after this many seconds and fit on what was timed (default: 540; 240 with --decode)",
    )
    cal.add_argument(
        "--decode",
        action="store_true",
        help="fit only the decode-step model (decode_latency's prediction) and keep the forward's calibration",
    )
    cal.add_argument(
        "--decode-archs", type=positive_int, default=36, help="random architectures for --decode (× 5 shapes)"
    )
    refit = psub.add_parser(
        "refit", help="fit the latency model from saved timing rows (calibrate --rows) of one or several runs"
    )
    refit.add_argument(
        "--rows", nargs="+", required=True, metavar="JSON", help="calibrate --rows files of one GPU kind"
    )
    refit.add_argument("--profile", default=None, help="profile name or YAML path (default: the one listing the GPU)")
    refit.add_argument("--out", default=None, help="where to write the refitted profile (default: over the profile)")


def run(args: argparse.Namespace) -> None:
    from hardware_profiles import list_profiles, load_profile

    if args.action == "refit":
        _refit(args)
        return

    if args.action == "list":
        from nas.latency import prediction_status

        table = Table(title="hardware profiles: how latency is predicted for each (interval at the checked shapes)")
        for col in ("name", "GPU", "memory", "forward", "±", "kernels", "decode", "± ", "decode kernels"):
            table.add_column(col)
        for name in list_profiles():
            p = load_profile(name)
            forward, decode = prediction_status(p), prediction_status(p, decode=True)
            table.add_row(
                name,
                p.description.split(",")[0],
                "-" if p.memory_gb is None else f"{p.memory_gb:g} GB",
                forward.label,
                f"{forward.interval:.0%}",
                forward.fingerprint or "-",
                decode.label,
                f"{decode.interval:.0%}",
                decode.fingerprint or "-",
            )
        console.print(table)
        console.print(
            "calibrated: fitted on that GPU (nas profiles calibrate); transferred: another GPU's fit rescaled by "
            "datasheet ratios (its interval measured between GPUs of one compute capability where it says checked, "
            "a guess where it says unchecked); roofline: datasheet peaks only. kernels: whether the "
            "fit timed the kernels this checkout runs (if not, the interval is doubled)."
        )
    elif args.action == "calibrate" and args.decode:
        from nas.latency.calibrate_decode import calibrate_decode

        path, report = calibrate_decode(
            args.profile,
            args.out,
            archs=args.decode_archs,
            rows_out=args.rows,
            on_progress=console.print,
            **({} if args.budget_s is None else {"budget_s": args.budget_s}),
        )
        for context, s in report.get("cv", {}).items():
            console.print(
                f"decode {context:>6s}: {s['within_10pct']:.1%} within ±10 %, Spearman {s['spearman']:.4f}, "
                f"95th pct |error| {s['p95_abs_error']:.1%} ({s['n']} steps, cross-validated by architecture)"
            )
        console.print(f"wrote {path}")
    elif args.action == "calibrate":
        from nas.latency.calibrate import calibrate

        path, report = calibrate(
            args.profile,
            args.out,
            fit_archs=args.fit_archs,
            check_archs=args.check_archs,
            on_progress=console.print,
            rows_out=args.rows,
            **({} if args.budget_s is None else {"budget_s": args.budget_s}),
        )
        for shape, s in report.get("check", {}).items():
            console.print(
                f"check {shape:7s}: {s['within_10pct']:.1%} within ±10 %, Spearman {s['spearman']:.4f}, "
                f"median ratio {s['median_ratio']:.3f}, 95th pct |error| {s['p95_abs_error']:.1%} "
                f"({s['n']} forwards the fit never saw)"
            )
        console.print(f"wrote {path}")
    else:
        p = load_profile(args.name)
        write_raw(Path(p.path).read_text())


ROWS_KEYS = ("gpu", "sm_count", "kernels_fingerprint", "date", "kernel_rows", "fit_rows")


def _pooled_rows(paths: Sequence[str]) -> dict[str, Any]:
    """The timing rows of several ``nas profiles calibrate --rows`` files, pooled: every kernel row,
    and every whole-model row tagged with the run it came from (``fit`` then predicts each run from
    the others) and, where the file names it, the generator that drew it (each generator's
    held-out errors bound the interval on their own). CalibrationError names the file and what is
    wrong: unreadable, not a rows file, another GPU, SM count or kernels than the first file's."""
    from nas.latency.calibrate import CalibrationError

    pooled: dict[str, Any] = {"kernel_rows": [], "model_rows": [], "dates": [], "runs": {}}
    first: dict[str, Any] | None = None
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise CalibrationError(f"--rows {path}: cannot read it ({e.strerror or e})") from None
        except ValueError as e:
            raise CalibrationError(f"--rows {path}: not JSON ({e})") from None
        missing = [k for k in ROWS_KEYS if not isinstance(data, dict) or k not in data]
        if missing:
            raise CalibrationError(f"--rows {path}: not a nas profiles calibrate --rows file (no {', '.join(missing)})")
        first = first or data
        for key in ("gpu", "sm_count", "kernels_fingerprint"):
            if data[key] != first[key]:
                raise CalibrationError(
                    f"--rows {path}: {key} {data[key]!r}, but {paths[0]} has {first[key]!r}: pool the rows of one "
                    f"GPU kind timed with the same kernels"
                )
        run = f"{Path(path).name} {data['date']}"
        named = data.get("generators") if isinstance(data.get("generators"), dict) else {}
        rows = [
            {"run": run, **({"generator": str(named[part])} if named.get(part) else {}), **row}
            for key, part in (("fit_rows", "fit"), ("check_rows", "check"), ("held_out_rows", "held_out"))
            for row in data.get(key) or ()
        ]
        runs = {row["run"] for row in rows}
        if twice := runs & set(pooled["runs"]):
            raise CalibrationError(
                f"--rows {path}: run {sorted(twice)[0]!r} is in {pooled['runs'][sorted(twice)[0]]} too; "
                f"give each timing run once"
            )
        pooled["runs"].update(dict.fromkeys(runs, path))
        pooled["kernel_rows"] += data["kernel_rows"]
        pooled["model_rows"] += rows
        pooled["dates"].append(str(data["date"]))
    assert first is not None
    pooled.update(
        {k: first.get(k, "") for k in ("gpu", "driver", "torch", "triton", "kernels_fingerprint", "sm_count")}
    )
    pooled["date"] = max(pooled.pop("dates"))
    return pooled


def _refit(args: argparse.Namespace) -> None:
    """``nas profiles refit --rows A.json [B.json ...]``: the kernel model fitted on the pooled rows
    of several timing runs (several leases or machines of one GPU kind), written into the profile."""
    from hardware_profiles import detect_profile, load_profile
    from nas.latency.calibrate import CalibrationError, calibration_section, fit, write_calibration

    pooled = _pooled_rows(args.rows)
    profile = load_profile(args.profile) if args.profile else detect_profile(pooled["gpu"])
    if profile is None:
        raise CalibrationError(
            f"no shipped profile lists {pooled['gpu']!r}, the GPU the rows were timed on; pass --profile PATH of one"
        )
    if not profile.lists(pooled["gpu"]) or profile.sm_count != pooled["sm_count"]:
        raise CalibrationError(
            f"--profile {profile.name} describes {', '.join(profile.device_names)} with {profile.sm_count} SMs; the "
            f"rows were timed on {pooled['gpu']} with {pooled['sm_count']}"
        )
    model, report = fit(pooled["kernel_rows"], pooled["model_rows"], sm_count=pooled["sm_count"])
    env = {k: pooled[k] for k in ("gpu", "driver", "torch", "triton", "kernels_fingerprint", "date")}
    path = write_calibration(
        profile, calibration_section(model, report, env, pooled["sm_count"]), args.out or profile.path
    )
    runs = len(pooled["runs"])
    console.print(
        f"fitted on {len(pooled['kernel_rows'])} kernel rows and {len(pooled['model_rows'])} forwards from {runs} "
        f"run(s) on {pooled['gpu']}: interval ±{report['interval']:.1%}",
        soft_wrap=True,
    )
    spans = report.get("interval_by_generator") or {}
    if len(spans) > 1:
        console.print(
            "interval by held-out set: " + ", ".join(f"{name} ±{width:.1%}" for name, width in spans.items()),
            soft_wrap=True,
            markup=False,
        )
    lines = [(f"cross-validated {shape}", s) for shape, s in (report.get("cv") or {}).items()]
    lines += [(f"run {run} from the others", s["all"]) for run, s in (report.get("across_runs") or {}).items()]
    for name, s in lines:
        console.print(
            f"{name}: {s['within_10pct']:.1%} within ±10 %, "
            f"95th pct |error| {s['p95_abs_error']:.1%} ({s['n']} forwards)",
            soft_wrap=True,
            markup=False,
        )
    console.print(f"wrote {path}")
