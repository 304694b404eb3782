"""Our kernels against the peer a user gets by default, on grids with odd sizes (issue #15).

    PYTHONPATH=$PWD python benchmarks/default_peers.py [--out DIR] [--quick] [--only OP] [--list] [--gpu-lock FILE]

The search ranks mixers by the speed of our kernels, so each is timed beside what a user would
deploy without trying, in the same process, as CUDA-graph replays over inputs rotated past L2
(``benchmarks/_timing.py``: median and IQR per call; ours and the peer's replays interleaved, so
clock or thermal drift during a row falls on both):

- ``attention``: causal ``kernels.attention.flash_attention_qkv`` (by its route: the Triton
  kernel or SDPA, recorded per row) vs ``F.scaled_dot_product_attention(is_causal=True)`` with its
  **default** backend (on an H200 with torch 2.11: cuDNN's wgmma flash kernel), both on strided
  views of one fused projection ``[B, L, 3·H·D]``; the forced FLASH_ATTENTION backend (FA2) is
  timed beside it, not instead. The profiler's kernel names for each peer are recorded per row.
  Target: ≥ 1.0× at L ≥ 1024, ≥ 0.9× below. ``--rope`` adds, per row, the model's case (RoPE):
  the route, the Triton kernel forced (rotation fused), and the model's ``apply_rope`` + default
  SDPA as the peer (FA2 is then not timed).
- ``linear``: ``kernels.linear.linear`` with its epilogue (bias + gelu / silu / relu, optional
  residual; the route it took per shape, fused Triton kernel or cuBLAS + epilogue pass, is
  recorded) vs cuBLAS ``F.linear`` + the separate torch ops. Target ≥ 1.0×. Beside them: cuBLAS's
  matmul alone and cuBLASLt's fused bias + GELU (tanh form) / ReLU epilogue, as floors.
- ``linear_attention``: ``linear_attention_qkv`` vs fla-core's ``chunk_linear_attn`` on its
  native contiguous ``[B, L, H, D]`` (identity map: ≥ 1.0×; elu+1 and relu: ≥ 1.5× torch φ + fla
  normalized). Identity rows also time the two-pass forward forced (``set_route("two_pass")``).
  Without fla importable the rows say so and are not scored.

Every implementation's output is checked against the peer's (relative Frobenius distance ≤ 2e-2)
before its time counts. A row that misses its target records ``miss_by`` (target − speed-up).
Attention and linear rows also record our call's kernel names and ``same_kernels_as_peer``: where
the route hands the shape to the peer's own kernels (SDPA; cuBLAS with nothing left to fuse), the
speed-up is 1 up to timing noise, and the summary counts those rows apart from the misses on
kernels of ours (``misses_on_our_kernels``). Each row also times the peer twice, in two graphs
in the same rotation (``--no-control`` skips it): that ratio is the noise of a tie on that row,
and the summary gives its 95th percentile per op and how many misses fall within it.
- ``linear_fp8``: the fp8 route of a linear layer (``kernels.linear.fp8``: activations quantized
  per token, fp8 matmul, bias) at M ≥ 4096 vs bf16 cuBLAS ``F.linear`` (target ≥ 1.4×, issue
  #51), with ``torch._scaled_mm`` on the same fp8 operands timed beside it (sm_90+).

``--list`` prints the grids and exits (no GPU needed). Writes ``default_peers_<gpu>.json``, one
part per op (``--only`` rewrites its op's part and keeps the others).
``--gpu-lock FILE`` takes the lock file of ``model_vs_compile.py --procs``
(``/tmp/model_vs_compile_gpu0.lock``) through each shape, so the grid runs while that script's
compiles (CPU work) go on, and neither times while the other uses the GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._timing import RESULTS, GpuLock, copies_for_l2, device_slug, time_graph, time_graphs, write_part  # noqa: E402

DTYPE = torch.bfloat16
TOLERANCE = 2e-2

# (B, H, L, D): L over the lengths (odd ones included), D 32-128, B·H from 4 to 512.
ATTN_LENGTHS = (333, 1000, 1024, 2048, 4097, 8192)
ATTN_BH = ((1, 4), (3, 5), (16, 12), (32, 16))
ATTN_DIMS = (32, 64, 128)
ATTN_QUICK = ((3, 5, 1000, 64), (3, 5, 1000, 128), (2, 7, 333, 64), (1, 3, 4097, 128), (16, 12, 2048, 64))
# (M, K, N, epilogue): M 777-16384, K and N over the sizes, GELU everywhere, the other
# epilogues at three shapes.
LINEAR_MS = (777, 3000, 16384)
LINEAR_KN = ((96, 384), (200, 800), (256, 1024), (384, 1536), (1024, 4096), (4096, 1024), (200, 200), (96, 4096))
LINEAR_EPILOGUES = ("silu", "relu", "gelu+residual", "none+residual", "none")
LINEAR_QUICK = ((3000, 200, 800), (1000, 384, 1536), (16384, 256, 1024), (2048, 96, 384), (777, 1024, 4096))
# (M, K, N) of the fp8 route: M ≥ 4096 (a prefill's or a training batch's tokens), issue #51's target.
FP8_LINEAR_SHAPES = (
    (4096, 1024, 4096),
    (4096, 4096, 1024),
    (8192, 4096, 4096),
    (16384, 1024, 4096),
    (16384, 2048, 8192),
    (4100, 1000, 3000),  # odd sizes: ragged tiles (torch._scaled_mm needs K and N in multiples of 16: not timed)
)
FP8_LINEAR_QUICK = ((4096, 4096, 1024), (16384, 2048, 8192))
FP8_TARGET = 1.4  # × bf16 cuBLAS, issue #51
# (B, H, L, D) for linear attention: the shapes, then odd lengths at every head dim.
LINATTN_CASES = ((3, 5, 1000, 64), (8, 8, 1024, 64), (1, 4, 256, 32), (4, 16, 4096, 64)) + tuple(
    (B, H, L, D) for D in (32, 64, 128) for L in (333, 2048, 4097) for B, H in ((2, 2), (16, 8))
)
FEATURE_TARGETS = {"identity": 1.0, "elu+1": 1.5, "relu": 1.5}
CASE_KEYS = ("B", "H", "L", "D", "M", "K", "N", "epilogue", "feature_map")


def attention_grid(quick: bool = False) -> list[tuple[int, int, int, int]]:
    if quick:
        return list(ATTN_QUICK)
    return [(B, H, L, D) for D in ATTN_DIMS for L in ATTN_LENGTHS for B, H in ATTN_BH]


def linear_grid(quick: bool = False) -> list[tuple[int, int, int, str]]:
    if quick:
        return [(M, K, N, "gelu") for M, K, N in LINEAR_QUICK]
    rows = [(M, K, N, "gelu") for M in LINEAR_MS for K, N in LINEAR_KN]
    rows += [
        (M, K, N, e) for M, K, N in ((3000, 200, 800), (16384, 256, 1024), (777, 1024, 4096)) for e in LINEAR_EPILOGUES
    ]
    return rows


def linear_attention_grid(quick: bool = False) -> list[tuple[int, int, int, int]]:
    return list(LINATTN_CASES[:4] if quick else LINATTN_CASES)


def attention_target(L: int) -> float:
    return 1.0 if L >= 1024 else 0.9


def score(speedup: float | None, target: float | None, rel_err: float | None) -> dict:
    """``met`` and ``miss_by`` of one row: a wrong result never meets its target."""
    if speedup is None or target is None:
        return {"met": None, "miss_by": None}
    correct = rel_err is not None and rel_err <= TOLERANCE
    met = correct and speedup >= target
    return {"met": met, "miss_by": None if met else round(target - speedup, 4) if correct else "wrong result"}


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.float().reshape(expected.shape), expected.float()
    return float("nan") if not torch.isfinite(a).all() else ((a - e).norm() / e.norm()).item()


def _kernels(fn: Callable[[], object]) -> list[str]:
    """CUDA kernel names of one call (torch.profiler)."""
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - a report detail, not worth the run
        return [f"profiler failed: {type(err).__name__}: {err}"[:200]]
    return sorted({e.key[:160] for e in prof.key_averages() if e.device_type.name == "CUDA"})


def _kernel_columns(ours: Callable[[], object], peer: Callable[[], object]) -> dict:
    """Both sides' CUDA kernel names (profiled) and whether they are the same set: where they are,
    our route runs the peer's own kernels, so the speed-up is 1 up to the timing noise between two
    graphs — the peer's kernel is the floor, measured rather than assumed."""
    mine, theirs = _kernels(ours), _kernels(peer)
    return {"ours_kernels": mine, "peer_kernels": theirs, "same_kernels_as_peer": mine == theirs}


