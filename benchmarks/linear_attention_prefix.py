"""Linear attention's three forward routes per shape and feature map (issue #15 item 3).

    PYTHONPATH=$PWD python benchmarks/linear_attention_prefix.py --out FILE [--peer] [--maps M,..]
        [--max-chunks N] [--list] [--shapes B,H,L,D ...] [--kernel-times]

The routes: the fused kernel (one launch, a program walks its segment carrying the state), the
two passes (states before every chunk to memory, then every chunk's outputs in parallel) and the
prefix forward (``PrefixConfig``: one launch, each (chunk, value block) program sums the state of
the chunks before its own, then computes its outputs; walks of at most ``--max-chunks`` chunks).
All three run every feature map (the normalized ones also carry z = Σ φ(k)). Per shape and map
this times each route forced, as CUDA-graph replays over inputs rotated past L2
(``benchmarks/_timing.py``) — every prefix config of the sm_90 table for the identity map, the
first for the others — and, with ``--peer``, fla-core's ``chunk_linear_attn`` (φ in torch for
the normalized maps), which autotunes at every new shape. Every variant's output is checked
against the fp32 reference (relative Frobenius distance ≤ 2e-2) before its time counts.

Shapes: ``default_peers``' identity grid, the issue's shapes, and the model
benchmarks' mixers (B 1 × 256 and B 8 × 1024 tokens, 1-16 heads); ``--shapes`` times others instead
(the route rule's boundary). The file is rewritten after every row, so a run cut short keeps what it
timed. ``--kernel-times`` adds, per variant and for fla, each kernel's device time per call
(profiled eager calls): which of a route's kernels a gap to the peer is in.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._timing import kernel_times, write_results  # noqa: E402
from benchmarks.default_peers import LINATTN_CASES, _fla, _kernels, _qkv, _rel_err, _time, _views  # noqa: E402
from kernels.linear_attention.reference import FEATURE_MAPS  # noqa: E402

TOLERANCE = 2e-2
# the models' identity mixers (model_vs_compile's shapes) and short walks at a few heads
MODEL_CASES = tuple((B, H, L, D) for B, L in ((1, 256), (8, 1024)) for H in (1, 4, 16) for D in (32, 64, 128))
EXTRA_CASES = ((2, 8, 1000, 64), (1, 4, 449, 64), (1, 4, 512, 64), (2, 2, 576, 32), (1, 4, 576, 128))


def cases() -> list[tuple[int, int, int, int]]:
    return list(dict.fromkeys((*LINATTN_CASES, *EXTRA_CASES, *MODEL_CASES)))


def _map_row(
    case: tuple[int, int, int, int],
    fm: str,
    copies: list,
    natives: list,
    chunk,
    max_chunks: int,
    per_kernel: bool = False,
) -> dict:
    """One shape and feature map: every route forced (and fla with ``chunk``), checked first."""
    from kernels.linear_attention import configs
    from kernels.linear_attention import reference as ref
    from kernels.linear_attention import triton as la
    from nas.models.mixers import FEATURE_MAP_FNS

    B, H, L, D = case
    phi = FEATURE_MAP_FNS[fm]

    def peer(q, k, v):
        if fm == "identity":
            return chunk(q, k, v, scale=q.shape[-1] ** -0.5, normalize=False)[0]
        return chunk(phi(q), phi(k), v, scale=1.0, normalize=True)[0]

    q, k, v = (t.float() for t in _views(copies[0], H))
    expected = ref.linear_attention(q, k, v, feature_map=fm).reshape(B, L, H * D)
    cap = torch.cuda.get_device_capability()
    row = {"B": B, "H": H, "L": L, "D": D, "feature_map": fm, "chunks": -(-L // 64)}
    row["rule"] = configs.forward_route(cap, B * H, L, D, fm)
    if chunk is not None:
        row["peer_us"] = _time([partial(peer, *n) for n in natives])
        row["peer_kernels"] = _kernels(partial(peer, *natives[0]))  # which kernels fla ran
        if per_kernel:
            row["peer_kernel_us"] = kernel_times([partial(peer, *n) for n in natives])
    variants: dict[str, dict] = {}

    def run(name: str, call) -> None:
        try:
            err = _rel_err(call(copies[0]), expected)
            got = {"rel_err": err, "ok": err <= TOLERANCE}
            if got["ok"]:
                got["us"] = _time([partial(call, c) for c in copies])
                if per_kernel:
                    got["kernel_us"] = kernel_times([partial(call, c) for c in copies])
                if chunk is not None:
                    got["speedup"] = row["peer_us"]["median_us"] / got["us"]["median_us"]
        except Exception as exc:  # noqa: BLE001 - recorded per variant
            got = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        variants[name] = got

    def routed(route):
        def call(qkv):
            la.set_route(route)
            try:
                return la.linear_attention_qkv(qkv, H, feature_map=fm)
            finally:
                la.set_route(None)

        return call

    for route in la.ROUTES:
        if route != "prefix":
            run(route, routed(route))
    if row["chunks"] <= max_chunks:
        tried = configs.PREFIX_HOPPER.get(D, ())
        for c in tried if fm == "identity" else tried[:1]:
            name = f"prefix_c{c.chunk}v{c.block_v}w{c.num_warps}s{c.num_stages}"
            run(name, lambda qkv, c=c: la.linear_attention_qkv(qkv, H, feature_map=fm, config=c))
    row["variants"] = variants
    timed = {k: v["us"]["median_us"] for k, v in variants.items() if v.get("ok")}
    row["best"] = min(timed, key=timed.get) if timed else None
    print(
        f"B{B} H{H} L{L} D{D} {fm}: rule {row['rule']} | "
        + (f"fla {row['peer_us']['median_us']:.2f} | " if chunk is not None else "")
        + " ".join(f"{k} {v:.2f}" for k, v in timed.items())
        + f" | best {row['best']}",
        flush=True,
    )
    return row


def _case(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"invalid shape {text!r}: B,H,L,D as four positive integers")
    B, H, L, D = (int(p) for p in parts)
    return B, H, L, D


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-chunks", type=int, default=32, help="time the prefix forward up to this many chunks")
    parser.add_argument("--peer", action="store_true", help="also time fla-core (autotunes per shape: slow)")
    parser.add_argument("--maps", default=",".join(FEATURE_MAPS), help="comma-separated feature maps")
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    parser.add_argument(
        "--kernel-times", action="store_true", help="also each variant's and fla's device time per kernel (profiler)"
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_case,
        metavar="B,H,L,D",
        help="these shapes instead of the grid (a rule's boundary)",
    )
    args = parser.parse_args(argv)
    shapes = list(dict.fromkeys(args.shapes)) if args.shapes else cases()
    if args.list:
        print(f"{len(shapes)} shapes: {shapes}")
        return
    if not torch.cuda.is_available():
        raise SystemExit("linear_attention_prefix.py times GPU kernels: no CUDA device here (--list works anywhere)")
    chunk, note = _fla() if args.peer else (None, "fla not timed (--peer)")
    rows: list[dict] = []
    for B, H, L, D in shapes:
        copies = _qkv(B, L, H, D)
        natives = [tuple(t.transpose(1, 2).contiguous() for t in _views(c, H)) for c in copies] if chunk else []
        for fm in args.maps.split(","):
            rows.append(_map_row((B, H, L, D), fm, copies, natives, chunk, args.max_chunks, args.kernel_times))
            write_results(args.out, rows, peer=note, complete=False)
        del copies, natives
        torch.cuda.empty_cache()
    write_results(args.out, rows, peer=note, complete=True)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
