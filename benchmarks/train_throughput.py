"""Training throughput on a GPU: the library's fused optimizer vs torch's, and search trials/hour.

    PYTHONPATH=$PWD python benchmarks/train_throughput.py [--search-seconds 60] [--per-gpu 4] [--out DIR]

1. tokens/s of the training loop (``nas.train.train``: bf16 autocast, data on the device, batched
   NaN checks) for a hybrid_small-sized candidate, with ``nas.optim.AdamW`` (fused Triton step) vs
   the same loop with ``torch.optim.AdamW(fused=True)`` plus ``clip_grad_norm_`` (same clipping);
   at the hybrid_small task shape (B32×T32) and a larger one (B64×T512).
2. trials/hour of ``nas search --space hybrid_small`` for ``--search-seconds`` of wall clock, with 1
   and ``--per-gpu`` worker processes on GPU 0 and, when two GPUs are visible, one worker on each
   of GPUs 0 and 1; GPU utilisation sampled by nvidia-smi every 0.5 s during each run; with
   ``--population SxL`` the space trains S seeds x L learning rates (1x1: a single run).
3. ``--step-times``: milliseconds per training step of the hybrid_small-sized candidate at the
   hybrid_small task shape, eager vs replayed from a CUDA graph (``nas.train._Steps``), for
   populations 1x1 and 2x3, and the peer: the same model through
   ``torch.compile(mode="max-autotune")`` with torch's fused AdamW and ``clip_grad_norm_``
   (compile time reported apart). Wall time over ``--steps`` steps after a warm-up, synchronised
   at both ends: what a training loop pays, host included.
4. ``--host-scaling`` (CPU, no GPU needed): the host's time per trial as the study grows, the part
   of a trial that is not training: a hybrid_small-shaped space whose candidates train 2 steps of
   one seed on a small task, searched by ``nas search`` (default sampler, one thread) up to the
   largest of ``--sizes`` plus ``--window`` trials; for each size, the next ``--window`` trials'
   median time inside a trial (sampling, build, scoring, 2 steps) and between trials (the loop's
   bookkeeping, the progress line), from Optuna's timestamps. Flat in the study's size is the
   goal; what still grows is the sampler's.
Writes ``train_throughput_<gpu>.json`` (GPU name, versions, date) into ``--out`` (``_cpu`` without a GPU).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nas.train as train_module  # noqa: E402
from benchmarks._timing import device_slug, environment, write_results  # noqa: E402
from nas.models import build  # noqa: E402
from nas.spec import ArchSpec, LayerSpec, TrainSpec  # noqa: E402
from nas.tasks import load_task  # noqa: E402

SHAPES = {
    "hybrid_small task B32xT32": ("mqar:vocab_size=64,seq_len=32,num_kv_pairs=4,n_train=4096,n_test=512", 32),
    "B64xT512": ("mqar:vocab_size=8192,seq_len=512,num_kv_pairs=32,n_train=4096,n_test=256", 64),
}


class TorchFusedAdamW(torch.optim.AdamW):
    """The peer: torch's fused AdamW with the same global-norm clipping, exposing
    ``last_grad_norm`` as the trainer's NaN check expects."""

    def __init__(self, params, spec: TrainSpec) -> None:
        self.params_list = list(params)
        super().__init__(self.params_list, lr=spec.lr, weight_decay=spec.weight_decay, fused=True)
        self.max_norm = spec.grad_clip
        self.last_grad_norm = None

    def step(self, closure=None):  # noqa: D401 — torch's signature
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(self.params_list, self.max_norm)
        return super().step(closure)


def _arch(vocab: int) -> ArchSpec:
    layers = [
        LayerSpec("attention", 4, None, 4, 4.0),
        LayerSpec("linear_attention", 4, "elu+1", 4, 4.0),
        LayerSpec("attention", 4, None, 4, 4.0),
        LayerSpec("none", mlp_ratio=4.0),
    ]
    return ArchSpec(128, layers, vocab, vocab)