def _time(fns: Sequence[Callable[[], object]]) -> dict:
    t = time_graph(fns, reps=30)
    return {"median_us": t.median_us, "iqr_us": t.iqr_us}


_CONTROL = [True]  # --no-control clears it: time the peer once, not twice


def _time_pair(ours: Sequence[Callable[[], object]], peer: Sequence[Callable[[], object]]) -> tuple[dict, dict]:
    """Ours and the peer timed together, their replays interleaved (``_timing.interleaved``): the
    ratio a row is scored on does not depend on which side the GPU's clocks favoured. With the
    control (the default), the peer is captured a second time into a graph of its own and timed
    in the same rotation: ``peer["control"]["ratio"]`` (peer / peer again) is what the speed-up of
    two identical sides comes out as on this row, the noise a miss is measured against."""
    sides = {"ours": ours, "peer": peer} | ({"peer_again": peer} if _CONTROL[0] else {})
    t = time_graphs(sides, reps=30)
    ours_t, peer_t = ({"median_us": t[k].median_us, "iqr_us": t[k].iqr_us} for k in ("ours", "peer"))
    if "peer_again" in t:
        again = t["peer_again"]
        peer_t["control"] = {
            "median_us": again.median_us,
            "iqr_us": again.iqr_us,
            "ratio": peer_t["median_us"] / again.median_us,
        }
    return ours_t, peer_t


