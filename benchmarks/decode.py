"""Decoding on the GPU: the linear-attention step against the torch step doing the same math.

    PYTHONPATH=$PWD python benchmarks/decode.py [--out DIR] [--quick]

For every (B, H, D) of B ∈ {1, 4, 16, 64, 256}, H ∈ {4, 8, 16, 32}, D ∈ {32, 64, 128} (``--quick``:
the corners and the acceptance shapes), feature map elu+1 (and identity at a few shapes):
``kernels.linear_attention.linear_attention_step`` (one launch; each head's state columns split
over programs, ``configs.step_config``) and the torch step (``kernels.linear_attention.reference
.step``: the same math in fp32 torch ops, what a user writes without a kernel), both on bf16 q, k,
v and an fp32 state updated in place, timed as CUDA-graph replays (``_timing.time_graph``: median
and IQR of 50 replays of 10 calls; the states rotated over copies larger than L2, as in a model
whose other layers evict them). Achieved bandwidth counts the state read and written (8·D² bytes
per head) plus q, k, v, z and o, and is given as a fraction of a 1 GiB device-to-device copy timed
in the same run (fp32, graph-replayed). Checks every timed step against the torch step first. Writes
``decode_<gpu>.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import copies_for_l2, time_graph, write_results  # noqa: E402

from kernels.linear_attention import configs  # noqa: E402
from kernels.linear_attention import reference as ref  # noqa: E402
from kernels.linear_attention.triton import linear_attention_step  # noqa: E402

BATCHES, HEADS, DIMS = (1, 4, 16, 64, 256), (4, 8, 16, 32), (32, 64, 128)
QUICK = [(1, 8, 128), (1, 4, 32), (16, 32, 128), (16, 4, 64), (64, 16, 64), (256, 16, 64), (256, 32, 128)]


def _copy_tbps() -> float:
    n = 2**28  # 1 GiB of fp32, read and written
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    t = time_graph([lambda: dst.copy_(src)], reps=20, per_replay=5)
    return 2 * 4 * n / (t.median_us * 1e-6) / 1e12


def _inputs(B: int, H: int, D: int, copies: int):
    out = []
    for _ in range(copies):
        q, k, v = (torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        state = torch.randn(B, H, D, D, device="cuda") * 0.01
        z = torch.rand(B, H, D, device="cuda") + 1.0
        out.append((q, k, v, state, z))
    return out


def bench(B: int, H: int, D: int, feature_map: str, copy_tbps: float) -> list[dict]:
    state_bytes = B * H * D * D * 4
    copies = min(copies_for_l2(state_bytes), 256)
    sets = _inputs(B, H, D, copies)
    # correctness: one step of each on clones of the first set
    q, k, v, s, z = sets[0]
    s1, z1, s2, z2 = s.clone(), z.clone(), s.clone(), z.clone()
    ours = linear_attention_step(q, k, v, s1, z1, feature_map=feature_map).float()
    theirs = ref.step(q.float(), k.float(), v.float(), s2, z2, feature_map=feature_map)
    err = ((ours - theirs).norm() / theirs.norm()).item()
    state_err = ((s1 - s2).norm() / s2.norm()).item()
    if err > 2e-2 or state_err > 1e-5:
        raise AssertionError(f"B{B} H{H} D{D} {feature_map}: output error {err:.2e}, state error {state_err:.2e}")
    moved = B * H * (8 * D * D + 3 * D * 2 + (8 * D if feature_map != "identity" else 0) + 2 * D)
    cfg = configs.step_config(torch.device("cuda"), B * H, D, torch.cuda.get_device_properties(0).multi_processor_count)
    rows = []
    for impl, fns in (
        ("ours", [lambda t=t: linear_attention_step(*t[:4], t[4], feature_map=feature_map) for t in sets]),
        ("torch step", [lambda t=t: ref.step(*t[:4], t[4], feature_map=feature_map) for t in sets]),
    ):
        t = time_graph(fns)
        tbps = moved / (t.median_us * 1e-6) / 1e12
        rows.append(
            {
                "B": B,
                "H": H,
                "D": D,
                "feature_map": feature_map,
                "impl": impl,
                "config": {"block_v": cfg.block_v, "num_warps": cfg.num_warps, "programs": B * H * D // cfg.block_v}
                if impl == "ours"
                else None,
                "median_us": t.median_us,
                "iqr_us": t.iqr_us,
                "q1_us": t.q1_us,
                "q3_us": t.q3_us,
                "state_copies": copies,
                "bytes": moved,
                "tbps": tbps,
                "copy_fraction": tbps / copy_tbps,
                "rel_error_vs_torch": err if impl == "ours" else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    copy_tbps = _copy_tbps()
    print(f"copy: {copy_tbps:.2f} TB/s")
    shapes = QUICK if args.quick else [(b, h, d) for b in BATCHES for h in HEADS for d in DIMS]
    cases = [(b, h, d, "elu+1") for b, h, d in shapes] + [(b, h, d, "identity") for b, h, d in QUICK]
    rows = []
    for B, H, D, fm in cases:
        got = bench(B, H, D, fm, copy_tbps)
        rows += got
        ours, peer = got
        print(
            f"B{B:<3d} H{H:<2d} D{D:<3d} {fm:8s} ours {ours['median_us']:7.2f} µs (IQR {ours['iqr_us']:.2f}, "
            f"{ours['copy_fraction']:5.1%} of copy, block_v {ours['config']['block_v']}) | torch step "
            f"{peer['median_us']:7.2f} µs | {peer['median_us'] / ours['median_us']:5.2f}x",
            flush=True,
        )
    name = torch.cuda.get_device_name(0).split()[-1].lower()
    path = write_results(
        Path(args.out) / f"decode_{name}.json",
        rows,
        copy_tbps=copy_tbps,
        peer="kernels.linear_attention.reference.step (fp32 torch ops on the same bf16 inputs / fp32 state)",
        timing="CUDA-graph replay, median of 50 replays of 10 calls; states rotated over copies larger than L2",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
