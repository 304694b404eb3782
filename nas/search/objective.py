"""One trial: sample a candidate, score latency and memory, train it unless it breaks a hard
budget, store its weights. Every way a candidate can fail becomes a failed trial with a reason.
A candidate whose configuration another trial already completed (or is running) is not trained
again: the trial is pruned with ``duplicate_of`` (unless its parameters were enqueued on purpose)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import tempfile
import time
from dataclasses import dataclass

import optuna
import torch
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import TrialState
from safetensors.torch import save_file

from hardware_profiles import HardwareProfile
from kernels.device import is_cuda
from nas.latency import (
    KernelError,
    Latency,
    LatencyShape,
    cache_memory,
    count_params,
    measure,
    measure_decode,
    memory,
    predict,
    predict_decode,
)
from nas.models import build
from nas.search import faults, gpu_share, pruning, record
from nas.search.setup import StudyBudgets
from nas.space import SearchSpace
from nas.spec import ArchSpec, Candidate, arch_hash
from nas.tasks import Task
from nas.train import (
    Budget,
    PopulationResult,
    TrainingDiverged,
    TrainingOOM,
    TrainingStopped,
    TrialTimeout,
    train_population,
)

__all__ = ["TrialContext", "evaluate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialContext:
    """What every trial of one search shares."""

    space: SearchSpace
    task: Task
    profile: HardwareProfile
    shape: LatencyShape
    device: torch.device
    budgets: StudyBudgets  # the trial count and hard limits: a candidate over a limit is not trained
    artifacts: FileSystemArtifactStore
    measure: bool = False  # time the TritonModel on this GPU instead of predicting
    objectives: tuple[str, ...] = tuple(record.OBJECTIVES)  # the study's objective metric names, in value order
    pruner: pruning.CostAwarePruner | None = None  # early stopping at rungs (None: train every trial to the end)
    context: int | None = None  # tokens per sequence for the generation costs (--context)
    decode_batch: int = 1  # sequences decoded together (--decode-batch)
    retrained: tuple[int, ...] = ()  # truncated trials this run re-queued (--retrain-truncated)
    seed: int = 0  # the study's seed: with a configuration, it decides the training seeds


@dataclass(frozen=True)
class _Costs:
    """What a candidate costs before training: the forward's latency and memory at the latency
    shape, and, with a context, the generation costs the objectives ask for."""

    latency: Latency
    memory: dict
    total_mb: float
    prefill: Latency | None = None
    decode: Latency | None = None


def _constraints(budgets: StudyBudgets, lat: Latency, mem_mb: float, params: int) -> dict[str, float]:
    """Constraint values (≤ 0 is feasible) for the budgets that were set."""
    out = {}
    if budgets.max_latency_ms is not None:
        out["latency_ms"] = lat.median_ms - budgets.max_latency_ms
    if budgets.max_params is not None:
        out["params"] = float(params - budgets.max_params)
    if budgets.max_memory_mb is not None:
        out["memory_mb"] = mem_mb - budgets.max_memory_mb
    return out


def _score_latency(ctx: TrialContext, arch: ArchSpec, fault: str | None) -> tuple[_Costs, float]:
    """Costs of ``arch``: latencies measured on this GPU (its kernels checked against the torch
    model first), or predicted from the profile, and memory; and the seconds spent waiting for
    the GPU first. Latency does not depend on the weights, so the candidate is timed before
    training, on a freshly initialised model."""
    faults.check_scoring(fault)
    wanted = set(ctx.objectives)
    context_shape = LatencyShape(ctx.decode_batch, ctx.context) if ctx.context else None
    prefill = decode = None
    waited = 0.0
    if ctx.measure:
        with gpu_share.current().exclusive() as waited:  # workers sharing this GPU pause their training
            model = build(arch, seed=0)
            lat = measure(model, ctx.shape, device=ctx.device)
            if context_shape is not None and "prefill_latency_ms" in wanted:
                prefill = measure(model, context_shape, device=ctx.device)
            if context_shape is not None and "decode_latency_ms" in wanted:
                decode = measure_decode(model, ctx.decode_batch, ctx.context, device=ctx.device)
    else:
        lat = predict(arch, ctx.shape, ctx.profile)
        if context_shape is not None and "prefill_latency_ms" in wanted:
            prefill = predict(arch, context_shape, ctx.profile)
        if context_shape is not None and "decode_latency_ms" in wanted:
            decode = predict_decode(arch, ctx.decode_batch, ctx.context, ctx.profile)
    mem = memory(arch, ctx.shape)
    mem_dict = mem.to_dict()
    if ctx.context:
        cache = cache_memory(arch, ctx.context, ctx.decode_batch)
        mem_dict |= {"cache_memory_mb": cache.total_mb, "cache": cache.to_dict()}
    return _Costs(lat, mem_dict, mem.total_mb, prefill, decode), waited


def evaluate(ctx: TrialContext, trial: optuna.Trial) -> tuple[TrialState, list[float] | None]:
    """Run one trial; returns the state and values to ``tell``. A failure reason goes to the
    ``failure`` user attr; KeyboardInterrupt propagates (the caller records it). The caller has
    claimed the trial already (``record.write_start``, right after it took it)."""
    start = time.monotonic()
    fault = faults.planned(trial.number)
    cand = ctx.space.sample(trial, ctx.task, ctx.seed)
    rows = ctx.task.x_train.shape[0]
    if cand.train.batch_size > rows:  # batches draw rows with replacement: a larger one only repeats rows
        cand = dataclasses.replace(cand, train=dataclasses.replace(cand.train, batch_size=rows))
    repeat = _repeat_of(trial)
    if repeat is not None:
        record.write_duplicate(trial, repeat)
        logger.info("trial %d: same configuration as trial %d; not trained again", trial.number, repeat)
        return TrialState.PRUNED, None
    arch = cand.arch
    params = count_params(arch)
    costs = _score(ctx, trial, cand, params, fault)
    if costs is None:
        return TrialState.FAIL, None
    cons = _constraints(ctx.budgets, costs.latency, costs.total_mb, params)
    for key, value in cons.items():
        trial.set_constraint(key, value)
    broken = [k for k, v in cons.items() if v > 0]
    if broken:
        record.write_skipped(trial, f"breaks the hard budget on {', '.join(broken)}")
        logger.info(
            "trial %d: %s breaks the hard budget on %s; not trained", trial.number, arch.summary(), ", ".join(broken)
        )
        return TrialState.COMPLETE, _values(ctx, 0.0, costs)
    logger.info(
        "trial %d: training %s (%s params, %s lr=%.2g, %d steps of batch %d, %d seed(s) x %d lr(s)) on %s",
        trial.number,
        arch.summary(),
        f"{params:,}",
        cand.train.optimizer,
        cand.train.lr,
        cand.train.steps,
        cand.train.batch_size,
        cand.train.seeds,
        len(cand.train.lr_multipliers),
        ctx.device,
    )
    result = _train(ctx, trial, cand, fault, start)
    if isinstance(result, TrialState):
        return result, None
    _record_trained(ctx, trial, cand, result, costs)
    return TrialState.COMPLETE, _values(ctx, result.accuracy, costs)


def _score(ctx: TrialContext, trial: optuna.Trial, cand: Candidate, params: int, fault: str | None) -> _Costs | None:
    """Score the candidate's costs and record them with it; None when its kernels failed (the
    trial's failure is recorded)."""
    scoring_start = time.perf_counter()
    try:
        costs, waited = _score_latency(ctx, cand.arch, fault)
    except KernelError as e:
        record.write_failure(trial, f"{type(e).__name__}: {e}")
        return None
    record.write_scored(
        trial,
        cand.arch,
        cand.train,
        params,
        costs.latency,
        costs.memory,
        latency_seconds=time.perf_counter() - scoring_start - waited,
        wait_seconds=waited,
        prefill=costs.prefill,
        decode=costs.decode,
    )
    return costs