_SINKS: list[Callable[[dict], None]] = []  # called with every finished row (main: rewrite the file)
_GPU_LOCK = GpuLock(None)  # --gpu-lock: held through each shape's GPU work


def _each_locked(shapes: Iterable[tuple]) -> Iterator[tuple]:
    """The grid's shapes, each handed out with the GPU lock held until the next is asked for: a
    shape's checks, timings and profiles never share the GPU with another process's timing."""
    for shape in shapes:
        with _GPU_LOCK:
            yield shape


def _row(op: str, case: dict, ours: dict, peer: dict, peer_name: str, target: float, err: float, **extra) -> dict:
    speedup = peer["median_us"] / ours["median_us"]
    row = {"op": op, **case, "ours_us": ours, "peer": peer_name, "peer_us": peer, "speedup": speedup}
    row |= {"target": target, "rel_err": err, **score(speedup, target, err), **extra}
    for sink in _SINKS:
        sink(row)
    print(
        f"{op:16s} {case} ours {ours['median_us']:9.2f} µs | {peer_name} {peer['median_us']:9.2f} µs | "
        f"{speedup:5.2f}x (target {target})" + ("" if row["met"] else f"  MISS {row['miss_by']}"),
        flush=True,
    )
    return row


def _qkv(B: int, L: int, H: int, D: int) -> list[torch.Tensor]:
    n = min(copies_for_l2(B * L * 3 * H * D * DTYPE.itemsize), 16)
    return [torch.randn(B, L, 3 * H * D, device="cuda", dtype=DTYPE) for _ in range(n)]


def _views(qkv: torch.Tensor, H: int) -> tuple[torch.Tensor, ...]:
    B, L, _ = qkv.shape
    return tuple(qkv.view(B, L, 3, H, -1).permute(2, 0, 3, 1, 4))  # [B, H, L, D] strided views


