"""CPU training beside other busy processes: OpenMP's wait policy and the intra-op thread count.

torch's CPU ops run on an OpenMP pool (libgomp on Linux) of one thread per core. Under libgomp's
default wait policy a thread that reaches a barrier first spins before it sleeps; when another
process holds a core, the thread the barrier waits for is descheduled and its peers spin through
their time slices, so a training step can take several times longer than the lost core explains.
A shorter spin (``GOMP_SPINCOUNT``) or ``OMP_WAIT_POLICY=PASSIVE`` (no spin) lets the waiting
thread give its core back sooner. ``nas`` sets ``GOMP_SPINCOUNT=10000`` for its own processes
unless the environment sets a spin count or a wait policy (``nas.cli``).

Times ``--steps`` training steps (``nas.train.train``) of two candidates in a fresh process per
run, for each setting of ``--policies`` (libgomp's ``default``: spin 300,000 times, then sleep;
``spin=N``: ``GOMP_SPINCOUNT=N``; ``PASSIVE``: sleep at once) with torch's default thread count
(one per core), and with one thread (no barriers: timed once), beside 0, 1 and 2 CPU-bound
processes (``while True: pass``). Each cell: median and IQR over ``--repeats`` runs, and the final
accuracies (a check that only time changes). Writes ``cpu_wait_policy.json`` into ``--out``.

    python benchmarks/cpu_wait_policy.py [--repeats 3] [--steps 30] [--policies default,spin=10000,PASSIVE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# hybrid_small's task, and its largest block stack; a wider, longer one where threads can help
CANDIDATES = {
    "hybrid_small d128 x4 (B32xT32)": ("mqar:vocab_size=64,seq_len=32,num_kv_pairs=4,n_train=4096,n_test=512", 128, 32),
    "d192 x4 (B32xT64)": ("mqar:vocab_size=128,seq_len=64,num_kv_pairs=8,n_train=2048,n_test=128", 192, 32),
}

_CHILD = """
import sys, time, torch
sys.path.insert(0, {root!r})
from nas.models import build
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from nas.tasks import load_task
from nas.train import train
threads, task_spec, d, batch, steps = {threads}, {task!r}, {d}, {batch}, {steps}
if threads:
    torch.set_num_threads(threads)
task = load_task(task_spec)
mixers = ("attention", "linear_attention", "attention", "linear_attention")
layers = tuple(
    LayerSpec(m, heads=4, mlp_ratio=4.0, feature_map="elu+1" if m == "linear_attention" else None, short_conv=4)
    for m in mixers
)
arch = ArchSpec(d, layers, task.vocab_size, task.n_out)
model = build(arch, task, seed=0)
start = time.perf_counter()
result = train(model, task, TrainSpec(steps=steps, batch_size=batch), device="cpu")
print(time.perf_counter() - start, result.accuracy, torch.get_num_threads())
"""


def _policy_env(policy: str) -> dict[str, str]:
    """``default`` (libgomp's: spin, then sleep), ``PASSIVE``/``ACTIVE``, or ``spin=N`` (GOMP_SPINCOUNT)."""
    if policy == "default":
        return {}
    if policy.startswith("spin="):
        return {"GOMP_SPINCOUNT": policy.removeprefix("spin=")}
    return {"OMP_WAIT_POLICY": policy}


def _one(policy: str, threads: int, candidate: tuple[str, int, int], steps: int, hogs: int) -> dict:
    drop = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in drop} | _policy_env(policy)
    task, d, batch = candidate
    code = _CHILD.format(root=str(ROOT), threads=threads, task=task, d=d, batch=batch, steps=steps)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        time.sleep(0.2 if hogs else 0)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    seconds, accuracy, used = out.stdout.split()
    return {"seconds": float(seconds), "accuracy": float(accuracy), "threads": int(used)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hogs", default="0,1,2", help="CPU-bound processes beside the training, comma-separated")
    ap.add_argument(
        "--policies", default="default,spin=10000,PASSIVE", help="default, PASSIVE, ACTIVE or spin=N, comma-separated"
    )
    ap.add_argument("--threads", default="0,1", help="intra-op threads, comma-separated (0: torch's default)")
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help="which of CANDIDATES, comma-separated")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    for name in args.candidates.split(","):
        candidate = CANDIDATES[name]
        for hogs in (int(h) for h in args.hogs.split(",")):
            for policy in args.policies.split(","):
                for threads in (int(t) for t in args.threads.split(",")):
                    if threads == 1 and policy != args.policies.split(",")[0]:
                        continue  # one thread has no barrier to wait at: timed with the first policy only
                    runs = [_one(policy, threads, candidate, args.steps, hogs) for _ in range(args.repeats)]
                    seconds = sorted(r["seconds"] for r in runs)
                    q = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else [seconds[0]] * 3
                    row = {
                        "candidate": name,
                        "busy_processes": hogs,
                        "wait_policy": policy,
                        "threads": runs[0]["threads"],
                        "median_s": statistics.median(seconds),
                        "iqr_s": q[2] - q[0],
                        "runs_s": seconds,
                        "accuracy": sorted({r["accuracy"] for r in runs}),
                    }
                    rows.append(row)
                    print(
                        f"{name:32s} busy={hogs} {row['wait_policy']:16s} threads={row['threads']} "
                        f"{row['median_s']:7.2f} s (IQR {row['iqr_s']:.2f}) acc {row['accuracy']}",
                        flush=True,
                    )
    out = Path(args.out) / "cpu_wait_policy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu": platform.processor() or platform.machine(),
        "cores": cores,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "steps": args.steps,
        "repeats": args.repeats,
        "results": rows,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
