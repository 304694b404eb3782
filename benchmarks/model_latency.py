"""Whole-model forward latency: TritonModel graph replay vs the torch model (eager, CUDA graph,
torch.compile max-autotune), plus the per-candidate scoring overhead and its run-to-run spread.

    PYTHONPATH=$PWD python benchmarks/model_latency.py [--compile] [--cv 5] [--out DIR]

Shapes and targets from the kernel issue: B1×256 d128 4 layers, B8×512 d256 6 layers, B32×1024
d512 8 layers, each a mix of attention / linear attention / MLP-only blocks; TritonModel replay
≤ 0.75× the torch CUDA-graph replay and ≤ 0.2× eager on the two smaller shapes, and not slower
than torch.compile on any. Every variant is timed in the same run on the same random tokens
(bf16 weights for all), rotated over input copies beyond L2 (``_timing.py``). ``--cv N`` measures
one candidate with ``nas.latency.measure`` in N separate processes (target: CV ≤ 2%) and records
the scoring overhead of a fresh candidate once the kernels are warm in Triton's on-disk cache.
Writes ``model_latency_<gpu>.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._timing import copies_for_l2, environment, time_graph, write_results  # noqa: E402
from nas.latency import LatencyCache, measure, memory, parse_shape  # noqa: E402
from nas.models import build, to_triton  # noqa: E402
from nas.spec import ArchSpec, LayerSpec  # noqa: E402

A, L, M = "attention", "linear_attention", "none"
CASES = {  # name: (shape, d_model, mixers); heads = d / 64 so every head dim is 64
    "B1x256 d128 L4": ("1x256", 128, [A, L, A, M]),
    "B8x512 d256 L6": ("8x512", 256, [A, L, M, A, L, M]),
    "B32x1024 d512 L8": ("32x1024", 512, [A, L, A, L, A, L, M, M]),
}
VOCAB = 8192


def arch_for(d: int, mixers: list[str]) -> ArchSpec:
    layers = [
        LayerSpec(m, 0 if m == M else d // 64, "elu+1" if m == L else None, 0 if m == M else 4, 4.0) for m in mixers
    ]
    return ArchSpec(d, layers, VOCAB, VOCAB)


def _eager_us(fn, inputs, reps: int = 30) -> float:
    for x in inputs:
        fn(x)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for x in inputs:
            fn(x)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(inputs))
    return statistics.median(samples)


def bench_case(name: str, compile_: bool) -> dict:
    shape_text, d, mixers = CASES[name]
    shape = parse_shape(shape_text)
    model = build(arch_for(d, mixers), seed=0).cuda().eval()
    torch_bf16 = copy.deepcopy(model).to(torch.bfloat16)  # the peers run the same weights in bf16
    act = memory(model.arch, shape).peak_activation_bytes
    inputs = [
        torch.randint(0, VOCAB, (shape.batch, shape.seq_len), device="cuda") for _ in range(min(8, copies_for_l2(act)))
    ]
    tm = to_triton(model)
    row = {
        "case": name,
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "input_copies": len(inputs),
    }
    with torch.no_grad():
        ref = torch_bf16(inputs[0]).float()
        row["triton_vs_torch_rel_err"] = ((tm(inputs[0]).float() - ref).norm() / ref.norm()).item()
        ours = time_graph([lambda x=x: tm.forward(x) for x in inputs])
        row["ours_graph_us"] = ours
        for key, fn in (
            ("torch_graph_us", lambda: time_graph([lambda x=x: torch_bf16(x) for x in inputs]).median_us),
            ("torch_eager_us", lambda: _eager_us(torch_bf16, inputs)),
        ):
            try:  # a peer that breaks is recorded, not fatal: the other numbers still count
                row[key] = fn()
            except Exception as e:  # noqa: BLE001
                row[key], row[key.replace("_us", "_error")] = None, f"{type(e).__name__}: {str(e)[:300]}"
        if compile_:
            try:
                start = time.perf_counter()
                compiled = torch.compile(torch_bf16, mode="max-autotune")
                compiled(inputs[0])
                row["compile_s"] = time.perf_counter() - start
                row["torch_compile_us"] = _eager_us(compiled, inputs)
            except Exception as e:  # noqa: BLE001
                row["torch_compile_us"], row["torch_compile_error"] = None, f"{type(e).__name__}: {str(e)[:300]}"
    for key, peer in (
        ("ours_vs_torch_graph", "torch_graph_us"),
        ("ours_vs_eager", "torch_eager_us"),
        ("ours_vs_compile", "torch_compile_us"),
    ):
        row[key] = ours.median_us / row[peer] if row.get(peer) else None
    small = name != "B32x1024 d512 L8"

    def met(ratio: float | None, limit: float, applies: bool = True) -> bool | None:
        return None if ratio is None or not applies else ratio <= limit

    row["targets_met"] = {
        "vs_graph<=0.75": met(row["ours_vs_torch_graph"], 0.75, small),
        "vs_eager<=0.2": met(row["ours_vs_eager"], 0.2, small),
        "vs_compile<=1": met(row["ours_vs_compile"], 1.0),
    }
    return row


def _measure_once(cache_dir: str) -> None:
    """Child process of --cv: one measurement of the B1x256 candidate with a private cache."""
    _, d, mixers = CASES["B1x256 d128 L4"]
    torch.empty(1, device="cuda")  # CUDA context first: a search process has one already
    torch.cuda.synchronize()
    start = time.perf_counter()
    lat = measure(
        build(arch_for(d, mixers), seed=0), parse_shape("1x256"), cache=LatencyCache(Path(cache_dir) / "latency.json")
    )
    print(
        json.dumps(
            {
                "median_ms": lat.median_ms,
                "iqr_ms": lat.iqr_ms,
                "notes": dict(lat.notes),
                "seconds": time.perf_counter() - start,
            }
        )
    )


def stability(processes: int) -> dict:
    runs = []
    for _ in range(processes):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, __file__, "--measure-once", tmp], capture_output=True, text=True)
            if out.returncode:
                return {"error": out.stderr[-2000:]}
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = [r["median_ms"] for r in runs]
    cv = statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else 0.0
    return {
        "processes": runs,
        "cv": cv,
        "cv_target_met": cv <= 0.02,
        "scoring_seconds_warm_cache": [r["seconds"] for r in runs[1:]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(max-autotune) (slow)")
    parser.add_argument("--cv", type=int, default=0, help="measure one candidate in this many processes")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    parser.add_argument("--measure-once", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_once:
        _measure_once(args.measure_once)
        return
    env = environment()
    print(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}")
    rows = []
    gpu = (env["gpu"] or "cpu").lower().replace("nvidia ", "").replace(" ", "_")
    path = Path(args.out) / f"model_latency_{gpu}{args.tag}.json"
    for name in CASES:
        row = bench_case(name, args.compile)
        rows.append(row)
        write_results(path, rows, complete=False)  # so far: torch.compile can take minutes per case
        print(
            f"{name:18s} ours {row['ours_graph_us'].median_us:9.1f} µs  torch graph {row['torch_graph_us']}"
            f"  eager {row['torch_eager_us']}  compile {row.get('torch_compile_us')}  ratios graph "
            f"{row['ours_vs_torch_graph']} eager {row['ours_vs_eager']} compile {row['ours_vs_compile']}  "
            f"err {row['triton_vs_torch_rel_err']:.1e}",
            flush=True,
        )
    extra = {"stability": stability(args.cv)} if args.cv else {}
    if extra:
        print(f"stability over {args.cv} processes: {extra['stability']}")
    print(f"wrote {write_results(path, rows, complete=True, **extra)}")


if __name__ == "__main__":
    main()