def _rope_columns(fa, copies: list[torch.Tensor], views: list, H: int, L: int, D: int) -> dict:
    """With RoPE (the model's attention): ``flash_attention_qkv`` by its route, the Triton kernel
    forced (rotation fused), and the peer a user gets: the model's ``apply_rope`` on q and k then
    default SDPA. Each checked against that peer."""
    from nas.models.mixers import apply_rope, rope_tables

    cos, sin = rope_tables(L, D, device=copies[0].device, dtype=DTYPE)  # the torch model's tables: its dtype

    def peer(q, k, v):
        return F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, is_causal=True)

    def ours(qkv):
        return fa.flash_attention_qkv(qkv, H, causal=True, rope=(cos, sin))

    expected = peer(*views[0]).transpose(1, 2)
    cols = {"rope_route": None}
    err = _rel_err(ours(copies[0]), expected)
    cols["rope_route"] = fa.last_route()
    cols["rope_ours_us"] = _time([partial(ours, c) for c in copies])
    cols["rope_peer"] = "apply_rope+sdpa-default"
    cols["rope_peer_us"] = _time([partial(peer, *v) for v in views])
    cols["rope_speedup"] = cols["rope_peer_us"]["median_us"] / cols["rope_ours_us"]["median_us"]
    cols["rope_rel_err"] = err
    fa.set_route("triton")
    try:
        cols["rope_triton_rel_err"] = _rel_err(ours(copies[0]), expected)
        cols["rope_triton_us"] = _time([partial(ours, c) for c in copies])
    finally:
        fa.set_route(None)
    return cols


def attention_rows(quick: bool, rope: bool = False) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.attention import triton as fa

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def sdpa_flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rows = []
    for B, H, L, D in _each_locked(attention_grid(quick)):
        copies = _qkv(B, L, H, D)
        views = [_views(c, H) for c in copies]
        case = {"B": B, "H": H, "L": L, "D": D}
        expected = sdpa(*views[0]).transpose(1, 2)
        err = _rel_err(fa.flash_attention_qkv(copies[0], H, causal=True), expected)
        route = fa.last_route()
        ours, peer = _time_pair(
            [partial(fa.flash_attention_qkv, c, H, causal=True) for c in copies], [partial(sdpa, *v) for v in views]
        )
        forced = {"skipped": "--rope (FA2 forced is timed without it)"}
        if not rope:
            try:
                forced = _time([partial(sdpa_flash, *v) for v in views])
            except Exception as exc:  # noqa: BLE001 - FA2 refuses some shapes (head dims, dtypes)
                forced = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        extra = _rope_columns(fa, copies, views, H, L, D) if rope else {}
        rows.append(
            _row(
                "attention",
                case,
                ours,
                peer,
                "sdpa-default",
                attention_target(L),
                err,
                **_kernel_columns(partial(fa.flash_attention_qkv, copies[0], H, causal=True), partial(sdpa, *views[0])),
                forced_flash_us=forced,
                route=route,
                config=str(fa.last_tuned_config(copies[0].device, D)) if route == "triton" else None,
                **extra,
            )
        )
        del copies, views
        torch.cuda.empty_cache()
    return rows


def linear_rows(quick: bool, floors: bool = True) -> list[dict]:
    from kernels.linear import last_route, last_tuned_config, linear

    acts = {"gelu": F.gelu, "silu": F.silu, "relu": F.relu, "none": None}
    rows = []
    for M, K, N, epilogue in _each_locked(linear_grid(quick)):
        act = epilogue.removesuffix("+residual")
        residual = epilogue.endswith("+residual")
        n = min(copies_for_l2((M * K + N * K + M * N * (2 if residual else 1)) * 2), 16)
        sets = [
            {
                "x": torch.randn(M, K, device="cuda", dtype=DTYPE),
                "w": (torch.randn(N, K, device="cuda") / K**0.5).to(DTYPE),
                "b": torch.randn(N, device="cuda", dtype=DTYPE),
                "r": torch.randn(M, N, device="cuda", dtype=DTYPE) if residual else None,
            }
            for _ in range(n)
        ]

        def ours(s, act=act):
            return linear(s["x"], s["w"], s["b"], activation=None if act == "none" else act, residual=s["r"])

        def peer(s, act=act):
            y = F.linear(s["x"], s["w"], s["b"])
            y = acts[act](y) if acts[act] is not None else y
            return y + s["r"] if s["r"] is not None else y

        err = _rel_err(ours(sets[0]), peer(sets[0]).float())
        route = last_route()
        config = last_tuned_config() if route == "triton" else None
        # Floors beside the peer: cuBLAS's matmul with its bias epilogue alone (what any route that
        # keeps cuBLAS's main loop pays before its activation), and cuBLASLt's fused bias+GELU/ReLU
        # epilogue (torch._addmm_activation; its GELU is the tanh form, so not the same function).
        floors = {"addmm_us": _time([partial(F.linear, s["x"], s["w"], s["b"]) for s in sets])} if floors else {}
        if floors and act in ("gelu", "relu") and hasattr(torch, "_addmm_activation"):
            lt = [partial(torch._addmm_activation, s["b"], s["x"], s["w"].t(), use_gelu=act == "gelu") for s in sets]
            floors["cublaslt_epilogue_us"] = _time(lt)
            floors["cublaslt_epilogue_kernels"] = _kernels(lt[0])
        row = _row(
            "linear",
            {"M": M, "K": K, "N": N, "epilogue": epilogue},
            *_time_pair([partial(ours, s) for s in sets], [partial(peer, s) for s in sets]),
            "cublas+torch",
            1.0,
            err,
            **_kernel_columns(partial(ours, sets[0]), partial(peer, sets[0])),
            route=route,
            config=str(config),
            **floors,
        )
        rows.append(row)
        del sets
    return rows


