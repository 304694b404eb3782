"""Does a search-sized training learn long-context MQAR? A probe for ``hybrid_long``'s task.

    PYTHONPATH=$PWD python benchmarks/mqar_long_probe.py [--steps 1500] [--batch 32] [--out DIR]

Trains fixed stacks (all-attention, a 3:1 linear:attention hybrid, all-linear; depth 4, d_model
128, 2 heads, short conv 4, MLP ratio 4, elu+1 linear attention) with ``nas.train.train`` (the
search's own loop and AdamW) on long-context MQAR, by default with a length curriculum
(``curriculum_len``/``curriculum_frac``: the first steps at T=64); any task string can be given,
e.g. with ``short_frac`` (a share of training rows holding a shorter instance: the mixed-length
training Zoology uses, Arora et al. 2023) or dense queries (pairs = T/4). Records test accuracy
at the training rungs and at the end, the loss curve and the seconds. Attention should leave
MQAR's plateau and linear attention should not reach it at this state size, so the accuracy
axis of a search carries the recall/cost trade-off. Writes ``mqar_long_probe_<device>.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import write_results  # noqa: E402

from nas.models import build  # noqa: E402
from nas.spec import ArchSpec, LayerSpec, TrainSpec  # noqa: E402
from nas.tasks.registry import load_task  # noqa: E402
from nas.train import train  # noqa: E402

CURRICULUM = "curriculum_len=64,curriculum_frac=0.7"
TASKS = (
    f"mqar_long:vocab_size=128,seq_len=256,num_kv_pairs=48,n_train=8000,n_test=128,{CURRICULUM}",
    f"mqar_long:vocab_size=2048,seq_len=1024,num_kv_pairs=64,n_train=24000,n_test=256,{CURRICULUM}",
)
STACKS = ("AAAA", "LLLA", "LLLL")


def _layer(c: str, heads: int) -> LayerSpec:
    if c == "A":
        return LayerSpec("attention", heads=heads, short_conv=4)
    return LayerSpec("linear_attention", heads=heads, feature_map="elu+1", short_conv=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--stacks", nargs="*", default=list(STACKS))
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs = []
    for task_str in args.tasks:
        task = load_task(task_str)
        for stack in args.stacks:
            arch = ArchSpec(args.d, tuple(_layer(c, args.heads) for c in stack), task.vocab_size, task.n_out)
            spec = TrainSpec(optimizer="adamw", lr=args.lr, steps=args.steps, batch_size=args.batch, seed=0)
            rungs: list[tuple[int, float]] = []

            def on_rung(step: int, acc: float, rungs=rungs) -> bool:
                rungs.append((step, round(acc, 4)))
                return False

            t0 = time.perf_counter()
            result = train(build(arch, task, seed=0), task, spec, device=device, on_rung=on_rung)
            seconds = time.perf_counter() - t0
            row = {
                "task": task_str,
                "stack": stack,
                "d": args.d,
                "heads": args.heads,
                "steps": result.steps,
                "batch": args.batch,
                "lr": args.lr,
                "accuracy": round(result.accuracy, 4),
                "test_loss": round(result.test_loss, 3),
                "rungs": rungs,
                "curve": [(s, round(v, 3)) for s, v in result.curve[:: max(1, len(result.curve) // 12)]],
                "seconds": round(seconds, 1),
            }
            runs.append(row)
            print(
                f"{stack} {task_str.split(':')[1]}: acc {row['accuracy']} "
                f"rungs {rungs} loss {row['test_loss']} {row['seconds']} s",
                flush=True,
            )
    name = torch.cuda.get_device_name(0).split()[-1].lower() if device.type == "cuda" else "cpu"
    path = write_results(Path(args.out) / f"mqar_long_probe_{name}.json", runs, benchmark=__doc__.splitlines()[0])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
