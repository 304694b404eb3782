"""Where the norm prologue of the fused linear goes wrong on the GPU (diagnosis, issue #15 item 4).

    PYTHONPATH=$PWD python benchmarks/linear_norm_diagnose.py --out F

Per shape, norm, tiling (every one the tuners hold, the largest included: ``NORM_MAX_TILE`` is
lifted here) and where the row statistics come from (``tile``: the x tile the main loop loads for
the dot; ``load``: a load of their own), the relative error against the fp32 reference and the
share of output rows more than 5 % off. Then the tuned kernel's time with each source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._timing import time_graph, write_results  # noqa: E402

SHAPES = ((4096, 256, 1024), (16384, 96, 288), (2048, 512, 1536), (1000, 384, 808))
TIMED = ((256, 96, 288), (1024, 256, 768), (8192, 96, 288), (2048, 256, 1024))


def main() -> None:
    import kernels.linear.triton as lt
    from kernels.linear import configs
    from kernels.linear import reference as ref

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    configs.NORM_MAX_TILE = 1 << 30
    tilings = [None, *dict.fromkeys((*configs.HOPPER_SHORT_K, *configs.HOPPER, *configs.HOPPER_TMA, configs.SMALL_M))]
    rows: list[dict] = []
    lt.set_route("triton")
    for M, K, N in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(M + K + N)
        x = (torch.randn(M, K, generator=gen, device="cuda") + 4 * torch.randn(M, 1, generator=gen, device="cuda")).to(
            torch.bfloat16
        )
        w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
        b = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
        for norm in ("rmsnorm", "layernorm"):
            expected = ref.linear(x, w, b, norm=norm)
            for stats in ("tile", "load"):
                lt._STATS_FROM = stats
                for cfg in tilings:
                    try:
                        y = lt.linear(x, w, b, norm=norm, config=cfg).float()
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - recorded
                        rows.append(dict(M=M, K=K, N=N, norm=norm, stats=stats, config=repr(cfg), error=str(e)[:200]))
                        continue
                    rel = ((y - expected).norm() / expected.norm()).item()
                    row_err = (y - expected).norm(dim=1) / expected.norm(dim=1)
                    chosen = repr(lt.last_tuned_config()) if cfg is None else repr(cfg)
                    rows.append(
                        dict(
                            M=M,
                            K=K,
                            N=N,
                            norm=norm,
                            stats=stats,
                            config=chosen,
                            tuned=cfg is None,
                            rel_err=rel,
                            rows_off=(row_err > 0.05).float().mean().item(),
                        )
                    )
                    if rel > 1e-2:
                        print(
                            f"BAD M{M} K{K} N{N} {norm} {stats} {chosen[13:]} rel {rel:.3g} rows {rows[-1]['rows_off']:.3f}",
                            flush=True,
                        )
                write_results(args.out, rows, complete=False)
    lt._STATS_FROM = "tile"
    print(f"{sum(1 for r in rows if r.get('rel_err', 1) > 1e-2)} bad of {len(rows)}", flush=True)
    for M, K, N in TIMED:
        gen = torch.Generator(device="cuda").manual_seed(M * K)
        xs = [(torch.randn(M, K, generator=gen, device="cuda") + 2).to(torch.bfloat16) for _ in range(8)]
        w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
        for norm in ("rmsnorm", "layernorm"):
            row = dict(part="time", M=M, K=K, N=N, norm=norm)
            for stats in ("tile", "load"):
                lt._STATS_FROM = stats
                row[f"{stats}_us"] = time_graph([lambda x=x: lt.linear(x, w, None, norm=norm) for x in xs])
                row[f"{stats}_config"] = repr(lt.last_tuned_config())
            lt._STATS_FROM = "tile"
            rows.append(row)
            print(
                f"time M{M} K{K} N{N} {norm}: tile {row['tile_us'].median_us:.2f} load {row['load_us'].median_us:.2f}",
                flush=True,
            )
    lt.set_route(None)
    write_results(args.out, rows, complete=True)


if __name__ == "__main__":
    main()