def linear_fp8_rows(quick: bool) -> list[dict]:
    """The fp8 route (``kernels.linear.fp8``: the activations quantized per token, then the fp8
    matmul with the bias) against bf16 cuBLAS ``F.linear`` (the target's peer), and beside it
    ``torch._scaled_mm`` on the same fp8 operands with the same row and column scales (sm_90+),
    with the torch ops a user writes to quantize the activations (``peer_scaled_mm_with_quant_us``)
    and without them (``scaled_mm_us``). Each checked against the fp32 reference over the operands
    as they read back (ours) or against ours (the peer)."""
    from kernels.linear import reference as linear_ref
    from kernels.linear.fp8 import linear_fp8, quantize_rows, quantize_weight

    fp8_peer_here = torch.cuda.get_device_capability() >= (9, 0) and hasattr(torch, "_scaled_mm")
    rows = []
    for M, K, N in _each_locked(FP8_LINEAR_QUICK if quick else FP8_LINEAR_SHAPES):
        n = min(copies_for_l2((M * K + N * K + M * N) * 2), 16)
        sets = []
        for _ in range(n):
            x = torch.randn(M, K, device="cuda", dtype=DTYPE)
            w = (torch.randn(N, K, device="cuda") / K**0.5).to(DTYPE)
            b = torch.randn(N, device="cuda", dtype=DTYPE)
            sets.append({"x": x, "w": w, "b": b, "wq": quantize_weight(w), "xq": quantize_rows(x)})

        def ours(s):
            xq, sx = quantize_rows(s["x"])
            return linear_fp8(xq, sx, *s["wq"], s["b"])

        def peer(s):
            return F.linear(s["x"], s["w"], s["b"])

        s0 = sets[0]
        xq, sx = s0["xq"]
        want = linear_ref.linear(xq.float() * sx[:, None], s0["wq"][0].float() * s0["wq"][1][:, None], s0["b"])
        err = _rel_err(ours(s0), want)
        extra: dict = {"quantization_error_vs_bf16": _rel_err(ours(s0), peer(s0).float())}
        if fp8_peer_here and K % 16 == 0 and N % 16 == 0:

            def scaled_mm(s, quantize: bool):
                if quantize:  # what a user writes: per-row amax, divide, cast
                    scale = (s["x"].float().abs().amax(-1, keepdim=True) / 448.0).clamp(min=1e-12)
                    q = (s["x"].float() / scale).to(torch.float8_e4m3fn)
                else:  # the operands ours quantized
                    q, scale = s["xq"][0], s["xq"][1][:, None]
                wq, sw = s["wq"]
                return torch._scaled_mm(q, wq.t(), scale_a=scale, scale_b=sw[None, :], bias=s["b"], out_dtype=DTYPE)

            extra["scaled_mm_rel_err_vs_ours"] = _rel_err(ours(s0), scaled_mm(s0, False).float())
            extra["peer_scaled_mm_with_quant_us"] = _time([partial(scaled_mm, s, True) for s in sets])
            extra["scaled_mm_us"] = _time([partial(scaled_mm, s, False) for s in sets])
            extra["scaled_mm_kernels"] = _kernels(partial(scaled_mm, s0, False))
        row = _row(
            "linear_fp8",
            {"M": M, "K": K, "N": N, "epilogue": "bias"},
            *_time_pair([partial(ours, s) for s in sets], [partial(peer, s) for s in sets]),
            "cublas bf16",
            FP8_TARGET,
            err,
            **_kernel_columns(partial(ours, s0), partial(peer, s0)),
            **extra,
        )
        rows.append(row)
        del sets
    return rows


