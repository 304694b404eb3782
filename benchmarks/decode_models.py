"""Whole-model decoding at long context: per-token latency and cache bytes of all-attention vs
1:1, 3:1 and 7:1 linear:attention hybrids vs all-linear, of equal width and depth (issue #14).

Each model: width 1024, 16 blocks, 8 heads (head dim 128), MLP ratio 4, short conv 4; linear
layers use elu+1 (normalized) — the ratios Qwen3-Next and Kimi Linear (3:1) and MiniMax-01 (7:1)
use. One step is ``nas.latency.measure_decode``: the model's ``TritonDecoder`` checked against
the torch model's own steps, then one whole step (all layers) replayed from one CUDA graph, median
and IQR of ≥ 20 samples of 8 replays, on caches of random contents at contexts 4K-128K, batch 1
(and batch 8 at 32K). For each row: the bytes one step moves (``decode_work``: weights once, the
KV cache of every attention layer, the linear layers' fp32 states read and written), the
achieved bandwidth over them and its fraction of an SM copy kernel timed in the same run (the
copy peer of ``benchmarks/decode.py``), the resident cache (``cache_memory``), and the
prediction of ``--profile`` (its calibrated decode model, if it has one).

``--precision`` times each model also at stored precisions (issue #51): ``kv8`` (an fp8 KV cache),
``state16`` (bf16 states), ``w8`` (fp8 block weights), ``all`` (the three), each step then the
model's ``StoredDecoder``, checked against the torch model decoding at that precision; the rows
name it and ``speedup_vs_full`` compares with the same model at full precision in the same run.

Writes ``decode_models_<gpu>.json`` (``decode_models_<gpu>_precision.json`` with ``--precision``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import RESULTS, device_slug, write_results  # noqa: E402
from decode import _copy_tbps  # noqa: E402

from hardware_profiles import load_profile  # noqa: E402
from nas.latency import LatencyCache, cache_memory, decode_work, measure_decode, predict_decode  # noqa: E402
from nas.models import build  # noqa: E402
from nas.spec import ArchSpec, LayerSpec  # noqa: E402

WIDTH, DEPTH, HEADS, VOCAB = 1024, 16, 8, 32000
CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
MIXES = {"all-attention": 0, "1:1": 1, "3:1": 3, "7:1": 7, "all-linear": None}  # linear layers per attention layer
PRECISIONS = {  # name → the fields every block that holds them takes
    "full": {},
    "kv8": {"kv_dtype": "fp8"},
    "state16": {"state_dtype": "bf16"},
    "w8": {"weight_dtype": "fp8"},
    "all": {"kv_dtype": "fp8", "state_dtype": "bf16", "weight_dtype": "fp8"},
}


def arch(linear_per_attention: int | None, precision: str = "full") -> ArchSpec:
    """16 blocks; every (n+1)-th an attention layer for an n:1 hybrid (the last of each group);
    ``precision`` one of ``PRECISIONS``."""
    attn = LayerSpec("attention", heads=HEADS, short_conv=4, mlp_ratio=4.0)
    lin = LayerSpec("linear_attention", heads=HEADS, feature_map="elu+1", short_conv=4, mlp_ratio=4.0)
    if linear_per_attention is None:
        layers = [lin] * DEPTH
    else:
        group = linear_per_attention + 1
        layers = [attn if (i + 1) % group == 0 else lin for i in range(DEPTH)]
    fields = PRECISIONS[precision]
    layers = [dataclasses.replace(la, **{k: v for k, v in fields.items() if la.stores(k)}) for la in layers]
    return ArchSpec(WIDTH, tuple(layers), VOCAB, VOCAB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/decode_models_<gpu>.json)")
    parser.add_argument("--profile", default="h200", help="profile whose decode model predicts each row")
    parser.add_argument("--quick", action="store_true", help="contexts 4K and 32K only")
    parser.add_argument("--mixes", nargs="+", choices=list(MIXES), default=list(MIXES), help="these models only")
    parser.add_argument(
        "--precision", nargs="+", choices=list(PRECISIONS), default=None, help="also time these stored precisions"
    )
    args = parser.parse_args()
    precisions = ["full", *(p for p in args.precision if p != "full")] if args.precision else ["full"]
    profile = load_profile(args.profile)
    copy_tbps = [_copy_tbps(2, kernel=True)]
    print(f"copy peer (SM kernel, 2 GiB): {copy_tbps[0]:.2f} TB/s", flush=True)
    contexts = (4096, 32768) if args.quick else CONTEXTS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = LatencyCache(Path(tmp) / "latency.json")
        for (name, n), precision in ((m, p) for m in MIXES.items() if m[0] in args.mixes for p in precisions):
            a = arch(n, precision)
            if precision != "full" and a.full_precision:
                continue  # e.g. kv8 of the all-linear model: nothing to store narrower
            model = build(a, seed=0).cuda()
            for batch, context in [(1, c) for c in contexts] + [(8, 32768)]:
                lat = measure_decode(model, batch, context, cache=cache)
                work = decode_work(a, context, batch)
                moved = work.weight_bytes + work.cache_bytes + work.state_bytes
                held = cache_memory(a, context, batch)
                pred = predict_decode(a, batch, context, profile)
                row = {
                    "model": name,
                    "precision": precision,
                    "arch": a.summary(),
                    "attention_layers": sum(la.mixer == "attention" for la in a.layers),
                    "batch": batch,
                    "context": context,
                    "median_ms": lat.median_ms,
                    "iqr_ms": lat.iqr_ms,
                    "notes": dict(lat.notes),
                    "step_bytes": moved,
                    "weight_bytes": work.weight_bytes,
                    "kv_read_bytes": work.cache_bytes,
                    "state_bytes": work.state_bytes,
                    "launches": work.launches,
                    "tbps": moved / (lat.median_ms * 1e-3) / 1e12,
                    "cache_bytes": held.cache_bytes,
                    "cache_mb_with_weights": held.total_mb,
                    "predicted_ms": pred.median_ms,
                    "predicted_label": pred.label(),
                }
                full = next(
                    (
                        r
                        for r in rows
                        if (r["model"], r["precision"], r["batch"], r["context"]) == (name, "full", batch, context)
                    ),
                    None,
                )
                if full is not None and precision != "full":
                    row["speedup_vs_full"] = full["median_ms"] / lat.median_ms
                rows.append(row)
                print(
                    f"{name:13s} {precision:7s} B{batch:<2d} N{context:>6d}: {lat.median_ms * 1e3:8.1f} µs (IQR "
                    f"{lat.iqr_ms * 1e3:.1f}), {moved / 2**20:8.1f} MiB/step, {row['tbps']:.2f} TB/s, cache "
                    f"{held.cache_bytes / 2**20:8.1f} MiB | predicted {pred.median_ms * 1e3:8.1f} µs",
                    flush=True,
                )
            del model
            torch.cuda.empty_cache()
    copy_tbps.append(_copy_tbps(2, kernel=True))
    peer = max(copy_tbps)
    for r in rows:
        r["copy_fraction"] = r["tbps"] / peer
    tag = "_precision" if len(precisions) > 1 else ""
    out = args.out or RESULTS / f"decode_models_{device_slug(torch.cuda.get_device_name(0))}{tag}.json"
    write_results(
        out,
        rows,
        copy_tbps=peer,
        copy_tbps_runs=copy_tbps,
        copy_peer="torch.mul(src, 1, out=dst) over 2 GiB fp32, graph-replayed (benchmarks/decode.py)",
        width=WIDTH,
        depth=DEPTH,
        heads=HEADS,
        vocab=VOCAB,
        profile=args.profile,
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
