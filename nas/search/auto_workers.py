"""``--trials-per-gpu auto``: how many worker processes share each GPU, from free memory and a
short probe.

A small candidate leaves a GPU mostly idle: a worker's host work (sampling, building, scoring,
evaluating) runs between its training windows, and other workers fill those gaps. How many is
bounded three ways, and the smallest bound wins:

- **memory**: every worker holds a CUDA context and, sooner or later, trains the space's heaviest
  candidate. A probe process trains that candidate (the widest, deepest draw of each mixer, at the
  largest batch and the space's population) for a few steps on the first GPU and reports the
  memory it reserved; ``FILL`` of the smallest free memory among the GPUs, over that plus
  ``CONTEXT_ALLOWANCE``, is how many fit;
- **host cores**: each worker issues its own launches; more workers than cores per GPU queue on
  the host instead of on the GPU;
- **a cap**: about ``RUNS_IN_FLIGHT`` training runs per GPU, counting each variant of a population
  (its steps already batch its runs into each launch), and at least 2 workers, so one worker's host
  gaps are filled: 8 workers for single runs, 4 for 2-run populations, 2 for 6-run ones; on an H100
  each was the best of the counts measured (docs/benchmarks.md, training throughput).

The probe runs in its own process, so the search's parent never holds a context on the GPUs its
workers need; the kernels of its candidates compile into the on-disk caches the workers then reuse.
The memory bound counts training only: a worker measuring a decode step also holds that step's
caches at the study's ``--context``, while its neighbours train.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import optuna

from nas.search import gpu_share

if TYPE_CHECKING:
    from nas.space import SearchSpace
    from nas.spec import Candidate
    from nas.tasks.base import Task

__all__ = ["AUTO", "RUNS_IN_FLIGHT", "Probe", "cap_for", "choose", "heaviest", "probe", "trials_per_gpu"]

AUTO = "auto"
# allowances, not measurements: headroom for fragmentation and neighbours' peaks, and a process's CUDA
# context and loaded kernel modules, which the probe's allocator statistics do not see
FILL = 0.85  # share of the free memory the workers may plan to use
CONTEXT_ALLOWANCE = 768 << 20  # bytes per worker beyond its allocator's reserve
RUNS_IN_FLIGHT = 8  # per GPU, over all workers' population variants (docs/benchmarks.md, training throughput)
PROBE_STEPS = 8  # per stage: past GRAPH_WARMUP, so the captured step (what the workers run) is what is measured
PROBE_TIMEOUT = 900.0  # seconds: a first run compiles every kernel the probe candidate uses


@dataclass(frozen=True)
class Probe:
    """What the probe process measured: the heaviest candidate's reserved memory (bytes), each
    GPU's free and total memory (bytes, in ``--gpus`` order) and how long it took."""

    footprint: int
    free: tuple[int, ...]
    total: tuple[int, ...]
    seconds: float


