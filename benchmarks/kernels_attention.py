"""Attention-kernel benchmark: the Triton flash-attention forward vs torch SDPA (flash backend),
and the one-launch chunked causal linear attention vs fla-core's ``chunk_linear_attn``.

    PYTHONPATH=$PWD python benchmarks/kernels_attention.py [--out DIR] [--warm]

Attention: causal, bf16, B·L = 16384 tokens, H·D = 2048, L ∈ {1024, 2048, 4096}, D ∈ {64, 128}.
Both sides read q, k, v as strided views of one fused projection ``[B, L, 3·H·D]`` (the model's
layout; SDPA's flash kernel takes such views as they are). SDPA runs under
``sdpa_kernel(FLASH_ATTENTION)``; the kernels the profiler saw for the forced and the default
call are recorded. With RoPE: ours rotates in-kernel, the peer is ``apply_rope`` + SDPA.

Linear attention: causal, bf16, B = 8, H = 16, D = 64, L ∈ {256, 512, 1024, 4096}, and the
mixers of the whole-model benchmark's candidates (``model_latency.py``: B1×256 d128 with 4 heads,
B8×512 d256 with 8 heads, B32×1024 d512 with 8 heads). Identity map (unnormalized, q·D^-1/2) is
exactly fla's ``chunk_linear_attn(scale=D^-1/2, normalize=False)``; fla gets contiguous
``[B, L, H, D]`` tensors (its native layout), ours the projection views. elu+1 (normalized)
compares with torch ``elu+1`` then fla ``normalize=True``, the way a model would use fla for it.
Without fla the peer is the torch chunked form the model trains with (``nas.models.mixers``), and
the JSON says why. ``--sweep`` also times every launch config of ours per case (``linear_sweep``).

Every implementation's output is checked against the peer's before its time counts. Times are
CUDA-graph replays over input copies rotated past L2 (``benchmarks/_timing.py``): median and IQR
per call. ``speedup`` = peer median / ours. Writes ``kernels_attention.json`` into ``--out``
(default benchmarks/results). ``--warm`` only compiles and autotunes every case (run it beside
the GPU tests to fill Triton's cache; fla's tuning is redone in the timed run, not cached).
"""

from __future__ import annotations

import os

os.environ.setdefault("FLA_CACHE_RESULTS", "0")  # fla tunes in the timed process, not from a cache

import argparse  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmarks._timing import Timing, copies_for_l2, time_graph, write_results  # noqa: E402
from kernels.attention import triton as fa  # noqa: E402
from kernels.linear_attention import triton as la  # noqa: E402
from nas.models.mixers import FEATURE_MAP_FNS, apply_rope, causal_linear_attention, rope_tables  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.bfloat16
ATTN_LENGTHS, ATTN_HEAD_DIMS, ATTN_TOKENS, ATTN_WIDTH = (1024, 2048, 4096), (64, 128), 16384, 2048
# (B, H, D, L): the fla-style sweep over lengths, then the model benchmark's linear-attention mixers.
LIN_CASES = tuple((8, 16, 64, L) for L in (256, 512, 1024, 4096)) + (
    (1, 4, 32, 256),
    (8, 8, 32, 512),
    (32, 8, 64, 1024),
)
ATTN_TARGET = 0.9  # ours ≥ 0.9× SDPA throughput at L ≥ 1024
LIN_TARGET_SHORT, LIN_TARGET_LONG = 3.0, 1.0  # ≥ 3× fla at L ≤ 1024, not slower at 4096
TOLERANCE = 2e-2  # bf16 outputs of two implementations: relative Frobenius distance


@dataclass(frozen=True)
class Row:
    op: str
    case: str
    impl: str
    timing: Timing
    timed_as: str  # "graph", or "eager (why)" where a peer's host code could not be captured
    tflops: float | None
    peer: str | None  # impl this row is compared with
    speedup: float | None  # peer median / this median
    target: float | None
    met: bool | None
    rel_err_vs_peer: float | None
    config: str  # the autotuned launch config (ours)


