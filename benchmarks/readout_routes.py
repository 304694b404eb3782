"""Which route is faster for a normed readout: the fused kernel with the norm folded in, or cuBLAS?

``linear(x, W, b, norm="rmsnorm")`` on [M, K] bf16 rows into N outputs, timed by both routes in the
same run at every (M, N, K) of the grid below: ``fused`` is the fused Triton kernel summing the
norm's row statistics in its main loop (``set_route("triton")``), ``cublas`` the norm's own launch
then ``torch.addmm`` (``set_route("cublas")``). ``rule_takes`` is what ``kernels.linear.configs``
picks for the shape on sm_90 (``prefers_cublas(..., norm=True)``, ``fuses_norm``).

    python benchmarks/readout_routes.py --out benchmarks/results/readout_routes_h100.json

Needs a CUDA GPU. Timing: ``nas.latency.calibrate.graph_us`` (20 calls in one CUDA graph, median of
15 replays), the timer of the kernel grid the latency model is fitted on, so both routes are timed
as a calibration times them; three times per route (their spread stands in for an IQR), four inputs
in turn. Rows are written after each shape. Not recorded: which cuBLAS kernel ``torch.addmm`` ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROWS = (1, 8, 32, 256, 2048, 8192, 16384)
OUTPUTS = (4096, 8192, 16384, 32768, 50272)
WIDTHS = (32, 64, 128)


def rule_takes(m: int, n: int, k: int) -> str:
    """The route ``kernels.linear.linear`` takes for this normed readout on sm_90."""
    from kernels.linear import configs

    bucket = configs.m_bucket(m)
    if configs.prefers_cublas((9, 0), bucket, n, k, None, False, norm=True):
        return "norm then cublas"
    return "fused, norm folded in" if configs.fuses_norm(bucket, k) else "norm then fused"


def time_routes(m: int, n: int, k: int) -> dict[str, list[float]]:
    """µs per call by each route, three graph timings each."""
    import torch

    from kernels.linear import linear
    from kernels.linear.triton import set_route
    from nas.latency.calibrate import graph_us

    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    turn = [0]

    def call() -> object:
        turn[0] = (turn[0] + 1) % len(xs)
        return linear(xs[turn[0]], w, b, norm="rmsnorm", out=out)

    runs = {}
    try:
        for name, route in (("fused", "triton"), ("cublas", "cublas")):
            set_route(route)
            runs[name] = [graph_us(call) for _ in range(3)]
    finally:
        set_route(None)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("readout_routes.json"), help="JSON to write")
    args = parser.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("readout_routes: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": dt.date.today().isoformat(),
        "rows": [],
    }
    for m in ROWS:
        for n in OUTPUTS:
            for k in WIDTHS:
                runs = time_routes(m, n, k)
                fused, cublas = statistics.median(runs["fused"]), statistics.median(runs["cublas"])
                row = {"M": m, "N": n, "K": k, "fused_us": fused, "cublas_us": cublas}
                row |= {"fused_runs_us": runs["fused"], "cublas_runs_us": runs["cublas"]}
                row |= {"cublas_speedup": fused / cublas, "rule_takes": rule_takes(m, n, k)}
                result["rows"].append(row)
                print(m, n, k, f"{fused:.1f}", f"{cublas:.1f}", row["rule_takes"], flush=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