def _train(
    ctx: TrialContext, trial: optuna.Trial, cand: Candidate, fault: str | None, start: float
) -> PopulationResult | TrialState:
    """Train the candidate within the trial's budgets (``start``: when the trial started, for
    ``--trial-timeout``); a training stopped early or failed is recorded, and its state returned."""
    # a baseline is trained in full, by neither the pruner nor the wall-clock guard stopped: it is
    # the yardstick the front is read against (a busy box cut all-attention at 177/300 steps);
    # --trial-timeout, the hard deadline, still holds
    reference = record.baseline_of(trial) is not None
    timeout = ctx.budgets.trial_timeout
    guard = None if reference else ctx.budgets.max_train_seconds or ctx.space.max_train_seconds
    max_seconds, deadline = faults.training_budget(
        fault, guard, None if timeout is None else start + timeout, time.monotonic()
    )
    budget = Budget(max_seconds=max_seconds, deadline=deadline)
    reason = None
    stop_reasons: list[str] = []

    def on_rung(step: int, accuracy: float) -> bool:
        why = pruning.rung(ctx.pruner, trial, step, accuracy)
        if why is None or reference:
            return False
        stop_reasons.append(why)
        return True

    try:
        return train_population(
            cand.arch,
            ctx.task,
            cand.train,
            device=ctx.device,
            budget=budget,
            share=gpu_share.current() if is_cuda(ctx.device) else None,
            step_hook=lambda model: faults.step_hook(fault, model),
            on_rung=on_rung if ctx.pruner is not None else None,
        )
    except TrainingStopped as e:
        record.write_pruned(trial, step=e.step, reason=stop_reasons[-1], curve=e.curve, seconds=e.seconds)
        logger.info("trial %d: stopped early (%s)", trial.number, stop_reasons[-1])
        _release_memory(ctx.device)
        return TrialState.PRUNED
    except TrainingDiverged as e:
        reason = f"diverged: {e}"
    except TrainingOOM as e:
        reason = str(e)
    except TrialTimeout as e:
        reason = f"exceeded --trial-timeout of {timeout:g} s ({e})"
    record.write_failure(trial, reason)
    _release_memory(ctx.device)
    return TrialState.FAIL