def _time_eager(fns: Sequence[Callable[[], object]], reps: int = 50) -> Timing:
    """Median/IQR µs of one call from CUDA events around each call, for code graphs cannot hold."""
    samples = []
    for i in range(reps + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fns[i % len(fns)]()
        end.record()
        end.synchronize()
        if i >= 5:
            samples.append(start.elapsed_time(end) * 1e3)
    q1, med, q3 = statistics.quantiles(samples, n=4)
    return Timing(med, q1, q3, q3 - q1, len(samples))


def _time(fns: Sequence[Callable[[], object]]) -> tuple[Timing, str]:
    try:
        return time_graph(fns), "graph"
    except Exception as err:  # noqa: BLE001 - a peer's capture failure must not end the run
        torch.cuda.synchronize()
        return _time_eager(fns), f"eager ({type(err).__name__}: {err})"[:200]


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.float().reshape(expected.shape), expected.float()
    return float("nan") if not torch.isfinite(a).all() else ((a - e).norm() / e.norm()).item()


def _views(qkv: torch.Tensor, H: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, L, _ = qkv.shape
    return tuple(qkv.view(B, L, 3, H, -1).permute(2, 0, 3, 1, 4))  # [B, H, L, D] strided views


def _inputs(B: int, L: int, H: int, D: int) -> list[torch.Tensor]:
    """Fresh random projections ``[B, L, 3·H·D]``, enough copies to rotate past L2."""
    n = copies_for_l2(B * L * 3 * H * D * DTYPE.itemsize)
    return [torch.randn(B, L, 3 * H * D, device="cuda", dtype=DTYPE) for _ in range(n)]


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _sdpa_flash(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)


def _kernels_run(fn: Callable[[], object]) -> list[str]:
    """Names of the attention kernels the profiler sees for one call of ``fn``."""
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the backend name is a report detail, not worth the run
        return [f"profiler failed: {type(err).__name__}: {err}"[:200]]
    keys = ("flash", "fmha", "cudnn", "attention", "efficient", "sdpa")
    return sorted({e.key for e in prof.key_averages() if any(k in e.key.lower() for k in keys)})


def _row(
    op: str,
    case: str,
    impl: str,
    fns: Sequence[Callable[[], object]],
    flop: float | None = None,
    peer: Row | None = None,
    target: float | None = None,
    rel_err: float | None = None,
    config: object = "",
) -> Row:
    timing, how = _time(fns)
    speedup = peer.timing.median_us / timing.median_us if peer else None
    row = Row(
        op,
        case,
        impl,
        timing,
        how,
        flop / timing.median_us / 1e6 if flop else None,
        peer.impl if peer else None,
        speedup,
        target,
        None if target is None else bool(speedup >= target and rel_err is not None and rel_err <= TOLERANCE),
        rel_err,
        str(config or ""),
    )
    print(
        f"{case} {impl}: {timing.median_us:.1f} µs (IQR {timing.iqr_us:.1f})"
        + (f", {speedup:.2f}x {peer.impl}" if peer else ""),
        flush=True,
    )  # a run cut short still shows its rows
    return row


def attention_rows(warm: bool) -> tuple[list[Row], dict]:
    rows: list[Row] = []
    backends: dict = {}
    for D in ATTN_HEAD_DIMS:
        for L in ATTN_LENGTHS:
            B, H = ATTN_TOKENS // L, ATTN_WIDTH // D
            copies = _inputs(B, L, H, D)
            views = [_views(c, H) for c in copies]
            tables = rope_tables(L, D, device=copies[0].device, dtype=DTYPE)  # the model's tables: q's dtype
            ours = [partial(fa.flash_attention_qkv, c, H, causal=True) for c in copies]
            ours_rope = [partial(fa.flash_attention_qkv, c, H, causal=True, rope=tables) for c in copies]
            if warm:
                ours[0](), ours_rope[0]()
                continue
            sdpa = [partial(_sdpa_flash, *v) for v in views]
            sdpa_rope = [partial(_sdpa_rope, *v, *tables) for v in views]
            if not backends:
                backends = {
                    "forced_flash": _kernels_run(sdpa[0]),
                    "default": _kernels_run(partial(F.scaled_dot_product_attention, *views[0], is_causal=True)),
                }
            case = f"causal D={D} L={L} B={B} H={H}"
            flop = fa.flops(B, H, L, D, causal=True)
            expected = sdpa[0]().transpose(1, 2)  # [B, L, H, D]
            err = _rel_err(ours[0](), expected)
            peer = _row("attention", case, "torch-sdpa-flash", sdpa, flop)
            rows += [
                peer,
                _row(
                    "attention",
                    case,
                    "triton",
                    ours,
                    flop,
                    peer,
                    ATTN_TARGET,
                    err,
                    fa.last_tuned_config(copies[0].device, D),
                ),
            ]
            err = _rel_err(ours_rope[0](), sdpa_rope[0]().transpose(1, 2))
            peer = _row("attention", case + " rope", "torch-rope+sdpa-flash", sdpa_rope, flop)
            rows += [
                peer,
                _row(
                    "attention",
                    case + " rope",
                    "triton-rope-fused",
                    ours_rope,
                    flop,
                    peer,
                    None,
                    err,
                    fa.last_tuned_config(copies[0].device, D),
                ),
            ]
            del copies, views
    return rows, backends


def _fla() -> tuple[Callable | None, str]:
    try:
        import fla
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as err:  # noqa: BLE001 - any import failure means: time the torch fallback
        return None, f"not importable: {type(err).__name__}: {err}"
    return chunk_linear_attn, f"fla-core {fla.__version__}"


def _torch_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str) -> torch.Tensor:
    """LinearAttention.forward between the projections, as the model trains (``[B, H, L, D]`` views in)."""
    phi = FEATURE_MAP_FNS[feature_map]
    normalize = feature_map != "identity"
    qf = phi(q) if normalize else phi(q) * q.shape[-1] ** -0.5
    o = causal_linear_attention(qf, phi(k), v, normalize=normalize)
    return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _fla_call(
    chunk_linear_attn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str
) -> torch.Tensor:
    """fla on contiguous ``[B, L, H, D]``; elu+1 applied in torch first (fla takes mapped q, k)."""
    if feature_map == "identity":
        return chunk_linear_attn(q, k, v, scale=q.shape[-1] ** -0.5, normalize=False)[0]
    phi = FEATURE_MAP_FNS[feature_map]
    return chunk_linear_attn(phi(q), phi(k), v, scale=1.0, normalize=True)[0]


def _sweep(copies: list[torch.Tensor], H: int, feature_map: str) -> dict[str, float | str]:
    """Median µs of ours under each tiling offered to the autotuner at this head dim and each
    sequence split; a config whose output strays from the autotuned launch's is reported, not timed."""
    D = copies[0].shape[-1] // (3 * H)
    out: dict[str, float] = {}
    chunks = -(-copies[0].shape[1] // 64)
    seen = dict.fromkeys(
        la.ChunkConfig(c.chunk, min(c.block_v, D), c.num_warps, c.num_stages, split=s)
        for c in la.chunk_configs(copies[0].device, D)
        for s in (1, 2, 4, 8, 16)
        if s <= chunks
    )
    expected = la.linear_attention_qkv(copies[0], H, feature_map=feature_map).float()  # the autotuned launch
    for cfg in seen:
        name = f"{cfg.chunk}x{cfg.block_v} w{cfg.num_warps} s{cfg.num_stages} split{cfg.split}"
        try:
            err = _rel_err(la.linear_attention_qkv(copies[0], H, feature_map=feature_map, config=cfg), expected)
            if not err <= TOLERANCE:
                out[name] = f"wrong result: relative error {err:.2e} against the autotuned launch"
                continue
            out[name] = time_graph(
                [partial(la.linear_attention_qkv, c, H, feature_map=feature_map, config=cfg) for c in copies], reps=20
            ).median_us
        except Exception as err:  # noqa: BLE001 - one failing config is a finding, not the end of the sweep
            out[name] = f"{type(err).__name__}: {err}"[:200]
    return out


def linear_attention_rows(warm: bool, sweep: bool = False) -> tuple[list[Row], str, list[dict]]:
    chunk_linear_attn, fla_note = _fla()
    rows: list[Row] = []
    sweeps: list[dict] = []
    for B, H, D, L in LIN_CASES:
        copies = _inputs(B, L, H, D)
        views = [_views(c, H) for c in copies]
        natives = [tuple(t.transpose(1, 2).contiguous() for t in v) for v in views]  # fla's [B, L, H, D]
        for feature_map in ("identity", "elu+1"):
            ours = [partial(la.linear_attention_qkv, c, H, feature_map=feature_map) for c in copies]
            peers = [("torch-chunked", [partial(_torch_chunked, *v, feature_map) for v in views])]
            if chunk_linear_attn is not None:
                peers.insert(
                    0,
                    (
                        "fla-chunk_linear_attn",
                        [partial(_fla_call, chunk_linear_attn, *n, feature_map) for n in natives],
                    ),
                )
            if warm:
                ours[0]()
                for _, fns in peers:
                    fns[0]()
                continue
            case = f"causal {feature_map} D={D} L={L} B={B} H={H}"
            target = LIN_TARGET_SHORT if L <= 1024 else LIN_TARGET_LONG
            mine = ours[0]()
            peer_rows = []
            for name, fns in peers:
                try:
                    peer_rows.append((_row("linear_attention", case, name, fns), fns[0]()))
                except Exception as err:  # noqa: BLE001 - a failing peer is reported, the next one used
                    fla_note += f"; {name} failed at L={L}: {type(err).__name__}: {err}"[:300]
            rows += [r for r, _ in peer_rows]
            peer, expected = peer_rows[0]  # fla when it ran, else the torch chunked form
            rows.append(
                _row(
                    "linear_attention",
                    case,
                    "triton",
                    ours,
                    None,
                    peer,
                    target,
                    _rel_err(mine, expected),
                    la.last_tuned_config(copies[0].device, D),
                )
            )
            if sweep:
                sweeps.append({"case": case, "median_us": _sweep(copies, H, feature_map)})
        del copies, views, natives
    return rows, fla_note, sweeps


def _print(rows: list[Row]) -> None:
    head = (
        f"{'op':<17}{'case':<40}{'impl':<24}{'median µs':>11}{'IQR µs':>9}{'TFLOP/s':>9}{'speedup':>9}"
        f"{'target':>8}{'met':>5}{'err':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "NO")
        print(
            f"{r.op:<17}{r.case:<40}{r.impl:<24}{r.timing.median_us:>11.1f}{r.timing.iqr_us:>9.1f}"
            f"{_fmt(r.tflops, '.0f'):>9}{_fmt(r.speedup, '.2f'):>9}{_fmt(r.target, '.1f'):>8}{met:>5}"
            f"{_fmt(r.rel_err_vs_peer, '.1e'):>9}"
        )


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def main(
    out_dir: str | Path = RESULTS, *, warm: bool = False, only: str | None = None, sweep: bool = False
) -> Path | None:
    """Run every case (of ``only`` the one op when given); print the table and write
    ``out_dir/kernels_attention.json`` (None with ``warm``)."""
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/kernels_attention.py needs a CUDA device")
    torch.manual_seed(0)
    errors: list[str] = []
    attn, backends, lin, fla_note, sweeps = [], {}, [], "", []
    if only in (None, "attention"):
        try:
            attn, backends = attention_rows(warm)
        except Exception as err:  # noqa: BLE001 - report it and still time the other op
            errors.append(f"attention: {type(err).__name__}: {err}"[:500])
    if only in (None, "linear_attention"):
        try:
            lin, fla_note, sweeps = linear_attention_rows(warm, sweep)
        except Exception as err:  # noqa: BLE001
            errors.append(f"linear_attention: {type(err).__name__}: {err}"[:500])
    if errors:
        print("\n".join(errors))
    if warm:
        return None
    rows = attn + lin
    _print(rows)
    targets = [r for r in rows if r.target is not None]
    print(
        f"targets met: {sum(bool(r.met) for r in targets)}/{len(targets)}; SDPA kernels: {backends}; peer: {fla_note}"
    )
    return write_results(
        Path(out_dir) / "kernels_attention.json",
        rows,
        dtype=str(DTYPE),
        sdpa_kernels=backends,
        fla=fla_note,
        errors=errors,
        only=only,
        linear_sweep=sweeps,
        targets={
            "attention": f"triton >= {ATTN_TARGET}x torch-sdpa-flash throughput, L >= 1024",
            "linear_attention": f"triton >= {LIN_TARGET_SHORT}x the peer at L <= 1024, "
            f">= {LIN_TARGET_LONG}x at L = 4096 (both maps; identity is fla's op "
            "exactly, elu+1 is torch φ then fla normalize=True)",
        },
        targets_met=f"{sum(bool(r.met) for r in targets)}/{len(targets)}",
        summary=_summary(targets),
    )


def _summary(targets: list[Row]) -> dict:
    """Per op and (linear attention) feature map: cases, met, worst speedup."""
    groups: dict[str, list[Row]] = {}
    for r in targets:
        key = r.op if r.op == "attention" else f"{r.op} {r.case.split()[1]}"
        groups.setdefault(key, []).append(r)
    return {
        k: {"cases": len(v), "met": sum(bool(r.met) for r in v), "worst_speedup": min(r.speedup for r in v)}
        for k, v in groups.items()
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="folder for kernels_attention.json")
    parser.add_argument("--warm", action="store_true", help="only compile and autotune every case")
    parser.add_argument("--only", choices=("attention", "linear_attention"), help="time one op only")
    parser.add_argument("--sweep", action="store_true", help="also time every linear-attention launch config")
    args = parser.parse_args()
    main(args.out, warm=args.warm, only=args.only, sweep=args.sweep)
