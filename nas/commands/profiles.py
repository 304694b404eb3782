"""``nas profiles``: list the hardware profiles, show one, or calibrate one on this GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from nas.commands._common import Parser, console, positive_int, write_raw


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
    cal.add_argument("--fit-archs", type=positive_int, default=60, help="random architectures fitted on (× 3 shapes)")
    cal.add_argument("--check-archs", type=positive_int, default=40, help="architectures held out as the check")
    cal.add_argument(
        "--decode",
        action="store_true",
        help="fit only the decode-step model (decode_latency's prediction) and keep the forward's calibration",
    )
    cal.add_argument(
        "--decode-archs", type=positive_int, default=36, help="random architectures for --decode (× 5 shapes)"
    )


def run(args: argparse.Namespace) -> None:
    from hardware_profiles import list_profiles, load_profile

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
            "datasheet ratios, not checked on this GPU; roofline: datasheet peaks only. kernels: whether the "
            "fit timed the kernels this checkout runs (if not, the interval is doubled)."
        )
    elif args.action == "calibrate" and args.decode:
        from nas.latency.calibrate_decode import calibrate_decode

        path, report = calibrate_decode(
            args.profile, args.out, archs=args.decode_archs, rows_out=args.rows, on_progress=console.print
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
