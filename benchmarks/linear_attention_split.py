"""Linear-attention sequence-split sweep: ours under explicit launch configs (64-token chunks,
value blocks 16 and 32, split 1-32 segments) against fla-core's ``chunk_linear_attn`` at the
cases of ``kernels_attention.py`` (``LIN_CASES``), identity and elu+1 maps, bf16.

    PYTHONPATH=$PWD python benchmarks/linear_attention_split.py [--out DIR]

The data behind ``kernels/linear_attention/configs.split_for``. Times are CUDA-graph replays over
input copies rotated past L2 (``benchmarks/_timing.py``, 20 timed replays): median µs per call.
Each entry is ``[median, IQR]`` µs. Every config's output is checked against the fp32 reference
(relative error > 2e-2 is recorded as ``<config> ERR``). Writes ``linear_attention_split_<gpu>.json``
(e.g. ``_h200``) into ``--out`` (default benchmarks/results), rewritten after every case.
"""

from __future__ import annotations

import os

os.environ.setdefault("FLA_CACHE_RESULTS", "0")

import argparse  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from benchmarks._timing import time_graph, write_results  # noqa: E402
from benchmarks.kernels_attention import LIN_CASES, RESULTS, _fla, _fla_call, _inputs, _rel_err, _views  # noqa: E402
from kernels.linear_attention import reference as ref  # noqa: E402
from kernels.linear_attention import triton as la  # noqa: E402


def _gpu_slug() -> str:
    """ "NVIDIA H200" → "h200": the results file's suffix."""
    return torch.cuda.get_device_name(0).split()[-1].lower().replace("-", "_")


def main(out_dir: str | Path = RESULTS) -> Path:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/linear_attention_split.py needs a CUDA device")
    path = Path(out_dir) / f"linear_attention_split_{_gpu_slug()}.json"
    torch.manual_seed(0)
    cla, note = _fla()
    rows = []
    t0 = time.time()
    for B, H, D, L in LIN_CASES:
        copies = _inputs(B, L, H, D)
        views = [_views(c, H) for c in copies]
        natives = [tuple(t.transpose(1, 2).contiguous() for t in v) for v in views]
        for fm in ("identity", "elu+1"):
            row: dict = {"case": f"{fm} B{B} H{H} D{D} L{L}"}
            expected = ref.linear_attention(*views[0], feature_map=fm)
            if cla is not None:
                t = time_graph([partial(_fla_call, cla, *n, fm) for n in natives], reps=20)
                row["fla"] = [round(t.median_us, 2), round(t.iqr_us, 2)]
            chunks = -(-L // 64)
            for bv in sorted({min(32, D), 16}):
                for split in (1, 2, 4, 8, 16, 32):
                    if split > chunks:
                        continue
                    cfg = la.ChunkConfig(64, bv, 4, 2, split=split)
                    err = _rel_err(la.linear_attention_qkv(copies[0], H, feature_map=fm, config=cfg), expected)
                    t = time_graph(
                        [partial(la.linear_attention_qkv, c, H, feature_map=fm, config=cfg) for c in copies], reps=20
                    )
                    row[f"bv{bv} s{split}"] = [round(t.median_us, 2), round(t.iqr_us, 2)]
                    if err > 2e-2:
                        row[f"bv{bv} s{split} ERR"] = err
            rows.append(row)  # written after every case: a run cut short keeps what it measured
            best = min((v[0], k) for k, v in row.items() if k.startswith("bv") and not k.endswith("ERR"))
            print(row["case"], "fla", row.get("fla"), "best", best, f"{time.time() - t0:.0f}s", flush=True)
            write_results(path, rows, dtype="torch.bfloat16", fla=note)
        del copies, views, natives
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="folder for linear_attention_split_<gpu>.json")
    main(parser.parse_args().out)
