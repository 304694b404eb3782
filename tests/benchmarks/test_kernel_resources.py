"""benchmarks/kernel_resources.py compiles for sm_90 without a GPU (Triton's own ptxas), in a
process without the interpreter: pass 1 of the two-pass forward at D 32, specialised as launched,
reports which of its loads the software pipeline prefetches: k and v at every map. Before k was
loaded transposed (commit 43ccfb5) the identity map's k was a synchronous load, transposed in
registers at every chunk of the walk (only v prefetched): the pass-1 gap to fla's chunk_fwd_kernel_h."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernels.linear_attention.triton import FEATURE_MAPS

ROOT = Path(__file__).resolve().parents[2]


def test_pass_1_at_d32_reports_its_prefetched_and_synchronous_loads():
    code = (
        "import json; from benchmarks import kernel_resources as kr;"
        "print(json.dumps(kr.two_pass_states_rows(90, head_dims=(32,), stages_tried=(3,))))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert rows and all("error" not in r for r in rows), [r.get("error") for r in rows]
    assert {r["head_dim"] for r in rows} == {32} and {r["num_stages"] for r in rows} == {3}
    assert {r["feature_map"] for r in rows} == set(FEATURE_MAPS)
    for r in rows:
        assert r["synchronous_loads"] == 0 and r["async_copies"] == 6, r  # k and v, 3 stages each
        assert r["registers"] and r["shared_bytes"] > 0
