"""The lines ``nas search`` and ``nas worker`` print as a search runs: before the first trial what
the search costs and how (and whether the baselines fit the GPU), one line per finished trial, and
at the end the trials that were not trained or counted."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nas.commands._common import console

if TYPE_CHECKING:
    import optuna

    from hardware_profiles import HardwareProfile
    from nas.search.objective import TrialContext
    from nas.search.objectives import Objective
    from nas.search.record import TrialRecord


class TrialLines:
    """One line per trial that finished since the last call (failures only, unless ``show_all``),
    in the order they finished, each with the trained count as of its own end: with worker
    processes several finish between two polls, and each line used to show the count at the poll."""

    def __init__(self, study: optuna.Study, trials: int, *, show_all: bool) -> None:
        from nas.search.loop import n_complete
        from nas.search.record import study_profile

        self._trials, self._show_all = trials, show_all
        self._profile = study_profile(study)  # the target GPU, whose memory a trial's is compared with
        self._seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
        self._trained = n_complete(study)

    def new(self, study: optuna.Study) -> list[str]:
        import datetime

        from nas.search.record import records, study_objectives

        ended = {t.number: t.datetime_complete or datetime.datetime.max for t in study.get_trials(deepcopy=False)}
        fresh = [
            r for r in records(study) if r.state.is_finished() and r.number not in self._seen and r.surplus is None
        ]
        out = []
        for r in sorted(fresh, key=lambda r: (ended[r.number], r.number)):
            self._seen.add(r.number)
            self._trained += r.trained
            if r.state.name == "FAIL" or r.truncated or self._show_all:
                out.append(trial_line(r, self._trained, self._trials, study_objectives(study), self._profile))
        return out


def trial_line(
    r: TrialRecord,
    trained: int,
    trials: int,
    objectives: Sequence[Objective] | None = None,
    profile: HardwareProfile | None = None,
) -> str:
    """``trial 4 (3/8 trained): L A | d=32, acc 0.912, latency 0.0213 ms, memory 0.41 MiB, 20 steps``
    (the costs are the study's ``objectives``; None: the default ones), and ``— memory 2.416e+06 MiB
    is more than h200's 141 GB (134,468 MiB)`` where a memory objective exceeds ``profile``'s GPU."""
    from nas.search.objectives import CATALOGUE, DEFAULT_OBJECTIVES

    objectives = objectives or tuple(CATALOGUE[n] for n in DEFAULT_OBJECTIVES)
    over = "".join(f" — {text}" for text in r.over_device(objectives, profile))
    if r.state.name == "FAIL":
        return f"trial {r.number} failed: {r.failure or '?'}"
    if r.duplicate_of is not None:
        return f"trial {r.number}: same configuration as trial {r.duplicate_of}; not trained again"
    if r.pruned_at is not None:
        return f"trial {r.number}: {r.arch_summary} stopped early — {r.prune_reason}; not counted"
    if r.state.name != "COMPLETE":
        return f"trial {r.number}: {r.state.name.lower()}"
    ref = f" baseline {r.baseline}:" if r.baseline else ""
    if r.requeued_from is not None:  # a dead worker's, an interrupted or a truncated trial, trained again
        ref = f" retrains trial {r.requeued_from}:{ref}"
    if r.skipped_training is not None:  # a baseline is named here too (it was only where trained)
        return (
            f"trial {r.number}:{ref} {r.arch_summary} {r.skipped_training}; not trained, "
            f"not counted ({trained}/{trials} trained){over}"
        )
    line = (
        f"trial {r.number} ({trained}/{trials} trained):{ref} {r.arch_summary}, acc {r.accuracy_text()}, "
        f"{r.costs_text(objectives)}, {r.steps_text()} steps"
    )
    return line + (f" — truncated ({r.truncation_text()}), kept off the front" if r.truncated else "") + over


def costing_text(ctx: TrialContext) -> str:
    """``objectives accuracy, decode latency, cache memory; decode latency per token at the context
    predicted for h200 (not timed here); generation costs at context 32,768 tokens, batch 1``: what
    the search scores and how its times are obtained, so a CPU run says its times are predictions
    before the first trial ends."""
    from nas.search.objectives import objectives_for

    objectives = objectives_for(ctx.objectives)
    how = "measured on this GPU" if ctx.measure else f"predicted for {ctx.profile.name} (not timed here)"
    times = {
        "latency_ms": f"at {ctx.shape}",
        "prefill_latency_ms": "at the context",
        "decode_latency_ms": "per token at the context",
    }
    timed = [f"{o.name.replace('_', ' ')} {times[o.metric]}" for o in objectives if o.metric in times]
    text = "objectives " + ", ".join(o.name.replace("_", " ") for o in objectives)
    if timed:
        text += f"; {' and '.join(timed)} {how}"
    if ctx.context:
        text += f"; generation costs at context {ctx.context:,} tokens, batch {ctx.decode_batch}"
    return text


def memory_warning(ctx: TrialContext) -> str | None:
    """``warning: memory at 4096x1048576 of the baselines (all-attention 2.416e+06 MiB, …) is more
    than h200's 141 GB (134,468 MiB): …``: said before the first trial when the space's reference
    architectures (``nas.search.baselines``, whether or not the study trains them) need more memory
    than the target GPU has at the shapes the study costs; None when they fit or the profile gives
    no ``memory_gb``."""
    from optuna.trial import FixedTrial

    from nas.latency import cache_memory, memory
    from nas.search.baselines import baselines

    if ctx.profile.memory_gb is None:
        return None
    archs = []
    for b in baselines(ctx.space):
        try:
            archs.append((b.label, ctx.space.sample(FixedTrial(b.params), ctx.task, ctx.seed).arch))
        except ValueError:  # a parameter the space draws that the baseline does not fix
            continue
    kinds = []
    if "memory_mb" in ctx.objectives:
        kinds.append((f"memory at {ctx.shape}", "--latency-shape", lambda arch: memory(arch, ctx.shape).total_mb))
    if "cache_memory_mb" in ctx.objectives and ctx.context:
        kinds.append(
            (
                f"cache memory at context {ctx.context:,} × batch {ctx.decode_batch}",
                "--context or --decode-batch",
                lambda arch: cache_memory(arch, ctx.context, ctx.decode_batch).total_mb,
            )
        )
    lines = []
    for what, flag, cost in kinds:
        over = [(label, mb) for label, arch in archs if ctx.profile.over_memory(mb := cost(arch)) is not None]
        if over:
            lines.append(
                f"warning: {what} of the baselines ({', '.join(f'{label} {mb:.4g} MiB' for label, mb in over)}) is "
                f"{ctx.profile.over_memory(over[0][1])}: such models cannot run on one {ctx.profile.name}; "
                f"a smaller {flag} costs what fits"
            )
    return "\n".join(lines) or None


def print_untrained(study: optuna.Study) -> None:
    """One line each for the trials that failed, broke a hard budget, were truncated or pruned."""
    from optuna.trial import TrialState

    from nas.search import record
    from nas.search.loop import n_infeasible, n_pruned, n_truncated
    from nas.search.resume import not_retrained

    skipped, truncated, pruned = n_infeasible(study), n_truncated(study), n_pruned(study)
    if failed := study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        reasons = collections.Counter(record.record(study, t).failure_kind() for t in failed)
        console.print(
            f"{len(failed)} trial(s) failed ({', '.join(f'{n} {why}' for why, n in reasons.most_common())}): "
            f"recorded with their reason, not counted toward --trials",
            soft_wrap=True,
        )
    if skipped:
        console.print(
            f"{skipped} candidate(s) broke a hard budget: recorded without training, not counted toward --trials",
            soft_wrap=True,
        )
    if truncated:
        hint = (
            "; to train them in full, resume with --retrain-truncated (and --max-train-seconds if the guard is "
            "too tight for this machine)"
            if not_retrained(study)
            else ""
        )
        console.print(
            f"{truncated} trial(s) stopped early by the time budget (max_train_seconds): recorded with "
            f"their steps, kept off the front and the hypervolume{hint}",
            soft_wrap=True,
        )
    if pruned:
        console.print(
            f"{pruned} trial(s) stopped early at a rung (their best case was dominated at their cost): recorded "
            f"as PRUNED with their partial curve, not counted toward --trials",
            soft_wrap=True,
        )
