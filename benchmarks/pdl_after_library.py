"""The launch of the kernel after a library kernel: the linear's cuBLAS route (issue #15 items 2, 4).

    PYTHONPATH=$PWD python benchmarks/pdl_after_library.py [--out F] [--archs 20] [--shapes 1x256,8x1024]
                                                           [--stop-s S]

The cuBLAS route runs cuBLAS's matmul and then our epilogue pass (activation, residual). That pass
can be launched with programmatic dependent launch like every other kernel of ours, or plain. This
times the forms side by side, each in its own CUDA graph with the replays interleaved
(``_timing.time_graphs``), by setting ``kernels.linear.triton.after_library`` for the capture:

- ``rule``: the library's own ``kernels._common.after_library`` (what a user gets);
- ``pdl``: ``pdl`` (wait; early trigger inside ``pdl_early`` scopes);
- ``plain``: no PDL;
- ``trigger_only``: a plain launch whose kernel still lets the next launch start early.

Linear rows (the cuBLAS-routed shapes of ``default_peers.py``'s grid) have cuBLAS ``F.linear`` +
the torch epilogue beside them; model rows are ``TritonModel`` forwards of ``model_vs_compile.py``'s
architectures (seed 7), every form's output checked bitwise against ``pdl``'s. The file is
rewritten after every row; ``--stop-s`` is a guard (reported) for a device call's limit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._timing import copies_for_l2, time_graphs, write_results  # noqa: E402

LINEAR_SHAPES = (
    (777, 200, 800, "gelu"),
    (777, 384, 1536, "gelu"),
    (777, 200, 200, "gelu"),
    (777, 4096, 1024, "gelu"),
    (777, 96, 4096, "gelu"),
    (3000, 200, 200, "gelu"),
    (3000, 384, 1536, "gelu"),
    (3000, 4096, 1024, "gelu"),
    (16384, 200, 200, "gelu"),
    (3000, 200, 800, "none+residual"),
    (777, 1024, 4096, "none+residual"),
)


def forms() -> dict:
    import kernels._common as common

    def trigger_only(t):
        keywords = common.pdl(t)
        return {**keywords, "launch_pdl": False} if keywords else {}

    return {"rule": common.after_library, "pdl": common.pdl, "plain": lambda t: {}, "trigger_only": trigger_only}


def under(form, fn):
    """``fn`` with the cuBLAS route's epilogue launched by ``form`` (at capture time)."""
    import kernels._common as common
    import kernels.linear.triton as lt

    def run():
        lt.after_library = form
        try:
            return fn()
        finally:
            lt.after_library = common.after_library

    return run


def linear_row(M: int, K: int, N: int, epilogue: str, variants: dict) -> dict:
    from kernels.linear import last_route, linear

    act = epilogue.removesuffix("+residual")
    residual = epilogue.endswith("+residual")
    n = min(copies_for_l2((M * K + N * K + M * N * (2 if residual else 1)) * 2), 16)
    sets = [
        {
            "x": torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
            "w": (torch.randn(N, K, device="cuda") / K**0.5).bfloat16(),
            "b": torch.randn(N, device="cuda", dtype=torch.bfloat16),
            "r": torch.randn(M, N, device="cuda", dtype=torch.bfloat16) if residual else None,
        }
        for _ in range(n)
    ]

    def ours(s):
        return linear(s["x"], s["w"], s["b"], activation=None if act == "none" else act, residual=s["r"])

    def peer(s):
        y = F.linear(s["x"], s["w"], s["b"])
        y = F.gelu(y) if act == "gelu" else y
        return y + s["r"] if s["r"] is not None else y

    ours(sets[0])
    route = last_route()
    sides = {name: [under(form, partial(ours, s)) for s in sets] for name, form in variants.items()}
    t = time_graphs({**sides, "peer": [partial(peer, s) for s in sets]}, reps=40)
    row = {"part": "linear", "M": M, "K": K, "N": N, "epilogue": epilogue, "route": route}
    row |= {f"{k}_us": {"median_us": v.median_us, "iqr_us": v.iqr_us} for k, v in t.items()}
    return row


def model_row(index: int, arch, shape: str, variants: dict) -> dict:
    from benchmarks.model_vs_compile import describe, model_and_inputs
    from nas.models import to_triton

    model, _, inputs = model_and_inputs(arch, shape)
    with torch.no_grad():
        tm = to_triton(model)
        outs = {name: under(form, lambda: tm(inputs[0]))().float() for name, form in variants.items()}
        sides = {name: [under(form, lambda x=x: tm.forward(x)) for x in inputs] for name, form in variants.items()}
        t = time_graphs(sides, reps=30)
    row = {"part": "model", "arch_index": index, "arch": describe(arch), "shape": shape}
    row["same_output"] = all(torch.equal(o, outs["pdl"]) for o in outs.values())
    row |= {f"{k}_us": {"median_us": v.median_us, "iqr_us": v.iqr_us} for k, v in t.items()}
    for name in variants:
        row[f"{name}_over_pdl"] = t[name].median_us / t["pdl"].median_us
    return row


def summary(rows: list[dict], variants) -> dict:
    out = {}
    lin = [r for r in rows if r["part"] == "linear"]
    if lin:
        out["linear"] = {
            "rows": len(lin),
            **{
                f"{v}_at_or_under_peer": sum(r[f"{v}_us"]["median_us"] <= r["peer_us"]["median_us"] for r in lin)
                for v in variants
            },
        }
    for shape in dict.fromkeys(r["shape"] for r in rows if r["part"] == "model"):
        mine = [r for r in rows if r["part"] == "model" and r["shape"] == shape]
        out[shape] = {"archs": len(mine), "all_same_output": all(r["same_output"] for r in mine)}
        for v in variants:
            ratios = [r[f"{v}_over_pdl"] for r in mine]
            out[shape][f"{v}_over_pdl"] = {"median": statistics.median(ratios), "max": max(ratios)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "pdl_after_library_h200.json")
    )
    parser.add_argument("--archs", type=int, default=20)
    parser.add_argument("--shapes", default="1x256,8x1024")
    parser.add_argument("--stop-s", type=float, default=None, help="guard: start no row after this many seconds")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("pdl_after_library.py times GPU kernels: no CUDA device here")
    from benchmarks.model_vs_compile import architectures

    variants = forms()
    start, rows, stopped = time.monotonic(), [], None

    def save(complete: bool) -> None:
        write_results(
            args.out,
            rows,
            summary=summary(rows, variants),
            stopped_by_guard=stopped,
            complete=complete,
            timing="CUDA-graph replay; every form and the peer in their own graphs, replays interleaved",
        )

    jobs = [partial(linear_row, *s, variants) for s in LINEAR_SHAPES]
    archs = architectures(7, args.archs)
    jobs += [
        partial(model_row, i, a, shape, variants)
        for shape in filter(None, args.shapes.split(","))
        for i, a in enumerate(archs)
    ]
    for k, job in enumerate(jobs):
        if args.stop_s is not None and time.monotonic() - start > args.stop_s:
            stopped = f"--stop-s {args.stop_s}: {len(jobs) - k} rows not run"
            print(stopped, flush=True)
            break
        rows.append(job())
        print({k2: (round(v["median_us"], 2) if isinstance(v, dict) else v) for k2, v in rows[-1].items()}, flush=True)
        save(False)
    save(stopped is None)


if __name__ == "__main__":
    main()
