"""A norm folded into the linear after it (``linear(..., norm=)``), on the GPU (issue #15 item 4).

    PYTHONPATH=$PWD python benchmarks/linear_norm_fold.py [--out F] [--archs 16] [--seed 7] [--quick]

Two parts, every time a CUDA-graph replay over input copies rotated past L2 (bf16, random
normal inputs; ``benchmarks/_timing.py``: median and IQR of one call), each variant checked
against an fp32 reference first (relative Frobenius error recorded):

- ``op`` rows, per (M, K, N, activation, norm) over the model's norm → linear pairs (qkv: N = 3K,
  no activation; MLP up: N = 4K, GELU), rows whose means sit away from zero:
  - ``fused``: ``linear(x, W', b', norm=)`` on the fused Triton kernel (route forced);
  - ``cublas_norm``: the norm kernel (unit affine) then the cuBLAS route (route forced): what
    ``linear(..., norm=)`` runs where ``prefers_cublas(..., norm=True)`` says so;
  - ``unfolded``: ``kernels.norm`` (with γ, β) then ``linear`` on the route its rule picks without
    a norm: the model's path before the fold;
  - ``peer``: ``F.layer_norm`` / ``F.rms_norm`` then ``F.linear`` (+ ``F.gelu``): what a user gets
    by default in torch.
- ``model`` rows, per architecture of ``model_vs_compile.py``'s list (same seed, so the rows sit
  beside its compile rows) and shape: ``TritonModel`` with the norms folded (the default) and not
  (``fold_norms=False``), and with every folded linear on the fused kernel (``NORM_FUSED_MAX_K``
  and ``NORM_FUSED_MAX_X`` lifted), each checked against the torch model in bf16 (norm scales
  and shifts drawn away from (1, 0) first).

The JSON is rewritten after every row.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._timing import copies_for_l2, time_graph, write_results  # noqa: E402

OP_M = (256, 1024, 2048, 4096, 8192, 16384)
OP_K = (96, 256, 512)
QUICK_M, QUICK_K = (256, 8192), (256,)
MODEL_SHAPES = ("1x256", "8x1024")
TOLERANCE = 3e-2


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    a, e = a.float(), e.float()
    return float("nan") if not torch.isfinite(a).all() else ((a - e).norm() / e.norm()).item()


def op_row(M: int, K: int, N: int, activation: str | None, norm: str) -> dict:
    import kernels.linear.triton as lt
    from kernels.linear import reference as ref
    from kernels.norm import layer_norm, rms_norm

    gen = torch.Generator(device="cuda").manual_seed(M * 7 + K * 3 + N + (norm == "layernorm"))
    dev = dict(device="cuda")
    gamma = 1 + 0.3 * torch.randn(K, generator=gen, **dev)
    beta = 0.3 * torch.randn(K, generator=gen, **dev) if norm == "layernorm" else None
    w32 = torch.randn(N, K, generator=gen, **dev) / K**0.5
    b32 = torch.randn(N, generator=gen, **dev)
    wf32, bf32 = ref.fold_norm(gamma, beta, w32, b32)
    w, b, wf, bf = (t.to(torch.bfloat16) for t in (w32, b32, wf32, bf32))
    g16 = gamma.to(torch.bfloat16)
    be16 = None if beta is None else beta.to(torch.bfloat16)
    sums = ref.weight_sums(wf)
    copies = min(8, copies_for_l2(2 * (M * K + M * N)))
    xs = [
        (torch.randn(M, K, generator=gen, **dev) + 4 * torch.randn(M, 1, generator=gen, **dev)).to(torch.bfloat16)
        for _ in range(copies)
    ]
    expected = ref.linear(xs[0], wf32, bf32, activation=activation, norm=norm)

    def normed(x):
        return layer_norm(x, g16, be16) if norm == "layernorm" else rms_norm(x, g16)

    def torch_norm(x):
        return F.layer_norm(x, (K,), g16, be16) if norm == "layernorm" else F.rms_norm(x, (K,), g16, 1e-5)

    act = {None: lambda v: v, "gelu": F.gelu}[activation]
    variants = {
        "fused": ("triton", lambda x: lt.linear(x, wf, bf, activation=activation, norm=norm, weight_sums=sums)),
        "cublas_norm": ("cublas", lambda x: lt.linear(x, wf, bf, activation=activation, norm=norm)),
        "unfolded": (None, lambda x: lt.linear(normed(x), w, b, activation=activation)),
        "peer": (None, lambda x: act(F.linear(torch_norm(x), w, b))),
    }
    row: dict = {"part": "op", "M": M, "K": K, "N": N, "activation": activation, "norm": norm}
    for name, (route, fn) in variants.items():
        lt.set_route(route)
        try:
            row[f"{name}_rel_err"] = _rel(fn(xs[0]), expected)
            row[f"{name}_us"] = time_graph([lambda x=x, fn=fn: fn(x) for x in xs])
            if name == "unfolded":
                row["unfolded_route"] = lt.last_route()
        finally:
            lt.set_route(None)
    from kernels.linear import configs

    row["rule_cublas"] = configs.prefers_cublas((9, 0), configs.m_bucket(M), N, K, activation, False, norm=True)
    row["fused_over_unfolded"] = row["fused_us"].median_us / row["unfolded_us"].median_us
    row["fused_over_cublas_norm"] = row["fused_us"].median_us / row["cublas_norm_us"].median_us
    row["fused_over_peer"] = row["fused_us"].median_us / row["peer_us"].median_us
    return row


def model_rows(index: int, arch, shape_text: str) -> dict:
    from kernels.linear import configs
    from nas.latency import memory, parse_shape
    from nas.models import build, to_triton

    shape = parse_shape(shape_text)
    model = build(arch, seed=0).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(index)
    with torch.no_grad():  # norm scales and shifts away from (1, 0): a fold that dropped one shows
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen, device="cuda"))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen, device="cuda"))
    torch_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    act = memory(arch, shape).peak_activation_bytes
    inputs = [
        torch.randint(0, arch.vocab_size, (shape.batch, shape.seq_len), device="cuda")
        for _ in range(min(8, copies_for_l2(act)))
    ]
    from benchmarks.model_vs_compile import describe

    row: dict = {
        "part": "model",
        "arch_index": index,
        "arch": describe(arch),
        "spec": arch.to_dict(),
        "shape": shape_text,
    }
    with torch.no_grad():
        expected = torch_bf16(inputs[0])
        variants = {"folded": (True, False), "unfolded": (False, False), "folded_all_fused": (True, True)}
        for name, (fold, all_fused) in variants.items():
            saved = configs.NORM_FUSED_MAX_K, configs.NORM_FUSED_MAX_X
            if all_fused:
                configs.NORM_FUSED_MAX_K, configs.NORM_FUSED_MAX_X = 1 << 30, 1 << 62
            try:
                tm = to_triton(model, fold_norms=fold)
                row[f"{name}_rel_err"] = _rel(tm(inputs[0]), expected)
                row[f"{name}_us"] = time_graph([lambda x=x, tm=tm: tm.forward(x) for x in inputs])
            finally:
                configs.NORM_FUSED_MAX_K, configs.NORM_FUSED_MAX_X = saved
    row["folded_over_unfolded"] = row["folded_us"].median_us / row["unfolded_us"].median_us
    row["all_fused_over_folded"] = row["folded_all_fused_us"].median_us / row["folded_us"].median_us
    row["correct"] = all(v <= TOLERANCE for k, v in row.items() if k.endswith("_rel_err"))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/linear_norm_fold_h200.json")
    parser.add_argument("--archs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="two M, one K, four architectures")
    parser.add_argument("--skip-ops", action="store_true")
    args = parser.parse_args()
    from benchmarks.model_vs_compile import architectures
    from kernels.linear import configs

    rows: list[dict] = []
    note = dict(
        norm_fused_max_k=configs.NORM_FUSED_MAX_K,
        norm_fused_max_x=configs.NORM_FUSED_MAX_X,
        peer="F.layer_norm / F.rms_norm then F.linear (+ F.gelu), eager torch, captured in the same graph",
    )
    if not args.skip_ops:
        for M in QUICK_M if args.quick else OP_M:
            for K in QUICK_K if args.quick else OP_K:
                for N, activation in ((3 * K, None), (4 * K, "gelu")):
                    for norm in ("layernorm", "rmsnorm"):
                        row = op_row(M, K, N, activation, norm)
                        rows.append(row)
                        print(
                            f"op M{M} K{K} N{N} {activation} {norm}: fused {row['fused_us'].median_us:.1f} "
                            f"cublas+norm {row['cublas_norm_us'].median_us:.1f} unfolded "
                            f"{row['unfolded_us'].median_us:.1f} ({row['unfolded_route']}) peer "
                            f"{row['peer_us'].median_us:.1f} µs",
                            flush=True,
                        )
                        write_results(args.out, rows, **note, complete=False)
    archs = architectures(args.seed, 4 if args.quick else args.archs)
    for i, arch in enumerate(archs):
        for shape in MODEL_SHAPES:
            row = model_rows(i, arch, shape)
            rows.append(row)
            extra = f" all-fused {row['folded_all_fused_us'].median_us:.1f}"
            print(
                f"model {i} {row['arch']} {shape}: folded {row['folded_us'].median_us:.1f} unfolded "
                f"{row['unfolded_us'].median_us:.1f}{extra} µs ({row['folded_over_unfolded']:.3f}) "
                f"correct {row['correct']}",
                flush=True,
            )
            write_results(args.out, rows, **note, complete=False)
    write_results(args.out, rows, **note, complete=True)


if __name__ == "__main__":
    main()
