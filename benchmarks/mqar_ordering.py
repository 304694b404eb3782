"""MQAR ordering on CPU: softmax attention solves multi-query associative recall, linear attention
of the same width falls behind as the number of key/value pairs grows.

Zoology (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", §3 and Fig. 2) finds that attention solves MQAR at every setting, while gated
convolutions and linear attention, whose recurrent state has a fixed size, degrade as the number
of key/value pairs grows relative to the model width. This script checks that ordering at small
settings a 2-core CPU trains in minutes:

    small   V=64,  T=32, kv=4
    medium  V=128, T=64, kv=8
    hard    V=128, T=64, kv=16   (more pairs at the same width, length and state size)

Both models have 2 layers of width 64, 4 heads, a short causal convolution of 4 over q/k/v (as in
the search spaces) and an MLP; linear attention uses the elu+1 feature map. Each (model, setting)
is trained through ``nas.train.train`` with the library's AdamW at every learning rate of a small
grid, with the same steps and batch for both models, and scored by its best learning rate (as
Zoology reports the best of an lr sweep). This is an equal-budget comparison of short runs, not a
converged one: the claims it records are what was measured here.

Claims written into the JSON:
- ``attention_small_ge_0.95``: attention reaches >= 0.95 test accuracy at the small setting.
- ``linear_below_attention_hardest``: linear attention scores lower than attention at the hardest
  setting run.

    python benchmarks/mqar_ordering.py --out benchmarks/results/mqar_ordering.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from nas.models import build
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from nas.tasks.registry import load_task
from nas.train import TrainingDiverged, train

D_MODEL = 64
HEADS = 4
SHORT_CONV = 4
DEPTH = 2
FEATURE_MAP = "elu+1"
BATCH = 32
SMALL_TARGET = 0.95  # accuracy the issue asks of attention at the small setting
MODELS = ("attention", "linear_attention")


@dataclass(frozen=True)
class Setting:
    name: str
    task: str  # a load_task spec
    steps: int  # the same for both models


# Steps grow with the setting: attention's recall "clicks" after ~150 steps at kv=4 and ~400 at kv=16.
SETTINGS = (
    Setting("small", "mqar:vocab_size=64,seq_len=32,num_kv_pairs=4", 300),
    Setting("medium", "mqar:vocab_size=128,seq_len=64,num_kv_pairs=8", 600),
    Setting("hard", "mqar:vocab_size=128,seq_len=64,num_kv_pairs=16", 700),
)
LRS = (5e-3, 1e-2)
QUICK_LRS = (5e-3,)


def _arch(mixer: str, vocab_size: int, n_out: int, readout: str) -> ArchSpec:
    feature_map = FEATURE_MAP if mixer == "linear_attention" else None
    layer = LayerSpec(mixer=mixer, heads=HEADS, feature_map=feature_map, short_conv=SHORT_CONV)
    return ArchSpec(d_model=D_MODEL, layers=(layer,) * DEPTH, vocab_size=vocab_size, n_out=n_out, readout=readout)


def _run(mixer: str, setting: Setting, lr: float, seed: int) -> dict:
    """One training run; a diverged run scores 0 and says so."""
    task = load_task(setting.task, seed=seed)
    arch = _arch(mixer, task.vocab_size, task.n_out, task.readout)
    spec = TrainSpec(optimizer="adamw", lr=lr, steps=setting.steps, batch_size=BATCH, seed=seed)
    model = build(arch, task, seed=seed)
    start = time.perf_counter()
    try:
        r = train(model, task, spec, device="cpu")
    except TrainingDiverged as err:
        return dict(
            lr=lr,
            accuracy=0.0,
            test_loss=None,
            steps=err.step,
            seconds=round(time.perf_counter() - start, 2),
            stopped=f"diverged: {err}",
        )
    return dict(
        lr=lr,
        accuracy=r.accuracy,
        test_loss=r.test_loss,
        steps=r.steps,
        seconds=round(r.seconds, 2),
        stopped=r.stopped,
        final_train_loss=r.curve[-1][1] if r.curve else None,
    )


def _table(results: list[dict], lrs: tuple[float, ...]) -> Table:
    table = Table(
        title=f"MQAR, {DEPTH} layers, d={D_MODEL}, heads={HEADS}, short_conv={SHORT_CONV}, AdamW, batch {BATCH}"
    )
    for col in ("setting", "task", "model", "steps", *(f"acc @ lr {lr:g}" for lr in lrs), "best acc", "seconds"):
        table.add_column(col, justify="left" if col in ("setting", "task", "model") else "right")
    for row in results:
        by_lr = {run["lr"]: run for run in row["runs"]}
        table.add_row(
            row["setting"],
            row["task"].removeprefix("mqar:"),
            row["model"],
            str(row["steps"]),
            *(f"{by_lr[lr]['accuracy']:.3f}" for lr in lrs),
            f"{row['best_accuracy']:.3f}",
            f"{sum(run['seconds'] for run in row['runs']):.1f}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mqar_ordering.json"))
    parser.add_argument("--quick", action="store_true", help=f"one learning rate ({QUICK_LRS[0]:g}) instead of {LRS}")
    parser.add_argument("--seed", type=int, default=0, help="task, init and batch-order seed")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 because these tiny ops lose more to contention on a "
        "shared box than they gain (2 threads ran ~5x slower here under load)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    console = Console()
    lrs = QUICK_LRS if args.quick else LRS
    wall = time.perf_counter()
    results = []
    for setting in SETTINGS:
        for mixer in MODELS:
            runs = []
            for lr in lrs:
                runs.append(_run(mixer, setting, lr, args.seed))
                console.log(
                    f"{setting.name:6s} {mixer:16s} lr={lr:g}: acc={runs[-1]['accuracy']:.3f} "
                    f"in {runs[-1]['seconds']:.1f}s"
                )
            best = max(runs, key=lambda run: run["accuracy"])
            results.append(
                dict(
                    setting=setting.name,
                    task=setting.task,
                    model=mixer,
                    steps=setting.steps,
                    best_lr=best["lr"],
                    best_accuracy=best["accuracy"],
                    runs=runs,
                )
            )
    total = time.perf_counter() - wall

    def best(setting: str, mixer: str) -> float:
        return next(r["best_accuracy"] for r in results if r["setting"] == setting and r["model"] == mixer)

    small, hardest = SETTINGS[0].name, SETTINGS[-1].name
    claims = {
        f"attention_small_ge_{SMALL_TARGET}": best(small, "attention") >= SMALL_TARGET,
        "linear_below_attention_hardest": best(hardest, "linear_attention") < best(hardest, "attention"),
        "linear_below_attention_per_setting": {
            s.name: best(s.name, "linear_attention") < best(s.name, "attention") for s in SETTINGS
        },
    }
    console.print(_table(results, lrs))
    for claim, holds in claims.items():
        console.print(f"{claim}: {holds}")
    console.print(f"total {total:.1f}s")

    record = dict(
        benchmark="mqar_ordering",
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch=torch.__version__,
        python=platform.python_version(),
        cpu=dict(
            processor=platform.processor() or platform.machine(),
            cpu_count=os.cpu_count(),
            torch_threads=torch.get_num_threads(),
        ),
        model=dict(
            depth=DEPTH,
            d_model=D_MODEL,
            heads=HEADS,
            short_conv=SHORT_CONV,
            linear_feature_map=FEATURE_MAP,
            mixers=list(MODELS),
        ),
        train=dict(
            optimizer="adamw", batch_size=BATCH, lrs=list(lrs), seed=args.seed, selection="best test accuracy over lrs"
        ),
        settings=[dict(name=s.name, task=s.task, steps=s.steps) for s in SETTINGS],
        results=results,
        claims=claims,
        total_seconds=round(total, 1),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