def _record_trained(
    ctx: TrialContext, trial: optuna.Trial, cand: Candidate, result: PopulationResult, costs: _Costs
) -> None:
    """Record a trained candidate: its curve, accuracy, population and weights."""
    record.write_trained(
        trial,
        curve=result.curve,
        seconds=result.seconds,
        steps=result.steps,
        planned_steps=cand.train.steps,
        stopped=result.stopped,
        test_loss=result.test_loss,
        weights_artifact=_upload_weights(ctx, trial, result.model),
        accuracy=result.accuracy,
        accuracy_interval=result.interval,
        population=_population(result, cand.train),
        full_precision_accuracy=result.full_precision_accuracy,
    )
    full = result.full_precision_accuracy
    logger.info(
        "trial %d: accuracy %.3f%s%s after %d steps in %.1f s (%s); latency %.4g ms (%s), memory %.3g MiB",
        trial.number,
        result.accuracy,
        "" if result.interval is None else f" ±{result.interval:.3f}",
        "" if full is None else f" at {cand.arch.precision_text()} (full precision {full:.3f})",
        result.steps,
        result.seconds,
        result.stopped,
        costs.latency.median_ms,
        costs.latency.source,
        costs.total_mb,
    )


def _population(result: PopulationResult, spec) -> dict:
    """The population's outcome as the trial records it (``TrialRecord.population``)."""
    seed_index, multiplier, accuracy = result.kept
    return {
        "seeds": list(result.seeds),
        "lr_multipliers": list(result.multipliers),
        "lrs": [spec.lr * m for m in result.multipliers],
        "accuracies": [list(row) for row in result.accuracies],
        "best_lr": spec.lr * result.best_multiplier,
        "weights": {"seed": result.seeds[seed_index], "lr": spec.lr * multiplier, "accuracy": accuracy},
    }


def _values(ctx: TrialContext, accuracy: float, costs: _Costs) -> list[float]:
    """The objectives by metric name, in the study's order."""
    known = {"accuracy": accuracy, "latency_ms": costs.latency.median_ms, "memory_mb": costs.total_mb}
    if costs.prefill is not None:
        known["prefill_latency_ms"] = costs.prefill.median_ms
    if costs.decode is not None:
        known["decode_latency_ms"] = costs.decode.median_ms
    if "cache_memory_mb" in costs.memory:
        known["cache_memory_mb"] = costs.memory["cache_memory_mb"]
    return record.values_in_order(ctx.objectives, known)


def _repeat_of(trial: optuna.Trial) -> int | None:
    """The number of another completed, running or early-stopped trial with exactly ``trial``'s parameters; None
    when there is none, or when ``trial``'s parameters were enqueued (a re-queued trial, or one a
    user asked for with ``study.enqueue_trial``: training it again is what was asked)."""
    others = [  # a configuration early stopping pruned counts as tried: it would be stopped again
        t
        for t in trial.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED)
        )
        if t.state != TrialState.PRUNED or record.record(trial.study, t).pruned_at is not None
    ]
    this = next(t for t in others if t.number == trial.number)
    if record.was_enqueued(this):
        return None
    return next((t.number for t in others if t.number != trial.number and t.params == this.params), None)


def _release_memory(device: torch.device) -> None:
    """Give a failed candidate's memory back so the next trial starts clean."""
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()


def _upload_weights(ctx: TrialContext, trial: optuna.Trial, model: torch.nn.Module) -> str:
    """Store the trained weights as a safetensors artifact of ``trial``; returns the artifact id."""
    with gpu_share.current().shared():  # device → host copies: not during a neighbour's measurement
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"trial{trial.number}.safetensors")
        save_file(state, path, metadata={"arch_hash": arch_hash(model.arch)})
        return upload_artifact(
            artifact_store=ctx.artifacts, file_path=path, study_or_trial=trial, mimetype="application/octet-stream"
        )
