"""benchmarks/readout_routes.py without a GPU: the committed H100 side by side was timed under
today's route rule, and that rule sends a normed readout to cuBLAS where cuBLAS measured faster."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import readout_routes as rr

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "readout_routes_h100.json"


def test_the_committed_routes_follow_todays_rule_and_its_cublas_shapes_measured_faster():
    rows = json.loads(RESULTS.read_text())["rows"]
    assert {(r["M"], r["N"], r["K"]) for r in rows} == {
        (m, n, k) for m in rr.ROWS for n in rr.OUTPUTS for k in rr.WIDTHS
    }
    assert all(r["rule_takes"] == rr.rule_takes(r["M"], r["N"], r["K"]) for r in rows), "rerun it after a rule change"
    sides = {r["rule_takes"] for r in rows}
    assert {"norm then cublas", "fused, norm folded in"} <= sides  # both sides of the rule are in the grid
    wide = [r for r in rows if r["N"] >= 32768]  # the readouts NORM_FUSED_WIDE_N moves whatever M
    assert wide and all(r["rule_takes"] == "norm then cublas" for r in wide)
    slower = [r for r in wide if r["cublas_us"] >= r["fused_us"]]
    assert not slower, slower