def _fla() -> tuple[Callable | None, str]:
    try:
        import fla
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as err:  # noqa: BLE001 - any import failure: the rows say so
        return None, f"fla not importable: {type(err).__name__}: {err}"
    return chunk_linear_attn, f"fla-core {fla.__version__}"


def linear_attention_rows(quick: bool) -> tuple[list[dict], str]:
    from kernels.linear_attention import triton as la
    from nas.models.mixers import FEATURE_MAP_FNS

    chunk, note = _fla()
    rows = []
    if chunk is None:
        return rows, note
    for B, H, L, D in _each_locked(linear_attention_grid(quick)):
        copies = _qkv(B, L, H, D)
        natives = [tuple(t.transpose(1, 2).contiguous() for t in _views(c, H)) for c in copies]  # [B, L, H, D]
        for fm, target in FEATURE_TARGETS.items():
            phi = FEATURE_MAP_FNS[fm]

            def peer(q, k, v, fm=fm, phi=phi):
                if fm == "identity":
                    return chunk(q, k, v, scale=q.shape[-1] ** -0.5, normalize=False)[0]
                return chunk(phi(q), phi(k), v, scale=1.0, normalize=True)[0]

            expected = peer(*natives[0]).reshape(B, L, H * D)
            err = _rel_err(la.linear_attention_qkv(copies[0], H, feature_map=fm), expected)
            extra = {}
            if fm == "identity":  # the two-pass forward beside the default route (forced)
                la.set_route("two_pass")
                try:
                    extra["two_pass_rel_err"] = _rel_err(
                        la.linear_attention_qkv(copies[0], H, feature_map=fm), expected
                    )
                    extra["two_pass_us"] = _time(
                        [partial(la.linear_attention_qkv, c, H, feature_map=fm) for c in copies]
                    )
                finally:
                    la.set_route(None)
            rows.append(
                _row(
                    "linear_attention",
                    {"B": B, "H": H, "L": L, "D": D, "feature_map": fm},
                    *_time_pair(
                        [partial(la.linear_attention_qkv, c, H, feature_map=fm) for c in copies],
                        [partial(peer, *n) for n in natives],
                    ),
                    "fla-chunk" if fm == "identity" else "torch-phi+fla-chunk",
                    target,
                    err,
                    config=str(la.last_tuned_config(copies[0].device, D)),
                    route=la.last_route(),
                    peer_kernels=_kernels(partial(peer, *natives[0])),
                    **extra,
                )
            )
        del copies, natives
        torch.cuda.empty_cache()
    return rows, note


def summary(rows: list[dict]) -> dict:
    """Per op: rows, met, the median and the worst speed-up, and the misses by how much. Where rows
    record both sides' kernels: the rows that ran the peer's own kernels (their speed-ups are the
    noise of timing one kernel set twice) and how many misses ran kernels of ours."""
    out = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        out[op] = {
            "rows": len(mine),
            "met": sum(bool(r["met"]) for r in mine),
            "median_speedup": statistics.median(r["speedup"] for r in mine),
            "worst_speedup": min(r["speedup"] for r in mine),
            "misses": [
                {
                    k: r[k]
                    for k in (
                        "B",
                        "H",
                        "L",
                        "D",
                        "M",
                        "K",
                        "N",
                        "epilogue",
                        "feature_map",
                        "speedup",
                        "miss_by",
                        "same_kernels_as_peer",
                    )
                    if k in r
                }
                for r in mine
                if not r["met"]
            ],
        }
        controls = [abs(1.0 - r["peer_us"]["control"]["ratio"]) for r in mine if "control" in r.get("peer_us", {})]
        if controls:
            noise = statistics.quantiles(controls, n=20, method="inclusive")[-1] if len(controls) >= 2 else controls[0]
            out[op]["control"] = {
                "rows": len(controls),
                "median_abs_deviation": statistics.median(controls),
                "p95_abs_deviation": noise,
                "misses_within_p95": sum(
                    not r["met"] and isinstance(r["miss_by"], float) and r["miss_by"] <= noise for r in mine
                ),
            }
        if any("same_kernels_as_peer" in r for r in mine):
            same_rows = [r for r in mine if r.get("same_kernels_as_peer")]
            same = [r["speedup"] for r in same_rows]
            out[op]["peer_kernel_rows"] = {
                "rows": len(same),
                "met": sum(bool(r["met"]) for r in same_rows),
                **({"median_speedup": statistics.median(same), "range": [min(same), max(same)]} if same else {}),
            }
            out[op]["misses_on_our_kernels"] = sum(not r["met"] and not r.get("same_kernels_as_peer") for r in mine)
    return out