def tokens_per_second(
    task_spec: str, batch: int, steps: int, peer: bool, compile_: bool = False
) -> tuple[float, float]:
    """(tokens/s of a timed run, seconds of the warm-up run). With ``compile_`` the warm-up run
    pays torch.compile; the timed run (a new model, as the next trial would be) pays whatever
    recompiling it needs, which is counted."""
    task = load_task(task_spec)
    spec = TrainSpec("adamw", 3e-3, 0.01, 0.1, steps, batch, grad_clip=1.0)
    original = train_module.make_optimizer
    if peer:
        train_module.make_optimizer = lambda s, params: TorchFusedAdamW(params, s)
    try:
        start = time.perf_counter()
        train_module.train(
            build(_arch(task.vocab_size), task, seed=0),
            task,  # warm-up: compile, autotune
            TrainSpec("adamw", 3e-3, 0.01, 0.1, 20, batch),
            device="cuda",
            compile_model=compile_,
        )
        torch.cuda.synchronize()
        warmup = time.perf_counter() - start
        result = train_module.train(
            build(_arch(task.vocab_size), task, seed=0), task, spec, device="cuda", compile_model=compile_
        )
    finally:
        train_module.make_optimizer = original
    return steps * batch * task.seq_len / result.seconds, warmup


def _stepper(task, batch: int, population: tuple[int, int], graphs: bool):
    """A ``nas.train._Steps`` for the benchmark's candidate as the trainer builds it."""
    from nas.models import Population
    from nas.optim import make_optimizer

    seeds, lrs = population
    multipliers = tuple(2.0**k for k in range(lrs)) if lrs > 1 else (1.0,)
    spec = TrainSpec("adamw", 3e-3, 0.01, 0.1, 100, batch, grad_clip=1.0, seeds=seeds, lr_multipliers=multipliers)
    variants = train_module._Variants.of(spec)
    models = [build(_arch(task.vocab_size), task, seed=s) for s in spec.variant_seeds()]
    model = models[0] if variants.size == 1 else Population([models[i] for i in variants.seed_index])
    model.to("cuda").train()
    opt = make_optimizer(spec, model.parameters())
    if variants.size > 1:
        opt.population(variants.multipliers)
    return train_module._Steps(model, task, opt, variants.size, torch.device("cuda"), graphs), variants.size


def _time_steps(step, idx: torch.Tensor, warmup: int) -> float:
    """Milliseconds per call of ``step(idx[i])`` after ``warmup`` calls, wall time synchronised."""
    for i in range(warmup):
        step(idx[i])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(warmup, idx.shape[0]):
        step(idx[i])
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (idx.shape[0] - warmup) * 1e3


