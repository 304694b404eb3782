"""Identity-map linear attention, the two passes taken apart on the GPU (issue #15 item 3): each
pass's kernel time (torch.profiler) beside fla-core's two kernels, pass-1 launch variants
(warps, pipeline stages, 32-row state blocks), groups forced at short walks, and where 32-column
value blocks go wrong (each pass alone, in its own process). The committed JSON files also hold a
pass-2 variant with every load issued before the first matmul ("*hoisted*" columns: 0.8-1.05x, not
taken); its kernel is in this file at commit 977f804. Files up to 2026-12-04 also hold ``pass1_kt*``
columns: pass 1 with k loaded transposed, an experiment kernel here until it became the library's
pass 1 (commit 43ccfb5); from then on every ``pass1_*`` column walks with it.

Every variant's output is checked against fla-core's before its time counts; times are CUDA-graph
replays over input copies larger than L2 (bf16, random normal). Writes after every row.

    python benchmarks/linear_attention_pass_variants.py \
        --out benchmarks/results/linear_attention_pass_variants_h200.json [--shapes B,H,L,D ...] [--skip-narrow]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._timing import write_results  # noqa: E402
from benchmarks.default_peers import TOLERANCE, _fla, _qkv, _rel_err, _time, _views, linear_attention_grid  # noqa: E402
from benchmarks.linear_attention_prefix import _case  # noqa: E402
from benchmarks.linear_attention_two_pass import EXTRA_CASES, _kernel_us  # noqa: E402

# Short walks at B·H = 4 (7-9 chunks of 64, around TWO_PASS_ONE_GROUP_UP_TO) beyond the grids.
SHORT_CASES = ((1, 4, 449, 64), (1, 4, 512, 64), (2, 2, 576, 32), (1, 4, 576, 128))


def _forward(qkv, H: int, plan):
    """One two-pass forward of the packed projection with ``plan`` (the library's passes)."""
    from kernels.linear_attention import triton as la

    q, k, v = _views(qkv, H)
    B, _, L, D = q.shape
    o = torch.empty(B, L, H * D, device=qkv.device, dtype=qkv.dtype)
    states, zs, totals = la._two_pass_states(k, v, plan, "identity")
    la._two_pass_out(q, k, v, states, zs, totals, o, D**-0.5, plan, "identity")
    return o


def _narrow(D: int) -> int:
    """Child process: 32-column value blocks at D, each pass alone against the 64-wide launch.
    Exit 0: both agree; 4: pass 1's states differ; 5: pass 2's outputs differ."""
    from kernels.linear_attention import configs
    from kernels.linear_attention import triton as la

    B, H, L = 3, 5, 1000
    qkv = torch.randn(B, L, 3 * H * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = _views(qkv, H)
    wide = configs.TwoPassConfig(64, 64, 64, 4, 2, 4, 2, group=1 << 30)
    narrow = dataclasses.replace(wide, block_v=32)
    pw = la.two_pass_plan(qkv.device, B * H, L, D, wide)
    pn = la.two_pass_plan(qkv.device, B * H, L, D, narrow)
    sw, zw, tw = la._two_pass_states(k, v, pw, "identity")
    sn, _, _ = la._two_pass_states(k, v, pn, "identity")
    torch.cuda.synchronize()
    e1 = _rel_err(sn.float(), sw.float())
    ow = torch.empty(B, L, H * D, device="cuda", dtype=torch.bfloat16)
    on = torch.empty_like(ow)
    la._two_pass_out(q, k, v, sw, zw, tw, ow, D**-0.5, pw, "identity")
    la._two_pass_out(q, k, v, sw, zw, tw, on, D**-0.5, pn, "identity")
    torch.cuda.synchronize()
    e2 = _rel_err(on, ow)
    print(f"D{D} block_v 32: pass-1 states rel err {e1:.3g}, pass-2 outputs rel err {e2:.3g}")
    return 0 if e1 <= TOLERANCE and e2 <= TOLERANCE else (4 if e1 > TOLERANCE else 5)


def _run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=300)
    return {"args": args, "rc": r.returncode, "tail": (r.stdout + r.stderr)[-600:]}


def _timed(row: dict, copies: list, H: int, expected, name: str, plan, forward=None) -> None:
    """One variant of the forward: checked against the peer's output, then timed, into ``row``."""
    forward = forward or _forward
    err = _rel_err(forward(copies[0], H, plan), expected)
    t = _time([partial(forward, c, H, plan) for c in copies])
    row.setdefault("variants", {})[name] = {
        "us": t,
        "rel_err": err,
        "ok": err <= TOLERANCE,
        "speedup": row["peer_us"]["median_us"] / t["median_us"],
        "group": plan.group,
        "groups": plan.groups,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--narrow", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--shapes", nargs="+", type=_case, metavar="B,H,L,D", help="these shapes instead of the grids (e.g. the misses)"
    )
    parser.add_argument("--skip-narrow", action="store_true", help="leave out the 32-column block checks")
    args = parser.parse_args(argv)
    if args.narrow:
        return _narrow(args.narrow)

    from kernels.linear_attention import configs
    from kernels.linear_attention import triton as la

    chunk_fn, note = _fla()
    if chunk_fn is None:
        print(note)
        return 1
    narrow = [] if args.skip_narrow else [_run_child(["--narrow", str(D)]) for D in (64, 128)]
    for n in narrow:
        print("narrow block_v:", n, flush=True)
    cases = args.shapes or [*linear_attention_grid(args.quick), *(() if args.quick else EXTRA_CASES), *SHORT_CASES]
    rows: list[dict] = []
    for B, H, L, D in cases:
        copies = _qkv(B, L, H, D)
        natives = [tuple(t.transpose(1, 2).contiguous() for t in _views(c, H)) for c in copies]

        def peer(q, k, v):
            return chunk_fn(q, k, v, scale=q.shape[-1] ** -0.5, normalize=False)[0]

        expected = peer(*natives[0]).reshape(B, L, H * D)
        row: dict = {"B": B, "H": H, "L": L, "D": D}
        row["peer_us"] = _time([partial(peer, *n) for n in natives])
        row["peer_kernel_us"] = _kernel_us(partial(peer, *natives[0]))
        route = configs.TWO_PASS_HOPPER[D][0]
        plan = la.two_pass_plan(copies[0].device, B * H, L, D, route)
        row["plan"] = {"group": plan.group, "groups": plan.groups, "chunks": plan.chunks}
        row["route_kernel_us"] = _kernel_us(partial(_forward, copies[0], H, plan))

        timed = partial(_timed, row, copies, H, expected)
        timed("route", plan)
        for name, cfg in {
            "pass1_w4s3": dataclasses.replace(route, states_warps=4, states_stages=3),
            "pass1_w2s3": dataclasses.replace(route, states_warps=2, states_stages=3),
            "pass1_w8s2": dataclasses.replace(route, states_warps=8, states_stages=2),
            # fla's chunk_fwd_kernel_h autotunes 1-8 warps × 2-4 stages over the same walk
            "pass1_w1s3": dataclasses.replace(route, states_warps=1, states_stages=3),
            "pass1_w1s4": dataclasses.replace(route, states_warps=1, states_stages=4),
            "pass1_w2s4": dataclasses.replace(route, states_warps=2, states_stages=4),
            "pass1_w4s4": dataclasses.replace(route, states_warps=4, states_stages=4),
            "pass1_bk32": dataclasses.replace(route, block_k=32),
        }.items():
            # one warp spills the 64-wide state blocks (D 64: 870-1783 µs against 84 at B4 H16 L4096)
            if cfg.block_k > D or (name == "pass1_bk32" and D <= 32) or (cfg.states_warps == 1 and D > 32):
                continue
            timed(name, la.two_pass_plan(copies[0].device, B * H, L, D, cfg))
        if plan.chunks <= 16:  # short walks: every group size that changes the launch
            for group in sorted({1, 2, 3, plan.chunks}):
                g = la.two_pass_plan(copies[0].device, B * H, L, D, dataclasses.replace(route, group=group))
                timed(f"group{group}", g)
        good = {k: v for k, v in row["variants"].items() if v["ok"]}
        best = min(good, key=lambda k: good[k]["us"]["median_us"])
        row["best"] = best
        row["best_speedup"] = good[best]["speedup"]
        rows.append(row)
        print(
            f"B{B} H{H} L{L} D{D} g{plan.group}x{plan.groups}: fla {row['peer_us']['median_us']:.1f} "
            f"({', '.join(f'{k[:18]} {t:.1f}' for k, t in row['peer_kernel_us'].items())}) | ours "
            f"({', '.join(f'{k[:22]} {t:.1f}' for k, t in row['route_kernel_us'].items())}) | "
            + " ".join(f"{k} {v['us']['median_us']:.1f}{'' if v['ok'] else '!'}" for k, v in row["variants"].items())
            + f" | best {best} {row['best_speedup']:.2f}x",
            flush=True,
        )
        write_results(args.out, rows, peer=note, narrow=narrow, complete=False)
        del copies, natives
        torch.cuda.empty_cache()
    write_results(args.out, rows, peer=note, narrow=narrow, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