def cap_for(variants: int) -> int:
    """Workers per GPU for candidates that train ``variants`` runs each, memory and cores aside."""
    return max(2, RUNS_IN_FLIGHT // variants)


def choose(probe: Probe, cores: int, variants: int) -> tuple[int, str]:
    """Workers per GPU for ``probe``'s GPUs on a host with ``cores`` cores, candidates training
    ``variants`` runs each; and the reason, in words."""
    gpus = len(probe.free)
    per_worker = probe.footprint + CONTEXT_ALLOWANCE
    memory = int(FILL * min(probe.free) // per_worker)
    host = max(1, cores // gpus)
    cap = cap_for(variants)
    bounds = {
        f"memory ({min(probe.free) / 2**30:.1f} GiB free fits {memory} of {per_worker / 2**30:.2f} GiB)": memory,
        f"host ({cores} cores for {gpus} GPU(s))": host,
        f"cap for {'single runs' if variants == 1 else f'populations of {variants}'}": cap,
    }
    why, n = min(bounds.items(), key=lambda kv: kv[1])
    if n < 1:
        return 1, f"{why}: even one worker may run out of memory on the heaviest candidates"
    return n, why


def trials_per_gpu(
    study: str, storage: str, gpus: list[str], variants: int, data: str | None = None
) -> tuple[int, str]:
    """``--trials-per-gpu auto`` for ``study`` on ``gpus``: run the probe, then ``choose``. A
    probe that fails leaves 1 worker per GPU, and the reason says why."""
    try:
        measured = probe(study, storage, gpus, data)
    except ProbeError as e:
        return 1, f"the probe failed ({e}); 1 per GPU"
    n, why = choose(measured, len(os.sched_getaffinity(0)), variants)
    return n, f"{why}; probe {measured.seconds:.0f} s"


class ProbeError(RuntimeError):
    """The probe process failed; the message is its last line of error output."""


def probe(study: str, storage: str, gpus: list[str], data: str | None = None) -> Probe:
    """Run the probe in a child process on ``gpus`` (it trains on the first) and return what it measured."""
    cmd = [sys.executable, "-m", "nas.search.auto_workers", "--study", study, "--storage", storage]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(gpus))
    env.pop(gpu_share.ENV, None)  # it runs alone, before the workers: no turns to take
    try:
        done = subprocess.run(
            cmd + (["--data", data] if data else []),
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise ProbeError(f"no answer in {PROBE_TIMEOUT:.0f} s") from e
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ProbeError(tail)
    try:
        raw = json.loads(lines[-1])
        measured = Probe(
            int(raw["footprint"]), tuple(map(int, raw["free"])), tuple(map(int, raw["total"])), float(raw["seconds"])
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ProbeError(f"unreadable answer {lines[-1][:80]!r}") from e
    if not measured.free or measured.footprint <= 0:
        raise ProbeError(f"answer without a footprint or a GPU: {lines[-1][:80]!r}")
    return measured


class _Heaviest(optuna.samplers.BaseSampler):
    """Draws the space's most memory-hungry value of every parameter that sizes memory: the top of
    each range (depth, width, batch), the largest of numeric choices, the widest precision, an
    optimizer with two state tensors; every mixer is ``mixer`` (the probe trains each mixer kind in
    turn). The recipe's other fields (lr, weight decay, noise) leave memory alone and take their
    mildest value, the bottom, so the probe's few steps do not diverge."""

    _SIZED = ("train.batch_size", "train.steps", "train.optimizer")

    _OPTIMIZERS = ("adamw", "radam")

    def __init__(self, mixer: str) -> None:
        self.mixer = mixer

    def infer_relative_search_space(self, study, trial):  # noqa: ANN001, ANN201 — Optuna's interface
        return {}

    def sample_relative(self, study, trial, search_space):  # noqa: ANN001, ANN201
        return {}

    def sample_independent(self, study, trial, name: str, dist: optuna.distributions.BaseDistribution) -> Any:
        from nas.spec import PRECISION_FIELDS

        mild = name.startswith("train.") and name not in self._SIZED
        if not isinstance(dist, optuna.distributions.CategoricalDistribution):
            return dist.low if mild else dist.high
        choices, field = list(dist.choices), name.rsplit(".", 1)[-1]
        if mild:
            return choices[0]
        if field == "mixer":
            return self.mixer if self.mixer in choices else choices[0]
        if field in PRECISION_FIELDS:  # listed widest first
            return min(choices, key=PRECISION_FIELDS[field].index)
        if field == "optimizer":
            return next((o for o in self._OPTIMIZERS if o in choices), choices[0])
        numeric = [c for c in choices if isinstance(c, int | float) and not isinstance(c, bool)]
        return max(numeric) if numeric else choices[0]


def heaviest(space: SearchSpace, task: Task) -> list[Candidate]:
    """The space's heaviest candidate of each mixer kind it offers (MLP-only blocks only when it
    offers nothing else): see ``_Heaviest``."""
    mixers = [m for m in space.layer["mixer"].values() if m != "none"] or ["none"]
    return [space.sample(optuna.create_study(sampler=_Heaviest(m)).ask(), task) for m in mixers]


def _measure(study: str, storage: str, data: str | None) -> Probe:
    """In the probe process: train the heaviest candidate of each mixer kind for a few steps on
    ``cuda:0`` and measure the peak memory reserved."""
    import torch

    from nas.search.start import prepare
    from nas.search.studies import worker_config
    from nas.train import TrainingDiverged, train_population

    start = time.perf_counter()
    ctx, _ = prepare(worker_config(study, storage, device="cuda", data=data))
    gpus = range(torch.cuda.device_count())
    free_total = [torch.cuda.mem_get_info(i) for i in gpus]
    footprint = 0
    for cand in heaviest(ctx.space, ctx.task):
        stages = 2 if ctx.task.stage1_steps(1000) else 1  # a length curriculum captures a step per stage
        spec = replace(cand.train, steps=PROBE_STEPS * stages)
        torch.cuda.reset_peak_memory_stats()
        try:
            train_population(cand.arch, ctx.task, spec, device="cuda")
        except TrainingDiverged:  # the memory it reached is what the probe asks about
            pass
        torch.cuda.synchronize()
        footprint = max(footprint, torch.cuda.max_memory_reserved())
        torch.cuda.empty_cache()
    return Probe(
        footprint, tuple(f for f, _ in free_total), tuple(t for _, t in free_total), time.perf_counter() - start
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m nas.search.auto_workers", description=__doc__.splitlines()[0])
    p.add_argument("--study", required=True)
    p.add_argument("--storage", required=True)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    measured = _measure(args.study, args.storage, args.data)
    print(
        json.dumps(
            {
                "footprint": measured.footprint,
                "free": measured.free,
                "total": measured.total,
                "seconds": measured.seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
