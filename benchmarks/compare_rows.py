"""Whole-model forward times of two calibration runs, architecture by architecture.

    python benchmarks/compare_rows.py OLD.json NEW.json --out benchmarks/results/F.json

Both files are ``nas profiles calibrate --rows`` output from the same GPU. The fit and check sets
are drawn from fixed seeds, so the two runs measure the same (architecture, shape) pairs: the
ratio new / old of each pair is what the kernels' change between the runs did to that forward
(the other pairs' ratios, of architectures the change does not touch, say how much two runs
differ by themselves). Rows are split (``--by``) by whether any layer's head dim is zero-padded to
a kernel's (``kernels.attention.padded_head_dim``), whether any layer is identity-map linear
attention, or any linear attention at all, per shape: count, median, min and max of new / old.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.attention import padded_head_dim  # noqa: E402


def padded(arch: dict) -> bool:
    d = arch["d_model"]
    return any(
        layer["mixer"] != "none" and padded_head_dim(d // layer["heads"]) != d // layer["heads"]
        for layer in arch["layers"]
    )


def identity(arch: dict) -> bool:
    return any(
        layer["mixer"] == "linear_attention" and layer.get("feature_map") == "identity" for layer in arch["layers"]
    )


def linear(arch: dict) -> bool:
    return any(layer["mixer"] == "linear_attention" for layer in arch["layers"])


SPLITS = {
    "padded": (padded, "padded", "not padded"),
    "identity": (identity, "identity", "no identity"),
    "linear": (linear, "linear attention", "no linear attention"),
}


def compare(old: dict, new: dict, by: str = "padded") -> dict:
    test, yes, no = SPLITS[by]

    def key(r: dict) -> str:
        return json.dumps(r["arch"], sort_keys=True) + "|" + r["shape"]

    before = {key(r): r["ms"] for part in ("fit_rows", "check_rows") for r in old.get(part, []) if "ms" in r}
    groups: dict[str, list[float]] = {}
    pairs = []
    for part in ("fit_rows", "check_rows"):
        for r in new.get(part, []):
            if "ms" not in r or key(r) not in before:
                continue
            ratio = r["ms"] / before[key(r)]
            kind = yes if test(r["arch"]) else no
            pairs.append({"shape": r["shape"], by: kind == yes, "old_ms": before[key(r)], "new_ms": r["ms"]})
            for g in (kind, f"{kind} {r['shape']}"):
                groups.setdefault(g, []).append(ratio)
    summary = {
        g: {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
        for g, v in sorted(groups.items())
    }
    return {"summary": summary, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--out", required=True)
    parser.add_argument("--by", choices=sorted(SPLITS), default="padded", help="how rows are split")
    args = parser.parse_args(argv)
    old, new = (json.loads(Path(p).read_text()) for p in (args.old, args.new))
    result = compare(old, new, args.by)
    meta = {
        k: {"old": old.get(k), "new": new.get(k)} for k in ("gpu", "torch", "triton", "kernels_fingerprint", "date")
    }
    Path(args.out).write_text(json.dumps({"runs": meta, **result}, indent=1) + "\n")
    for g, s in result["summary"].items():
        print(f"{g:24s} n={s['n']:3d} new/old median {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
