"""Programmatic dependent launch (PDL) on a chain of small dependent kernels (issue #15 item 4).

    PYTHONPATH=$PWD python benchmarks/pdl_chain.py [--out F] [--models N [--shapes 1x256,8x1024] [--decode 1x512]]

At 1×256 a TritonModel forward is ~30 small launches, each dependent on the one before, so
the gap between kernels (drain, launch, ramp) is a large part of its time. On sm_90+ a kernel
launched with ``launch_pdl=True`` may be scheduled before the previous one has finished and
waits (``gdc_wait``) only where it reads what that kernel wrote. This measures what that buys
on this GPU before the library's kernels are changed for it: a chain of ``LINKS`` kernels, each
reading the previous one's output (ping-pong buffers), captured in one CUDA graph, in four
variants:

- ``off``: plain launches;
- ``wait``: ``launch_pdl=True``, ``gdc_wait`` first thing in the kernel;
- ``wait_trigger``: also ``gdc_launch_dependents`` right after the wait, so the next kernel's
  programs may become resident (and wait) as soon as every program of this one has started;
- ``trigger_wait_late``: the trigger first, the weight tile loads before the wait (they do not
  depend on the previous kernel), the wait before the activation loads.

With ``--models N``, ``model`` rows follow: the library's own kernels (which launch with PDL on
sm_90+, ``kernels._common.pdl``) in ``TritonModel`` graph replays of ``model_vs_compile.py``'s
architectures (same seed) at ``--shapes``, under each of ``VARIANTS_MODEL``: plain launches, PDL
with the wait only, PDL with the early trigger (``set_pdl(False / "wait" / "early")``), each
checked against the torch model in bf16, and each graph's output against the plain launches' on
the same tokens (a missing wait would show there). ``--decode BxC,...`` adds ``decode`` rows: one
``TritonDecoder`` step (``nas.latency.measure_decode``) under the same three.

Two kernels: a tiled matmul ``[M, d] @ [d, d]`` (bf16, fp32 accumulate, GELU-free) at the
model's small shapes, and a one-program elementwise op (pure launch cost). Every variant's
result is checked against the chain run without a graph; the JSON records median and IQR of
one link (``benchmarks/_timing.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks._timing import time_graph, write_results  # noqa: E402

LINKS = 24
VARIANTS = ("off", "wait", "wait_trigger", "trigger_wait_late")
SHAPES = ((256, 192), (256, 320), (256, 512), (1024, 320), (8192, 320))


@triton.jit
def _mm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    D,
    MODE: tl.constexpr,  # 0 off, 1 wait, 2 wait+trigger, 3 trigger, weights, wait
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if MODE == 1 or MODE == 2:
        tl.extra.cuda.gdc_wait()
    if MODE >= 2:
        tl.extra.cuda.gdc_launch_dependents()
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + ks
        w = tl.load(w_ptr + kk[:, None] * D + cols[None, :], mask=(kk[:, None] < D) & (cols[None, :] < D), other=0.0)
        if MODE == 3 and k0 == 0:
            tl.extra.cuda.gdc_wait()
        x = tl.load(x_ptr + rows[:, None] * D + kk[None, :], mask=(rows[:, None] < M) & (kk[None, :] < D), other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(
        y_ptr + rows[:, None] * D + cols[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < D),
    )


@triton.jit
def _ew_kernel(x_ptr, y_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    if MODE == 1 or MODE == 2:
        tl.extra.cuda.gdc_wait()
    if MODE >= 2:
        tl.extra.cuda.gdc_launch_dependents()
    if MODE == 3:
        tl.extra.cuda.gdc_wait()
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n).to(tl.float32)
    tl.store(y_ptr + o, (x * 0.5 + 0.25).to(y_ptr.dtype.element_ty), mask=o < n)


def _chain(kind: str, mode: int, bufs: list[torch.Tensor], w: torch.Tensor | None):
    pdl = mode > 0

    def run() -> torch.Tensor:
        a, b = bufs
        for _ in range(LINKS):
            if kind == "mm":
                M, D = a.shape
                grid = (triton.cdiv(M, 64), triton.cdiv(D, 64))
                _mm_kernel[grid](
                    a, w, b, M, D, MODE=mode, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, launch_pdl=pdl
                )
            else:
                _ew_kernel[(1,)](a, b, a.numel(), MODE=mode, BLOCK=1024, launch_pdl=pdl)
            a, b = b, a
        return a

    return run


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    a, e = a.float(), e.float()
    return float("nan") if not torch.isfinite(a).all() else ((a - e).norm() / e.norm()).item()


# (name, set_pdl's argument): plain launches; PDL with the wait only (the next launch scheduled
# when the kernel ends); PDL with the early trigger (scheduled once all its programs started)
VARIANTS_MODEL = (("plain", False), ("wait", "wait"), ("early", "early"))


def decode_row(index: int, arch, batch: int, context: int) -> dict:
    """One decoding step (``nas.latency.measure_decode``: checked against the torch model, then
    graph-replayed) under each of ``VARIANTS_MODEL``, a fresh latency cache for each."""
    import tempfile

    from benchmarks.model_vs_compile import describe
    from kernels._common import set_pdl
    from nas.latency import LatencyCache, measure_decode
    from nas.models import build

    model = build(arch, seed=0).cuda().eval()
    row: dict = dict(part="decode", arch_index=index, arch=describe(arch), batch=batch, context=context)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, use in VARIANTS_MODEL:
                set_pdl(use)
                lat = measure_decode(model, batch, context, cache=LatencyCache(Path(tmp) / f"{name}.json"))
                row[f"{name}_us"] = dict(median_us=lat.median_ms * 1e3, iqr_us=lat.iqr_ms * 1e3)
        finally:
            set_pdl(None)
    for name, _ in VARIANTS_MODEL[1:]:
        row[f"{name}_over_plain"] = row[f"{name}_us"]["median_us"] / row["plain_us"]["median_us"]
    return row


def model_row(index: int, arch, shape_text: str) -> dict:
    from benchmarks.model_vs_compile import describe, model_and_inputs
    from kernels._common import set_pdl
    from nas.models import to_triton

    model, expected_model, inputs = model_and_inputs(arch, shape_text)
    row: dict = dict(part="model", arch_index=index, arch=describe(arch), spec=arch.to_dict(), shape=shape_text)
    with torch.no_grad():
        expected = expected_model(inputs[0])
        tm = to_triton(model)
        outs = {}
        try:
            for name, use in VARIANTS_MODEL:
                set_pdl(use)
                outs[name] = tm(inputs[0]).clone()
                row[f"{name}_rel_err"] = _rel(outs[name], expected)
                row[f"{name}_us"] = time_graph([lambda x=x: tm.forward(x) for x in inputs])
                replay = tm.capture(inputs[0].clone())
                row[f"{name}_replay_vs_plain_eager"] = _rel(replay(), outs["plain"])
        finally:
            set_pdl(None)
    for name, _ in VARIANTS_MODEL[1:]:
        row[f"{name}_over_plain"] = row[f"{name}_us"].median_us / row["plain_us"].median_us
    row["correct"] = all(v <= 3e-2 for k, v in row.items() if k.endswith("_rel_err")) and all(
        v <= 1e-3 for k, v in row.items() if k.endswith("_vs_plain_eager")
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/pdl_chain_h200.json")
    parser.add_argument("--models", type=int, default=0, help="TritonModel rows over this many architectures")
    parser.add_argument("--seed", type=int, default=7, help="model_vs_compile.py's architecture seed")
    parser.add_argument("--skip-chain", action="store_true")
    parser.add_argument("--shapes", default="1x256,8x1024", help="model rows' shapes, BxT, comma-separated")
    parser.add_argument("--decode", default="", help="decode rows' batch x context, e.g. 1x512,16x512")
    args = parser.parse_args()
    rows = []
    cases = [] if args.skip_chain else [("mm", M, D) for M, D in SHAPES] + [("ew", 1024, 0)]
    for kind, M, D in cases:
        gen = torch.Generator(device="cuda").manual_seed(M + D)
        if kind == "mm":
            x0 = torch.randn(M, D, generator=gen, device="cuda").bfloat16()
            w = (torch.randn(D, D, generator=gen, device="cuda") / D**0.5).bfloat16()
        else:
            x0, w = torch.randn(M, generator=gen, device="cuda").bfloat16(), None
        expected = None
        for variant in VARIANTS:
            mode = VARIANTS.index(variant)
            bufs = [x0.clone(), torch.empty_like(x0)]
            out = _chain(kind, mode, bufs, w)()
            torch.cuda.synchronize()
            if expected is None:
                expected = out.float().clone()
            err = ((out.float() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
            bufs[0].copy_(x0)
            t = time_graph([_chain(kind, mode, bufs, w)], reps=50, per_replay=10)
            row = dict(
                kind=kind,
                M=M,
                d=D,
                variant=variant,
                links=LINKS,
                rel_err_vs_off=err,
                per_link_us=dict(median_us=t.median_us / LINKS, iqr_us=t.iqr_us / LINKS),
            )
            print(row, flush=True)
            rows.append(row)
            write_results(args.out, rows, note="per_link_us: one link of the chain; each row's graph holds 10 chains")
    if args.models:
        from benchmarks.model_vs_compile import architectures

        for index, arch in enumerate(architectures(args.seed, args.models)):
            for shape_text in filter(None, args.shapes.split(",")):
                row = model_row(index, arch, shape_text)
                print({k: v for k, v in row.items() if k != "spec"}, flush=True)
                rows.append(row)
                write_results(args.out, rows, note="model rows: TritonModel graph replay, PDL variants vs plain")
            for text in filter(None, args.decode.split(",")):
                if arch.readout != "token":
                    continue
                batch, context = (int(v) for v in text.split("x"))
                row = decode_row(index, arch, batch, context)
                print(row, flush=True)
                rows.append(row)
                write_results(args.out, rows, note="decode rows: one TritonDecoder step, PDL variants vs plain")
        summary = {}
        for key in (f"{name}_over_plain" for name, _ in VARIANTS_MODEL[1:]):
            for s in sorted({r["shape"] for r in rows if r.get("part") == "model"}):
                v = sorted(r[key] for r in rows if r.get("part") == "model" and r["shape"] == s)
                if v:
                    summary[f"{key} {s}"] = dict(median=v[len(v) // 2], min=v[0], max=v[-1])
        note = "model rows: TritonModel graph replay; decode rows: one TritonDecoder step; PDL variants vs plain"
        write_results(args.out, rows, summary=summary, note=note)


if __name__ == "__main__":
    main()
