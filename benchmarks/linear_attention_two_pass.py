"""Identity-map linear attention: the fused single-pass kernel vs the two-pass forward at every
candidate launch config vs fla-core's ``chunk_linear_attn`` (the default peer), on
``default_peers``' linear-attention grid. Decides the per-shape route (issue #15 item 3).

Each row: the peer's time, the fused kernel's (its tuned route), and every two-pass config's,
all CUDA-graph replays over input copies larger than L2 (bf16, random normal), each output
checked against the peer's before its time counts. Writes after every row.

    python benchmarks/linear_attention_two_pass.py --out benchmarks/results/linear_attention_two_pass_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._timing import kernel_times, write_results  # noqa: E402
from benchmarks.default_peers import (  # noqa: E402
    TOLERANCE,
    _fla,
    _kernels,
    _qkv,
    _rel_err,
    _time,
    _views,
    linear_attention_grid,
)

# Beyond default_peers' grid: B·H between its 4 and 128 and up to 512, and 8192 tokens (the
# issue's grid names B·H 4-512 and L up to 8192).
EXTRA_CASES = ((2, 8, 1000, 64), (2, 8, 8192, 64), (4, 8, 2048, 128), (1, 16, 8192, 32), (32, 16, 1024, 64))
ONE_GROUP = 1 << 30  # a group larger than any sequence: pass 1 walks every chunk in one program


def candidates(D: int) -> list:
    """Two-pass launch configs worth timing at head dim D: the route's launch with pass 1 in one
    group (the design before groups), then 64- and 128-token chunks, 32- and 64-row state blocks,
    64 columns (or D), pass 1 at 2 or 4 warps, pass 2 at 4 warps for 64-token chunks and 8 for
    128, each with ``two_pass_group``'s groups (32 value columns below D are refused on the GPU)."""
    from kernels.linear_attention.configs import TwoPassConfig

    out = [dataclasses.replace(TwoPassConfig(128, 32, min(64, D), 8 if D > 32 else 4, 2), group=ONE_GROUP)]
    for chunk in (64, 128):
        for bk in sorted({min(32, D), min(64, D)}):
            for warps in (2, 4):
                out.append(TwoPassConfig(chunk, bk, min(64, D), 4 if chunk == 64 else 8, 2, warps, 2))
    return out


def focus(D: int) -> list:
    """``--focus``: the launch the route takes (``TWO_PASS_HOPPER[D][0]``) and a 128-token one,
    each with the rule's groups and in one group."""
    from kernels.linear_attention.configs import TWO_PASS_HOPPER, TwoPassConfig

    route = TWO_PASS_HOPPER[D][0]
    wide = TwoPassConfig(128, min(64, D), min(64, D), 8, 2, 4, 2)
    return [route, dataclasses.replace(route, group=ONE_GROUP), wide, dataclasses.replace(wide, group=ONE_GROUP)]


_candidates = candidates


def _encode(cfg) -> list[int]:
    return [0 if x is None else x for x in dataclasses.astuple(cfg)]


def _decode(values: list[int]):
    from kernels.linear_attention.configs import TwoPassConfig

    return TwoPassConfig(*values[:5], *(x or None for x in values[5:]))


def _check(D: int, cfg: list[int]) -> int:
    """Child process: run one config at two odd shapes against the fp32 reference (0: agrees)."""
    from kernels.linear_attention import reference
    from kernels.linear_attention import triton as la

    for B, H, L in ((3, 5, 1000), (2, 2, 333), (1, 2, 4097)):
        qkv = torch.randn(B, L, 3 * H * D, device="cuda", dtype=torch.bfloat16)
        got = la.linear_attention_qkv(qkv, H, feature_map="identity", config=_decode(cfg))
        q, k, v = _views(qkv, H)
        want = reference.linear_attention(q.float(), k.float(), v.float(), feature_map="identity")
        err = _rel_err(got, want)
        torch.cuda.synchronize()
        if not err <= TOLERANCE:
            print(f"D{D} {cfg} B{B} H{H} L{L}: rel_err {err}")
            return 3
    return 0


def _kernel_us(fn, reps: int = 20) -> dict[str, float]:
    """Device time (µs per call) of each CUDA kernel of ``fn`` over ``reps`` eager calls."""
    return {name: t["us"] for name, t in kernel_times([fn], rounds=reps).items()}


def _passes(copies: list, H: int, cfg) -> dict:
    """The two passes of ``cfg`` timed apart (graph replay over the same copies): pass 1 with the
    carry scan, and pass 2 from states computed beforehand."""
    from kernels.linear_attention import triton as la

    views = [_views(c, H) for c in copies]
    B, _, L, D = views[0][0].shape
    plan = la.two_pass_plan(copies[0].device, B * H, L, D, cfg)
    p1 = _time([partial(la._two_pass_states, k, v, plan, "identity") for _, k, v in views])
    made = [la._two_pass_states(k, v, plan, "identity") for _, k, v in views]
    outs = [torch.empty(B, L, H * D, device=copies[0].device, dtype=copies[0].dtype) for _ in views]
    p2 = _time(
        [
            partial(la._two_pass_out, q, k, v, st, zs, tot, o, D**-0.5, plan, "identity")
            for (q, k, v), (st, zs, tot), o in zip(views, made, outs, strict=True)
        ]
    )
    return {"group": plan.group, "groups": plan.groups, "pass1_us": p1, "pass2_us": p2}