def step_times(task_spec: str, batch: int, steps: int, repeats: int, compile_: bool) -> list[dict]:
    task = load_task(task_spec).to("cuda")
    rows = []
    for population in ((1, 1), (2, 3)):
        times: dict[str, list[float]] = {"eager": [], "captured": []}
        for r in range(repeats):
            for mode in ("eager", "captured") if r % 2 == 0 else ("captured", "eager"):
                stepper, P = _stepper(task, batch, population, graphs=mode == "captured")
                idx = torch.randint(0, task.x_train.shape[0], (steps, P * batch), device="cuda")
                losses = torch.zeros(steps, P, device="cuda")

                def step(rows, stepper=stepper, losses=losses):
                    loss, _ = stepper.run(rows, "train")
                    losses[0] = loss  # what the loop does with it

                times[mode].append(_time_steps(step, idx, 10))
        eager, captured = statistics.median(times["eager"]), statistics.median(times["captured"])
        rows.append(
            {
                "kind": "step_ms",
                "population": f"{population[0]}x{population[1]}",
                "batch": batch,
                "seq_len": task.seq_len,
                "eager_ms": round(eager, 4),
                "captured_ms": round(captured, 4),
                "captured_vs_eager": round(captured / eager, 3),
                "eager_runs": [round(t, 4) for t in times["eager"]],
                "captured_runs": [round(t, 4) for t in times["captured"]],
            }
        )
        print(f"step ms {rows[-1]['population']}: eager {eager:.3f}  captured {captured:.3f}", flush=True)
    if compile_:
        model = build(_arch(task.vocab_size), task, seed=0).to("cuda").train()
        compiled = torch.compile(model, mode="max-autotune")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=True)

        def peer(rows):
            # max-autotune replays CUDA graphs whose outputs the next replay overwrites: a new
            # step must say so, and grads are dropped rather than zeroed in place
            torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                x, y = task.batch(rows)
                loss = task.loss(compiled(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        idx = torch.randint(0, task.x_train.shape[0], (steps, batch), device="cuda")
        start = time.perf_counter()
        peer(idx[0])
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        peer_ms = statistics.median(_time_steps(peer, idx, 10) for _ in range(repeats))
        one = rows[0]
        one |= {
            "peer_compile_max_autotune_ms": round(peer_ms, 4),
            "peer_compile_seconds": round(compile_s, 1),
            "captured_vs_peer": round(one["captured_ms"] / peer_ms, 3),
        }
        print(f"step ms peer torch.compile max-autotune {peer_ms:.3f} (compile {compile_s:.0f} s)", flush=True)
    return rows


def _population_space(workdir: Path, space: str, population: str) -> str:
    """Shipped space ``space`` with ``population`` ("SxL": S seeds x L learning rates) as a YAML path."""
    import yaml

    seeds, lrs = (int(x) for x in population.split("x"))
    data = yaml.safe_load((Path(__file__).resolve().parent.parent / f"search_spaces/{space}.yaml").read_text())
    data["train"]["seeds"] = seeds
    data["train"]["lr_multipliers"] = [2.0**k for k in range(-(lrs // 2), lrs - lrs // 2)] if lrs > 1 else [1.0]
    path = workdir / f"{space}_{population}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _utilisation(proc: subprocess.Popen) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    for line in proc.stdout.read().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            samples.setdefault(parts[0], []).append(float(parts[1]))
    return {gpu: round(statistics.mean(v), 1) for gpu, v in samples.items()}


def trials_per_hour(
    gpus: str, per_gpu: int | str, seconds: float, workdir: Path, extra: list[str], space: str = "hybrid_small"
) -> dict:
    """``nas search`` on ``gpus`` with ``per_gpu`` workers each (an int, or "auto": the row then
    records the count it chose and why) for ``seconds``: trials/hour, start-up included."""
    import optuna

    from nas.search.record import records
    from nas.search.storage import open_storage

    storage, name = str(workdir / f"{gpus.replace(',', '_')}-{per_gpu}.journal"), f"tp-{gpus}-{per_gpu}"
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=subprocess.PIPE,
        text=True,
    )
    start = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nas",
            "search",
            "--space",
            space,
            "--trials",
            "100000",
            "--timeout",
            str(seconds),
            "--study",
            name,
            "--storage",
            storage,
            "--gpus",
            gpus,
            "--trials-per-gpu",
            str(per_gpu),
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    smi.terminate()
    smi.wait()
    chosen = re.search(r"--trials-per-gpu auto: (\d+) per GPU, bounded by (.*)", run.stdout)
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    done = states.count("COMPLETE")
    # steady state: completions after the first one, over the time since it (process start-up,
    # imports and first kernel compiles are paid once per worker and are left out)
    ends = sorted(t.datetime_complete for t in trials if t.state.name == "COMPLETE")
    span = (ends[-1] - ends[0]).total_seconds() if len(ends) > 1 else 0.0
    scored = [r for r in records(study) if r.latency_seconds is not None]
    scoring = [r.latency_seconds for r in scored]
    return {
        "space": Path(space).stem,
        "gpu": torch.cuda.get_device_name(),
        "gpus": gpus,
        "workers_per_gpu": int(chosen.group(1)) if chosen else per_gpu,
        **({"trials_per_gpu": "auto", "auto_reason": chosen.group(2) if chosen else None} if per_gpu == "auto" else {}),
        "search_args": " ".join(extra),
        "wall_s": round(wall, 1),
        "latency_measured": sum(r.latency.source == "measured" for r in scored if r.latency),
        "scoring_seconds_median": statistics.median(scoring) if scoring else None,
        "completed": done,
        # trained to fewer steps than planned (the wall-clock guard): not "every trial trained in full"
        "truncated": sum(r.truncated for r in records(study)),
        "failed": states.count("FAIL"),
        "trials_per_hour": round(done / wall * 3600, 1),
        "steady_trials_per_hour": round((len(ends) - 1) / span * 3600, 1) if span else None,
        "gpu_util_mean_pct": _utilisation(smi),
        "returncode": run.returncode,
        "stderr_tail": run.stderr[-400:] if run.returncode else "",
    }


HOST_SPACE = """name: host_scaling
description: hybrid_small's choices, 2 training steps of one seed on a small task
task: mqar:vocab_size=64,seq_len=32,num_kv_pairs=4,n_train=256,n_test=64
depth: {low: 1, high: 4}
d_model: [32, 64, 128]
layer:
  mixer: [attention, linear_attention, none]
  heads: [1, 2, 4]
  feature_map: [identity, elu+1, relu]
  short_conv: [4]
  mlp_ratio: [0, 2, 4]
  activation: [gelu, silu, relu]
  norm: [layernorm, rmsnorm]
train:
  optimizer: [adamw, lion, radam, sgd]
  lr: {low: 1.0e-3, high: 2.0e-2, log: true}
  weight_decay: [0.0, 0.01, 0.1]
  warmup_frac: [0.0, 0.1]
  steps: [2]
  batch_size: [32]
  momentum: [0.9]
  nesterov: [false, true]
  grad_clip: [1.0]
  seeds: 1
  lr_multipliers: [1.0]
"""


def host_scaling(sizes: list[int], window: int) -> list[dict]:
    """Host seconds per trial at each study size in ``sizes`` (the module docstring, part 4)."""
    import os

    import numpy as np
    import optuna

    from nas.search.storage import open_storage

    with tempfile.TemporaryDirectory() as tmp:
        space, journal = Path(tmp) / "space.yaml", Path(tmp) / "s.journal"
        space.write_text(HOST_SPACE)
        total = max(sizes) + window
        cmd = [sys.executable, "-m", "nas", "search", "--space", str(space), "--trials", str(total)]
        cmd += ["--storage", str(journal), "--study", "s", "--device", "cpu", "--no-baselines", "--seed", "0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
        if run.returncode != 0:
            raise RuntimeError(f"nas search failed ({run.returncode}): {run.stderr[-2000:]}")
        wall = time.perf_counter() - started
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        trials = [
            t
            for t in optuna.load_study(study_name="s", storage=open_storage(str(journal))).get_trials()
            if t.datetime_complete is not None
        ]
    rows = []
    for size in sizes:
        part = trials[size : size + window]
        inside = [(t.datetime_complete - t.datetime_start).total_seconds() for t in part]
        pairs = zip(part, part[1:], strict=False)
        between = [(b.datetime_start - a.datetime_complete).total_seconds() for a, b in pairs]
        span = (part[-1].datetime_complete - part[0].datetime_start).total_seconds()
        rows.append(
            {
                "kind": "host_seconds_per_trial",
                "study_size": size,
                "window": len(part),
                "per_trial_s": round(span / len(part), 4),
                "inside_median_s": round(float(np.median(inside)), 4),
                "between_median_s": round(float(np.median(between)), 4),
                "search_wall_s": round(wall, 1),
            }
        )
        print(
            f"study size {size:5d}: {rows[-1]['per_trial_s']:.3f} s a trial "
            f"(inside {rows[-1]['inside_median_s']:.3f}, between {rows[-1]['between_median_s']:.4f})",
            flush=True,
        )
    return rows


def captured_vs_eager(n: int, seed: int, out: Path, device: str = "cuda") -> list[dict]:
    """#47 item 1's accuracy check: ``n`` random ``hybrid_small`` configurations (its default
    population, so each has an interval), each trained with captured steps and with eager ones
    (``NAS_TRAIN_GRAPHS=0``): is the captured accuracy within the eager run's interval? Rows are
    written after every configuration, so a run cut short keeps what it finished."""
    import os

    import optuna

    from nas.space import load_space
    from nas.train import train_population

    space = load_space("hybrid_small")
    task = load_task(space.task)
    draws = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    rows: list[dict] = []
    for i in range(n):
        cand = space.sample(draws.ask(), task)
        row: dict = {"kind": "captured_vs_eager", "config": i, "arch": cand.arch.summary(), "recipe": str(cand.train)}
        row["first"] = "eager" if i % 2 == 0 else "captured"
        modes = [("eager", "0"), ("captured", "1")]
        for mode, flag in modes if i % 2 == 0 else modes[::-1]:  # alternated: the first pays new shapes' compiles
            os.environ["NAS_TRAIN_GRAPHS"] = flag  # nas.settings reads it again when it changes
            start = time.perf_counter()
            try:
                r = train_population(cand.arch, task, cand.train, device=device)
            except train_module.TrainingDiverged as e:
                row[mode] = {"diverged": str(e)}
                continue
            finally:
                os.environ.pop("NAS_TRAIN_GRAPHS", None)
            row[mode] = {
                "accuracy": r.accuracy,
                "interval": r.interval,
                "accuracies": r.accuracies,
                "seconds": round(time.perf_counter() - start, 3),
            }
        e, c = row.get("eager", {}), row.get("captured", {})
        if "accuracy" in e and "accuracy" in c:
            row["difference"] = c["accuracy"] - e["accuracy"]
            row["within_interval"] = abs(row["difference"]) <= (e["interval"] or 0.0)
            row["identical"] = c["accuracies"] == e["accuracies"]
        rows.append(row)
        print(f"config {i}: {row['arch']} eager {e.get('accuracy')} captured {c.get('accuracy')}", flush=True)
        checked = [r for r in rows if "within_interval" in r]
        write_results(
            out,
            rows,
            summary={
                "configs": len(rows),
                "compared": len(checked),
                "within_interval": sum(r["within_interval"] for r in checked),
                "identical": sum(r["identical"] for r in checked),
            },
            seed=seed,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--search-seconds", type=float, default=60)
    parser.add_argument("--per-gpu", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--skip-tokens", action="store_true", help="only the search trials/hour part")
    parser.add_argument("--skip-search", action="store_true", help="only the tokens/s part")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved tokens/s runs per optimizer (median)")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    parser.add_argument("--compile", action="store_true", help="also tokens/s with the step through torch.compile")
    parser.add_argument("--search-args", default="", help="extra nas search arguments, e.g. '--predict'")
    parser.add_argument("--layouts", default=None, help="GPUS:WORKERS;... e.g. '0:1;0,1:1' (default: all)")
    parser.add_argument(
        "--population", default=None, help="SxL: the search's seeds x learning rates (default: the space's)"
    )
    parser.add_argument("--space", default="hybrid_small", help="shipped space the search runs (default hybrid_small)")
    parser.add_argument("--step-times", action="store_true", help="only the ms per step part (eager, captured, peer)")
    parser.add_argument("--host-scaling", action="store_true", help="only the host time per trial vs study size (CPU)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 500, 1000, 2000], help="--host-scaling's sizes")
    parser.add_argument("--window", type=int, default=40, help="--host-scaling: trials timed at each size")
    parser.add_argument(
        "--captured-vs-eager", type=int, default=0, metavar="N", help="only: N configurations, captured vs eager"
    )
    args = parser.parse_args()
    env = environment()
    if args.captured_vs_eager:
        out = Path(args.out) / f"train_captured_vs_eager_{device_slug(env['gpu'] or 'cpu')}{args.tag}.json"
        captured_vs_eager(args.captured_vs_eager, 0, out)
        print(f"wrote {out}")
        return
    print(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}")

    rows = []
    if args.host_scaling:
        if args.window < 2 or min(args.sizes) < 0:
            parser.exit(2, "train_throughput.py: --window must be >= 2 and --sizes >= 0\n")
        rows += host_scaling(sorted(set(args.sizes)), args.window)
        args.skip_tokens = args.skip_search = True
    if args.step_times:
        task_spec, batch = SHAPES["hybrid_small task B32xT32"]
        rows += step_times(task_spec, batch, args.steps, args.repeats, args.compile)
        args.skip_tokens = args.skip_search = True
    for label, (task_spec, batch) in ({} if args.skip_tokens else SHAPES).items():
        # interleaved repeats (peer first in odd rounds): a fixed order would hand one side the
        # warmer allocator/clocks every time
        runs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.repeats):
            for is_peer in (True, False) if r % 2 else (False, True):
                runs[is_peer].append(tokens_per_second(task_spec, batch, args.steps, peer=is_peer)[0])
        ours, peer = statistics.median(runs[False]), statistics.median(runs[True])
        row = {
            "kind": "tokens_per_s",
            "shape": label,
            "steps": args.steps,
            "repeats": args.repeats,
            "ours_nas_optim_adamw": round(ours),
            "peer_torch_adamw_fused": round(peer),
            "ratio": round(ours / peer, 3),
            "ours_runs": [round(x) for x in runs[False]],
            "peer_runs": [round(x) for x in runs[True]],
        }
        if args.compile:
            compiled, first = tokens_per_second(task_spec, batch, args.steps, peer=False, compile_=True)
            row |= {
                "ours_compiled": round(compiled),
                "compiled_vs_eager": round(compiled / ours, 3),
                "compiled_first_run_s_20_steps": round(first, 1),
            }
        rows.append(row)
        print(
            f"tokens/s {label:28s} ours {ours:12.0f}  torch fused {peer:12.0f}  x{ours / peer:.2f}  "
            f"{row.get('ours_compiled', '')} compiled (first run {row.get('compiled_first_run_s_20_steps', '-')} s)",
            flush=True,
        )

    layouts = [("0", 1), ("0", args.per_gpu)]
    if torch.cuda.device_count() >= 2:
        layouts += [("0,1", 1), ("0,1", args.per_gpu)]
    if args.layouts:
        layouts = [(g, n if n == "auto" else int(n)) for g, n in (item.split(":") for item in args.layouts.split(";"))]
    if args.skip_search:
        layouts = []
    with tempfile.TemporaryDirectory() as tmp:
        space = _population_space(Path(tmp), args.space, args.population) if args.population else args.space
        for gpus, per_gpu in layouts:
            row = trials_per_hour(gpus, per_gpu, args.search_seconds, Path(tmp), args.search_args.split(), space)
            rows.append({"kind": "search_trials_per_hour", "population": args.population or "space default", **row})
            print(
                f"search gpus={gpus} x{per_gpu}: {row['completed']} trials in {row['wall_s']} s = "
                f"{row['trials_per_hour']}/h (steady {row['steady_trials_per_hour']}/h), "
                f"util {row['gpu_util_mean_pct']}, rc {row['returncode']}"
            )
    searches = {
        (r["gpus"], r.get("trials_per_gpu", r["workers_per_gpu"])): r
        for r in rows
        if r["kind"] == "search_trials_per_hour"
    }
    base = searches.get(("0", 1), {"trials_per_hour": None, "steady_trials_per_hour": None})

    def speedup(key: tuple[str, int], field: str) -> float | None:
        return round(searches[key][field] / base[field], 2) if key in searches and base[field] else None

    summary = {
        f"{field}:{g}x{n}": speedup((g, n), field)
        for field in ("trials_per_hour", "steady_trials_per_hour")
        for g, n in searches
        if (g, n) != ("0", 1)
    }
    print(summary)
    path = write_results(
        Path(args.out) / f"train_throughput_{device_slug(env['gpu'] or 'cpu')}{args.tag}.json",
        rows,
        summary=summary,
        gpu_count=torch.cuda.device_count(),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
