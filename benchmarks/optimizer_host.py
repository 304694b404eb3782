"""Host side of the fused optimizer step in the training loop (GPU).

    PYTHONPATH=$PWD python benchmarks/optimizer_host.py OUT.json

1. tokens/s of ``nas.train``'s loop on the hybrid_small task shape (``train_throughput.py``'s
   candidate, 300 steps) with ``nas.optim.AdamW`` when ``zero_grad`` frees the grads
   (``set_to_none=True``: autograd hands back new grad tensors, often at new addresses, and the
   fused step's pointer tables, cached by address, are rebuilt) vs keeps them
   (``set_to_none=False``), and the peer ``torch.optim.AdamW(fused=True)`` + ``clip_grad_norm_``;
   ``table_builds`` counts pointer-table constructions (grad norm and step, each step).
2. Host wall time of one optimizer step alone: 40 fp32 128×128 params, clip 1.0, no sync inside.

Found on an H200 (results/optimizer_host_h200.json): 640 table builds in 320 steps when grads
are freed, 4 when kept; hence ``nas.train`` keeps them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchmarks.train_throughput as tt  # noqa: E402
import kernels.optim.triton as fused  # noqa: E402
from nas.optim import AdamW, GradOptions  # noqa: E402

builds = [0]


class _CountingTables(fused._Tables):
    def __init__(self, *args, **kwargs) -> None:
        builds[0] += 1
        super().__init__(*args, **kwargs)


def main() -> None:
    fused._Tables = _CountingTables
    task_spec, batch = tt.SHAPES["hybrid_small task B32xT32"]
    out = {}
    for label, set_to_none in (("ours_set_to_none", True), ("ours_keep_grads", False), ("peer", True)):
        real = torch.optim.Optimizer.zero_grad
        torch.optim.Optimizer.zero_grad = lambda self, set_to_none=True, _r=real, _s=set_to_none: _r(self, _s)
        builds[0] = 0
        try:
            tps, _ = tt.tokens_per_second(task_spec, batch, 300, peer=label == "peer")
        finally:
            torch.optim.Optimizer.zero_grad = real
        out[label] = {"tokens_per_s": round(tps), "table_builds": builds[0]}
        print(label, out[label], flush=True)
    params = [torch.nn.Parameter(torch.randn(128, 128, device="cuda")) for _ in range(40)]
    for p in params:
        p.grad = torch.randn_like(p)
    for name, opt in (
        ("ours", AdamW(params, grad_options=GradOptions(max_norm=1.0))),
        ("torch_fused", torch.optim.AdamW(params, fused=True)),
    ):

        def step(name=name, opt=opt) -> None:
            if name == "torch_fused":
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            step()
        out[f"step_host_us_{name}"] = round((time.perf_counter() - start) / 200 * 1e6, 1)
        torch.cuda.synchronize()
        print(name, out[f"step_host_us_{name}"])
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
