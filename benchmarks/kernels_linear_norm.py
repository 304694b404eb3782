"""Fused linear, norm and conv kernels vs their torch peers on the GPU, at NAS shapes.

    PYTHONPATH=$PWD python benchmarks/kernels_linear_norm.py [--out DIR] [--quick] [--sweep]

Cases (bf16, tokens 2048-16384, d 128-1024; ``--quick`` keeps the smallest and largest):

- ``linear_gelu``: the MLP's first layer, x ``[tokens, d]`` → ``[tokens, 4d]`` with bias and GELU:
  ``kernels.linear.linear(x, W, b, activation="gelu")`` vs cuBLAS ``F.linear(x, W, b)`` followed
  by ``F.gelu``. Target (issue 6): ours ≤ 0.8× the peer's time.
- ``layer_norm`` / ``rms_norm``: the pre-norm block's residual add and norm, ``(y, h)`` from
  ``layer_norm(x, w, b, residual=r)`` vs ``h = x + r`` then ``F.layer_norm(h)`` (``F.rms_norm``).
- ``conv``: the model's short causal depthwise conv over qkv (``[B, T, 3d]``, K = 4): ours vs
  its torch path, ``Conv1d(groups=C, padding=K−1)`` on the transposed view, first T outputs.
  For norm and conv the issue sets no target; "met" there means not slower than the peer.

Each case first checks ours and the peer against an fp32 reference on the same random inputs
(‖out − ref‖ / ‖ref‖, recorded), then times both in the same run with
``benchmarks/_timing.time_graph``: CUDA-graph replay, rotating through enough input copies
(x, weights, bias) to exceed twice the L2, median and IQR. The linear kernel is autotuned
before capture; the tiling it chose is recorded. Writes ``kernels_linear_norm.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks._timing import Timing, copies_for_l2, environment, time_graph, write_results
from kernels.conv import causal_depthwise_conv
from kernels.conv import reference as conv_ref
from kernels.linear import LinearConfig, last_tuned_config, linear
from kernels.linear import configs as linear_configs
from kernels.linear import reference as linear_ref
from kernels.norm import layer_norm, rms_norm
from kernels.norm import reference as norm_ref

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_FILE = "kernels_linear_norm.json"
TOKENS = (2048, 8192, 16384)
WIDTHS = (128, 256, 512, 1024)
MLP_RATIO = 4
CONV_K = 4
CONV_T = 2048  # sequence length of the conv's [B, T, C] input; B = tokens / T
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")
TARGETS = {"linear_gelu": 0.8, "layer_norm": 1.0, "rms_norm": 1.0, "conv": 1.0}  # ours / peer, at most
MAX_REL_ERR = 1e-2  # bf16 outputs vs the fp32 reference: either side above this is not timed


@dataclass(frozen=True)
class Row:
    op: str
    shape: str
    ours: Timing
    peer: Timing
    ratio: float  # ours / peer median
    target: float
    met: bool
    ours_rel_err: float
    peer_rel_err: float
    work: str  # TFLOP/s (matmul) or TB/s of the fewest bytes (streaming ops), ours | peer
    config: str  # the tiling the linear kernel's tuner picked ("" elsewhere)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _time_pair(
    ours: Callable[[dict], object], peer: Callable[[dict], object], inputs: list[dict[str, torch.Tensor]]
) -> tuple[Timing, Timing]:
    """Both implementations over the same rotated input copies, ours first, in this run."""
    return (time_graph([lambda c=c: ours(c) for c in inputs]), time_graph([lambda c=c: peer(c) for c in inputs]))


def _copies(make: Callable[[], dict[str, torch.Tensor]], bytes_per_copy: int) -> list[dict[str, torch.Tensor]]:
    return [make() for _ in range(copies_for_l2(bytes_per_copy))]


def _row(
    op: str, shape: str, timings: tuple[Timing, Timing], errs: tuple[float, float], work: str, config: str = ""
) -> Row:
    ours, peer = timings
    ratio = ours.median_us / peer.median_us
    return Row(op, shape, ours, peer, ratio, TARGETS[op], ratio <= TARGETS[op], *errs, work, config)


def _linear_inputs(tokens: int, d: int) -> list[dict[str, torch.Tensor]]:
    n = MLP_RATIO * d

    def make() -> dict[str, torch.Tensor]:
        return {
            "x": torch.randn(tokens, d, device=DEVICE, dtype=DTYPE),
            "w": (torch.randn(n, d, device=DEVICE) / d**0.5).to(DTYPE),
            "b": torch.randn(n, device=DEVICE, dtype=DTYPE),
        }

    return _copies(make, (tokens * d + n * d + n + tokens * n) * 2)


def _cfg_name(config: LinearConfig | None) -> str:
    if config is None:
        return ""
    extra = "".join(f" {name}" for name in ("tma", "flatten", "warp_specialize") if getattr(config, name))
    extra += "" if config.persistent else " per-tile"
    return f"{config.block_m}x{config.block_n}x{config.block_k} w{config.num_warps} s{config.num_stages}{extra}"


def _bench_linear(tokens: int, d: int) -> Row:
    n = MLP_RATIO * d
    inputs = _linear_inputs(tokens, d)
    c = inputs[0]
    expected = linear_ref.linear(c["x"], c["w"], c["b"], activation="gelu")
    ours = linear(c["x"], c["w"], c["b"], activation="gelu")  # autotunes this shape, outside capture
    config = last_tuned_config()
    errs = (_rel_err(ours, expected), _rel_err(F.gelu(F.linear(c["x"], c["w"], c["b"])), expected))
    timings = _time_pair(
        lambda c: linear(c["x"], c["w"], c["b"], activation="gelu"),
        lambda c: F.gelu(F.linear(c["x"], c["w"], c["b"])),
        inputs,
    )
    tflops = [2 * tokens * n * d / (t.median_us * 1e-6) / 1e12 for t in timings]
    return _row(
        "linear_gelu",
        f"[{tokens}, {d}] x [{n}, {d}]^T",
        timings,
        errs,
        f"{tflops[0]:.0f} | {tflops[1]:.0f} TFLOP/s",
        _cfg_name(config),
    )


def _sweep_linear(tokens: int, d: int) -> dict:
    """Median µs of linear + bias + GELU under every ``configs.SWEEP`` tiling (None: failed to
    compile or launch), and two diagnostics: ours without the activation (the tuned tiling), and
    cuBLAS ``F.linear`` alone, which bound what the GELU epilogue and the separate pass cost."""
    inputs = _linear_inputs(tokens, d)
    c = inputs[0]
    expected = linear_ref.linear(c["x"], c["w"], c["b"], activation="gelu")
    us: dict[str, float | None] = {}
    for config in linear_configs.SWEEP:
        try:
            err = _rel_err(linear(c["x"], c["w"], c["b"], activation="gelu", config=config), expected)
            if err > MAX_REL_ERR:
                raise SystemExit(f"sweep {_cfg_name(config)} at [{tokens}, {d}]: relative error {err:.2e}")
            us[_cfg_name(config)] = time_graph(
                [
                    lambda c=c, config=config: linear(c["x"], c["w"], c["b"], activation="gelu", config=config)
                    for c in inputs
                ]
            ).median_us
        except RuntimeError as e:  # triton's OutOfResources and compile errors derive from RuntimeError
            print(f"sweep {_cfg_name(config)} at [{tokens}, {d}]: {type(e).__name__}: {str(e)[:120]}")
            us[_cfg_name(config)] = None
    linear(c["x"], c["w"], c["b"])  # tunes outside capture (shares the GELU key's choice when cached)
    us["tuned, no activation"] = time_graph([lambda c=c: linear(c["x"], c["w"], c["b"]) for c in inputs]).median_us
    us["cuBLAS F.linear only"] = time_graph([lambda c=c: F.linear(c["x"], c["w"], c["b"]) for c in inputs]).median_us
    return {"shape": f"[{tokens}, {d}] x [{MLP_RATIO * d}, {d}]^T", "median_us": us}


def _print_sweep(sweeps: list[dict]) -> None:
    names = list(sweeps[0]["median_us"])
    print(f"{'linear+gelu sweep (median us)':<36}" + "".join(f"{n[:14]:>15}" for n in names))
    for s in sweeps:
        cells = ("-" if v is None else f"{v:.1f}" for v in s["median_us"].values())
        print(f"{s['shape']:<36}" + "".join(f"{c:>15}" for c in cells))


def _bench_norm(op: str, tokens: int, d: int) -> Row:
    rms = op == "rms_norm"

    def make() -> dict[str, torch.Tensor]:
        rows = {name: torch.randn(tokens, d, device=DEVICE, dtype=DTYPE) for name in ("x", "r")}
        return {
            **rows,
            "w": 1 + 0.1 * torch.randn(d, device=DEVICE, dtype=DTYPE),
            "b": 0.1 * torch.randn(d, device=DEVICE, dtype=DTYPE),
        }

    def ours(c: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if rms:
            return rms_norm(c["x"], c["w"], residual=c["r"])
        return layer_norm(c["x"], c["w"], c["b"], residual=c["r"])

    def peer(c: dict) -> tuple[torch.Tensor, torch.Tensor]:
        h = c["x"] + c["r"]
        return (F.rms_norm(h, (d,), c["w"], 1e-5) if rms else F.layer_norm(h, (d,), c["w"], c["b"], 1e-5)), h

    inputs = _copies(make, 4 * tokens * d * 2)  # x, r read; y, h written
    c = inputs[0]
    expected = (
        norm_ref.rms_norm(c["x"], c["w"], residual=c["r"])
        if rms
        else norm_ref.layer_norm(c["x"], c["w"], c["b"], residual=c["r"])
    )[0]
    errs = (_rel_err(ours(c)[0], expected), _rel_err(peer(c)[0], expected))
    timings = _time_pair(ours, peer, inputs)
    moved = 4 * tokens * d * 2  # the fewest bytes: x, r in; y, h out (the peer moves 5·M·N)
    tbps = [moved / (t.median_us * 1e-6) / 1e12 for t in timings]
    return _row(op, f"[{tokens}, {d}] + residual", timings, errs, f"{tbps[0]:.2f} | {tbps[1]:.2f} TB/s")


def _bench_conv(tokens: int, d: int) -> Row:
    B, T, C = max(1, tokens // CONV_T), min(tokens, CONV_T), 3 * d

    def make() -> dict[str, torch.Tensor]:
        w = (torch.randn(C, CONV_K, device=DEVICE) / CONV_K**0.5).to(DTYPE)
        return {
            "x": torch.randn(B, T, C, device=DEVICE, dtype=DTYPE),
            "w": w,
            "w3": w[:, None, :].contiguous(),
            "b": torch.randn(C, device=DEVICE, dtype=DTYPE),
        }

    def peer(c: dict) -> torch.Tensor:  # nas.models.mixers._HeadsMixer's conv path
        return F.conv1d(c["x"].transpose(1, 2), c["w3"], c["b"], padding=CONV_K - 1, groups=C)[..., :T].transpose(1, 2)

    inputs = _copies(make, 2 * B * T * C * 2)
    c = inputs[0]
    expected = conv_ref.causal_depthwise_conv(c["x"], c["w"], c["b"])
    errs = (_rel_err(causal_depthwise_conv(c["x"], c["w"], c["b"]), expected), _rel_err(peer(c), expected))
    timings = _time_pair(lambda c: causal_depthwise_conv(c["x"], c["w"], c["b"]), peer, inputs)
    tbps = [2 * B * T * C * 2 / (t.median_us * 1e-6) / 1e12 for t in timings]
    return _row("conv", f"[{B}, {T}, {C}] K={CONV_K}", timings, errs, f"{tbps[0]:.2f} | {tbps[1]:.2f} TB/s")


def _print_table(rows: list[Row]) -> None:
    print(
        f"{'op':<12} {'shape':<28} {'ours us':>9} {'iqr':>6} {'peer us':>9} {'iqr':>6} {'ratio':>6} "
        f"{'target':>6} {'met':>4}  {'ours | peer':<24} config"
    )
    for r in rows:
        print(
            f"{r.op:<12} {r.shape:<28} {r.ours.median_us:9.1f} {r.ours.iqr_us:6.1f} {r.peer.median_us:9.1f} "
            f"{r.peer.iqr_us:6.1f} {r.ratio:6.2f} {r.target:6.2f} {'yes' if r.met else 'no':>4}  {r.work:<24} "
            f"{r.config}"
        )


def main(out_dir: str | Path = RESULTS_DIR, *, quick: bool = False, sweep: bool = False) -> Path:
    """Run every case, print the table, write ``out_dir/kernels_linear_norm.json``; returns its path.
    ``sweep`` also times every ``configs.SWEEP`` tiling at the smallest and largest token counts."""
    if not torch.cuda.is_available():
        raise SystemExit("kernels_linear_norm: needs a CUDA GPU (the kernels are timed compiled, not interpreted)")
    tokens_list = (TOKENS[0], TOKENS[-1]) if quick else TOKENS
    widths = (WIDTHS[0], WIDTHS[-1]) if quick else WIDTHS
    torch.manual_seed(0)
    sweeps = [_sweep_linear(tokens, d) for tokens in (TOKENS[0], TOKENS[-1]) for d in widths] if sweep else []
    if sweeps:
        _print_sweep(sweeps)
    rows: list[Row] = []
    for bench in (
        _bench_linear,
        lambda t, d: _bench_norm("layer_norm", t, d),
        lambda t, d: _bench_norm("rms_norm", t, d),
        _bench_conv,
    ):
        for tokens in tokens_list:
            for d in widths:
                row = bench(tokens, d)
                if max(row.ours_rel_err, row.peer_rel_err) > MAX_REL_ERR:
                    raise SystemExit(
                        f"{row.op} {row.shape}: relative error ours {row.ours_rel_err:.2e}, "
                        f"peer {row.peer_rel_err:.2e} > {MAX_REL_ERR}: not timing a wrong result"
                    )
                rows.append(row)
                torch.cuda.empty_cache()
    _print_table(rows)
    summary = {
        op: {
            "target": TARGETS[op],
            "cases": sum(r.op == op for r in rows),
            "met": sum(r.met for r in rows if r.op == op),
            "worst_ratio": max(r.ratio for r in rows if r.op == op),
        }
        for op in TARGETS
    }
    for op, s in summary.items():
        print(
            f"{op}: target ratio <= {s['target']} met in {s['met']}/{s['cases']} cases (worst {s['worst_ratio']:.2f})"
        )
    env = environment()
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}")
    return write_results(
        Path(out_dir) / RESULT_FILE,
        [asdict(r) for r in rows],
        dtype=str(DTYPE),
        mlp_ratio=MLP_RATIO,
        conv_k=CONV_K,
        summary=summary,
        linear_sweep=sweeps,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(RESULTS_DIR), help="folder for kernels_linear_norm.json")
    parser.add_argument("--quick", action="store_true", help="smallest and largest tokens and d only")
    parser.add_argument("--sweep", action="store_true", help="also time every linear tiling in configs.SWEEP")
    args = parser.parse_args()
    print(f"wrote {main(args.out, quick=args.quick, sweep=args.sweep)}")