def timing_text(*, control: bool, gpu_lock: str | None) -> str:
    """How the rows were timed, for the JSON's ``timing``: the interleaved graphs, the control when
    taken, and whether the GPU was shared (``--gpu-lock``: each shape timed holding the lock while
    other processes compiled on the CPU)."""
    text = (
        "CUDA-graph replay, median of 30 replays; ours and the peer in separate graphs, their replays "
        "interleaved (order rotated each round); inputs rotated over copies larger than L2 (at most 16)"
    )
    if control:
        text += "; the peer captured twice, peer_us.control is its second graph (the peer-vs-itself control)"
    if gpu_lock:
        text += f"; each shape timed holding the GPU lock {gpu_lock} while other processes used the CPU"
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quick", action="store_true", help="the shapes the issue quotes only")
    parser.add_argument("--only", choices=("attention", "linear", "linear_attention", "linear_fp8"))
    parser.add_argument("--list", action="store_true", help="print the grids and exit")
    parser.add_argument("--no-floors", action="store_true", help="linear: skip the cuBLAS-alone and cuBLASLt floors")
    parser.add_argument(
        "--no-control", action="store_true", help="time the peer once (no peer-vs-itself control per row)"
    )
    parser.add_argument(
        "--rope", action="store_true", help="attention: also time RoPE (route, fused Triton, apply_rope + SDPA)"
    )
    parser.add_argument(
        "--gpu-lock",
        metavar="FILE",
        help="hold this lock file through each shape's GPU work (shares the GPU with model_vs_compile.py --procs)",
    )
    args = parser.parse_args(argv)
    global _GPU_LOCK
    _GPU_LOCK = GpuLock(args.gpu_lock)
    _CONTROL[0] = not args.no_control
    grids = {
        "attention": attention_grid(args.quick),
        "linear": linear_grid(args.quick),
        "linear_attention": linear_attention_grid(args.quick),
        "linear_fp8": list(FP8_LINEAR_QUICK if args.quick else FP8_LINEAR_SHAPES),
    }
    ops = [args.only] if args.only else list(grids)
    if args.list:
        for op in ops:
            print(f"{op}: {len(grids[op])} shapes: {grids[op]}")
        return
    if not torch.cuda.is_available():
        raise SystemExit("default_peers.py times GPU kernels: no CUDA device here (--list works anywhere)")
    notes: dict[str, str] = {}
    name = device_slug(torch.cuda.get_device_name(0))
    out = Path(args.out) / f"default_peers_{name}{'_quick' if args.quick else ''}.json"
    timing = timing_text(control=_CONTROL[0], gpu_lock=args.gpu_lock)

    def write(op: str, rows: list[dict], complete: bool) -> Path:  # one part per op; the others are kept
        extra = {"note": notes[op]} if op in notes else {}
        return write_part(
            out, op, rows, summary=summary(rows), timing=timing, gpu_lock=args.gpu_lock, complete=complete, **extra
        )

    for op in ops:
        streamed: list[dict] = []

        def keep(row: dict, op: str = op, streamed: list[dict] = streamed) -> None:
            streamed.append(row)  # the part is rewritten after every row: a run cut short keeps what it timed
            write(op, streamed, complete=False)

        _SINKS[:] = [keep]
        if op == "attention":
            rows = attention_rows(args.quick, rope=args.rope)
        elif op == "linear":
            rows = linear_rows(args.quick, floors=not args.no_floors)
        elif op == "linear_fp8":
            rows = linear_fp8_rows(args.quick)
        else:
            rows, notes["linear_attention"] = linear_attention_rows(args.quick)
        path = write(op, rows, complete=True)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