def _vet(dims: list[int]) -> dict:
    """Every candidate config in its own process (a crash poisons a CUDA context): {(D, cfg): status}."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(D, _encode(c)) for D in dims for c in _candidates(D)]

    def one(job):
        D, cfg = job
        cmd = [sys.executable, __file__, "--check", str(D), *map(str, cfg)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return {"D": D, "config": cfg, "rc": r.returncode, "tail": (r.stdout + r.stderr)[-300:] if r.returncode else ""}

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, jobs))


def _brief(passes: dict | None) -> str:
    if not passes:
        return "-"
    p1, p2 = passes["pass1_us"]["median_us"], passes["pass2_us"]["median_us"]
    return f"g{passes['group']}x{passes['groups']} {p1:.1f} + {p2:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--small", action="store_true", help="only shapes with B·H ≤ 64")
    parser.add_argument("--extra", action="store_true", help="also EXTRA_CASES (B·H 16-512, L 1000-8192)")
    parser.add_argument("--focus", action="store_true", help="only the route's launch and a 128-token one")
    parser.add_argument("--check", nargs="+", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _candidates
    _candidates = focus if args.focus else candidates
    if args.check:
        return _check(args.check[0], args.check[1:])

    from kernels.linear_attention import triton as la

    chunk, note = _fla()
    if chunk is None:
        print(note)
        return 1
    vetted = _vet(sorted({D for *_, D in linear_attention_grid(args.quick)}))
    for v in vetted:
        if v["rc"]:
            print("config failed its check:", v, flush=True)
    ok = {(v["D"], tuple(v["config"])) for v in vetted if v["rc"] == 0}
    extra = EXTRA_CASES if args.extra else ()
    rows: list[dict] = []
    for B, H, L, D in (*linear_attention_grid(args.quick), *extra):
        if args.small and B * H > 64:
            continue
        copies = _qkv(B, L, H, D)
        natives = [tuple(t.transpose(1, 2).contiguous() for t in _views(c, H)) for c in copies]

        def peer(q, k, v):
            return chunk(q, k, v, scale=q.shape[-1] ** -0.5, normalize=False)[0]

        expected = peer(*natives[0]).reshape(B, L, H * D)
        peer_t = _time([partial(peer, *n) for n in natives])
        la.set_route("fused")  # the fused kernel forced (the default route may be either)
        try:
            fused_err = _rel_err(la.linear_attention_qkv(copies[0], H, feature_map="identity"), expected)
            fused_t = _time([partial(la.linear_attention_qkv, c, H, feature_map="identity") for c in copies])
        finally:
            la.set_route(None)
        two = []
        for cfg in _candidates(D):
            if (D, tuple(_encode(cfg))) not in ok:
                continue
            fn = partial(la.linear_attention_qkv, copies[0], H, feature_map="identity", config=cfg)
            err = _rel_err(fn(), expected)
            t = _time([partial(la.linear_attention_qkv, c, H, feature_map="identity", config=cfg) for c in copies])
            plan = la.two_pass_plan(copies[0].device, B * H, L, D, cfg)
            two.append(
                {
                    "config": _encode(cfg),
                    "group": plan.group,
                    "groups": plan.groups,
                    "rel_err": err,
                    "us": t,
                    "ok": err <= TOLERANCE,
                }
            )
        good = [r for r in two if r["ok"]]
        best = min(good, key=lambda r: r["us"]["median_us"]) if good else None
        row = {
            "B": B,
            "H": H,
            "L": L,
            "D": D,
            "peer_us": peer_t,
            "peer_kernels": _kernels(partial(peer, *natives[0])),
            "peer_kernel_us": _kernel_us(partial(peer, *natives[0])),
            "fused_us": fused_t,
            "fused_rel_err": fused_err,
            "fused_speedup": peer_t["median_us"] / fused_t["median_us"],
            "two_pass": two,
            "best_two_pass": best["config"] if best else None,
            "best_two_pass_speedup": peer_t["median_us"] / best["us"]["median_us"] if best else None,
            "best_two_pass_passes": _passes(copies, H, _decode(best["config"])) if best else None,
        }
        rows.append(row)
        print(
            f"B{B} H{H} L{L} D{D}: fla {peer_t['median_us']:.1f} fused {fused_t['median_us']:.1f} "
            f"({row['fused_speedup']:.2f}x) best two-pass {best['us']['median_us'] if best else float('nan'):.1f} "
            f"{row['best_two_pass']} ({row['best_two_pass_speedup'] or 0:.2f}x) one-group "
            f"{two[0]['us']['median_us'] if two else float('nan'):.1f} | passes {_brief(row['best_two_pass_passes'])} "
            f"| fla kernels {', '.join(f'{k[:24]} {t:.1f}' for k, t in row['peer_kernel_us'].items())}",
            flush=True,
        )
        write_results(args.out, rows, peer=note, vetted=vetted, complete=False)
        del copies, natives
        torch.cuda.empty_cache()
    write_results(args.out, rows, peer=note, vetted=vetted, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
