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

from benchmarks._timing import write_results  # noqa: E402
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


def candidates(D: int) -> list:
    """Two-pass launch configs worth timing at head dim D: 64- and 128-token chunks, 32- and
    64-row state blocks, 64 columns (or D), pass 1 at 1-4 warps and 2-4 stages (pass 2 at 4
    warps for 64-token chunks, 8 for 128)."""
    from kernels.linear_attention.configs import TwoPassConfig

    out = []
    for chunk in (64, 128):
        for bk in sorted({min(32, D), min(64, D)}):
            for warps in (1, 2, 4):
                for stages in (2, 3, 4):
                    out.append(TwoPassConfig(chunk, bk, min(64, D), 4 if chunk == 64 else 8, 2, warps, stages))
    return out


def _check(D: int, cfg: list[int]) -> int:
    """Child process: run one config at two odd shapes against the fp32 reference (0: agrees)."""
    from kernels.linear_attention import reference
    from kernels.linear_attention import triton as la
    from kernels.linear_attention.configs import TwoPassConfig

    for B, H, L in ((3, 5, 1000), (2, 2, 333)):
        qkv = torch.randn(B, L, 3 * H * D, device="cuda", dtype=torch.bfloat16)
        got = la.linear_attention_qkv(qkv, H, feature_map="identity", config=TwoPassConfig(*cfg))
        q, k, v = _views(qkv, H)
        want = reference.linear_attention(q.float(), k.float(), v.float(), feature_map="identity")
        err = _rel_err(got, want)
        torch.cuda.synchronize()
        if not err <= TOLERANCE:
            print(f"D{D} {cfg} B{B} H{H} L{L}: rel_err {err}")
            return 3
    return 0


def _vet(dims: list[int]) -> dict:
    """Every candidate config in its own process (a crash poisons a CUDA context): {(D, cfg): status}."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(D, list(dataclasses.astuple(c))) for D in dims for c in candidates(D)]

    def one(job):
        D, cfg = job
        cmd = [sys.executable, __file__, "--check", str(D), *map(str, cfg)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return {"D": D, "config": cfg, "rc": r.returncode, "tail": (r.stdout + r.stderr)[-300:] if r.returncode else ""}

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--small", action="store_true", help="only shapes with B·H ≤ 64")
    parser.add_argument("--check", nargs="+", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
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
    rows: list[dict] = []
    for B, H, L, D in linear_attention_grid(args.quick):
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
        for cfg in candidates(D):
            if (D, tuple(dataclasses.astuple(cfg))) not in ok:
                continue
            fn = partial(la.linear_attention_qkv, copies[0], H, feature_map="identity", config=cfg)
            err = _rel_err(fn(), expected)
            t = _time([partial(la.linear_attention_qkv, c, H, feature_map="identity", config=cfg) for c in copies])
            two.append({"config": list(dataclasses.astuple(cfg)), "rel_err": err, "us": t, "ok": err <= TOLERANCE})
        good = [r for r in two if r["ok"]]
        best = min(good, key=lambda r: r["us"]["median_us"]) if good else None
        row = {
            "B": B,
            "H": H,
            "L": L,
            "D": D,
            "peer_us": peer_t,
            "peer_kernels": _kernels(partial(peer, *natives[0])),
            "fused_us": fused_t,
            "fused_rel_err": fused_err,
            "fused_speedup": peer_t["median_us"] / fused_t["median_us"],
            "two_pass": two,
            "best_two_pass": best["config"] if best else None,
            "best_two_pass_speedup": peer_t["median_us"] / best["us"]["median_us"] if best else None,
        }
        rows.append(row)
        print(
            f"B{B} H{H} L{L} D{D}: fla {peer_t['median_us']:.1f} fused {fused_t['median_us']:.1f} "
            f"({row['fused_speedup']:.2f}x) best two-pass {best['us']['median_us'] if best else float('nan'):.1f} "
            f"{row['best_two_pass']} ({row['best_two_pass_speedup'] or 0:.2f}x)",
            flush=True,
        )
        write_results(args.out, rows, peer=note, vetted=vetted, complete=False)
        del copies, natives
        torch.cuda.empty_cache()
    write_results(args.out, rows, peer=note, vetted=vetted, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
