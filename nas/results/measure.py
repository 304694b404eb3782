"""``nas measure``: time on this GPU the latencies a study predicted for it, and keep both.

A study searched on a CPU (or with ``--predict``) holds latencies predicted from its hardware
profile. On a GPU that profile lists, ``run_measure`` builds each chosen trial's architecture
(``nas.models.build(arch, seed=0)``, as the search's ``_score_latency`` does) and measures it
at the study's recorded latency shape, and the generation latencies its objectives ask for at
its context and decode batch. Each measurement is stored beside the prediction through
``nas.search.record.write_measured`` (one trial at a time: an interrupted run keeps what it
finished); from then on the front, the tables and the report read the measured value
(``TrialRecord.value``), while Optuna's stored ``values`` keep the prediction. Trials already
measured on this GPU are skipped unless ``again``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import optuna
import torch

from hardware_profiles import HardwareProfile, ProfileError, load_profile
from kernels.device import DeviceError, gpu_name, is_cuda, resolve
from nas.latency import KernelError, Latency, LatencyCache, LatencyShape, measure, measure_decode, parse_shape
from nas.models import build
from nas.results.pareto import completed, front
from nas.search.objectives import Objective
from nas.search.record import (
    Measured,
    TrialRecord,
    study_objectives,
    study_profile,
    study_setup,
    write_measured,
)
from nas.search.setup import SearchSetup

__all__ = [
    "MeasureError",
    "Miss",
    "Plan",
    "check_gpu",
    "local_gpu",
    "misses",
    "plan",
    "run_measure",
    "searched_setup",
]

logger = logging.getLogger(__name__)

_TIMES = ("latency_ms", "prefill_latency_ms", "decode_latency_ms")  # the objectives a GPU times


class MeasureError(ValueError):
    """The study cannot be measured here as asked; the message says why."""


@dataclass(frozen=True)
class Plan:
    """The trials to measure (``todo``) and those measured on this GPU already (``done``)."""

    todo: tuple[TrialRecord, ...]
    done: tuple[TrialRecord, ...]


@dataclass(frozen=True)
class Miss:
    """A prediction the measurement fell outside of: ``|measured / predicted - 1| > interval``."""

    trial: int
    objective: Objective
    predicted: Latency
    measured: Latency

    @property
    def error(self) -> float:
        """The measurement relative to the prediction, minus one (+0.5: 50 % slower than predicted)."""
        return self.measured.median_ms / self.predicted.median_ms - 1.0

    def text(self) -> str:
        """``trial 4: latency measured 0.0321 ms, predicted 0.0213 ms ±9% (+51%)``."""
        return (
            f"trial {self.trial}: {self.objective.name.replace('_', ' ')} measured {self.measured.median_ms:.4g} ms, "
            f"predicted {self.predicted.median_ms:.4g} ms ±{self.predicted.interval * 100:.0f}% ({self.error:+.0%})"
        )


def local_gpu(device: str) -> tuple[torch.device, str]:
    """The CUDA device ``device`` names (``cuda``, ``cuda:N``) and its GPU's name; MeasureError
    where it is no CUDA device or this machine has none."""
    try:
        found = resolve(device)
    except DeviceError as e:
        raise MeasureError(f"nas measure times kernels on a CUDA GPU: {e}") from None
    if not is_cuda(found):
        raise MeasureError(f"nas measure times kernels on a CUDA GPU; --device {device} is none (use cuda or cuda:N)")
    return found, gpu_name(found)


def _profile(study: optuna.Study, setup: SearchSetup) -> HardwareProfile:
    """The profile the study predicted for: as it recorded it, else the shipped one of that name."""
    recorded = study_profile(study)
    if recorded is not None:
        return recorded
    try:
        return load_profile(setup.profile)
    except ProfileError:
        raise MeasureError(
            f"study {study.study_name!r} predicted latency for profile {setup.profile!r}, which it did not record and "
            "which is not shipped: nothing says which GPU it stands for"
        ) from None


def searched_setup(study: optuna.Study) -> SearchSetup:
    """The setup nas search recorded in ``study`` (its latency shape, context, profile);
    MeasureError for a study nas search did not create."""
    setup = study_setup(study)
    if setup is None:
        raise MeasureError(f"study {study.study_name!r} was not created by nas search: no latency shape to measure at")
    return setup


def check_gpu(study: optuna.Study, setup: SearchSetup, gpu: str) -> None:
    """MeasureError unless ``gpu`` (``NVIDIA H200``) is a GPU the profile the study predicted
    for lists (``HardwareProfile.lists``): an H100 does not time an h200 study's predictions."""
    profile = _profile(study, setup)
    if not profile.lists(gpu):
        names = ", ".join(profile.device_names) or "no GPU name"
        raise MeasureError(
            f"study {study.study_name!r} predicted latency for {profile.name} ({names}); this GPU is {gpu}: "
            f"measure it on that kind of GPU"
        )


def plan(study: optuna.Study, gpu: str, *, front_only: bool = False, again: bool = False) -> Plan:
    """The trained trials whose latency the search predicted (``front_only``: those on the front,
    ``pareto.front``), split into those to measure and those measured on ``gpu`` already (none
    with ``again``). A candidate over a hard budget was never trained: with no accuracy it has no
    place on the front, so its latency is not measured."""
    chosen = front(study) if front_only else completed(study)
    predicted = [r for r in chosen if r.trained and r.arch is not None and r.latency and r.latency.predicted]
    done = [] if again else [r for r in predicted if r.measured is not None and r.measured.device == gpu]
    numbers = {r.number for r in done}
    return Plan(tuple(r for r in predicted if r.number not in numbers), tuple(done))


class _Fresh(LatencyCache):
    """The measurement cache for ``--again``: every timing is taken anew (and replaces the cached one)."""

    def get(self, key: str) -> Latency | None:
        return None


def _measure_one(
    r: TrialRecord, setup: SearchSetup, objectives: tuple[Objective, ...], device: torch.device, cache: LatencyCache
) -> Measured:
    """``r``'s latencies on ``device``: the forward at the study's latency shape, and the generation
    latencies among ``objectives`` at its context and decode batch (as ``_score_latency`` times them)."""
    wanted = {o.metric for o in objectives}
    model = build(r.arch, seed=0)
    lat = measure(model, parse_shape(setup.latency_shape), device=device, cache=cache)
    prefill = decode = None
    if setup.context and "prefill_latency_ms" in wanted:
        prefill = measure(model, LatencyShape(setup.decode_batch, setup.context), device=device, cache=cache)
    if setup.context and "decode_latency_ms" in wanted:
        decode = measure_decode(model, setup.decode_batch, setup.context, device=device, cache=cache)
    return Measured(lat, prefill, decode)


def misses(r: TrialRecord, objectives: tuple[Objective, ...]) -> list[Miss]:
    """Each of ``r``'s predictions (among ``objectives``' times) whose measurement lies outside its
    interval: ``|measured / predicted - 1| > interval``."""
    out = []
    for o in objectives:
        predicted, found = r.prediction_of(o.metric), r.measured.of(o.metric) if r.measured else None
        if predicted is None or found is None or not predicted.predicted or predicted.median_ms <= 0:
            continue
        if abs(found.median_ms / predicted.median_ms - 1.0) > predicted.interval:
            out.append(Miss(r.number, o, predicted, found))
    return out


OnTrial = Callable[[int, int, TrialRecord, str | None], None]


def run_measure(
    study: optuna.Study,
    todo: tuple[TrialRecord, ...],
    setup: SearchSetup,
    device: torch.device,
    *,
    again: bool = False,
    on_trial: OnTrial | None = None,
) -> list[TrialRecord]:
    """Measure ``todo`` (``plan``) on ``device`` and store each measurement as it is taken;
    ``study`` must be open for writing. Returns the measured trials' records, each with its
    measurement (``TrialRecord.measured``). A trial whose kernels fail or that does not fit the
    GPU is left as predicted and named to ``on_trial(i, n, record, failure)``, which follows
    each trial (``failure`` None: measured)."""
    objectives = tuple(o for o in study_objectives(study) if o.metric in _TIMES)
    cache = _Fresh() if again else LatencyCache()
    done = []
    for i, r in enumerate(todo, start=1):
        failure = None
        try:
            found = _measure_one(r, setup, objectives, device, cache)
        except (KernelError, torch.OutOfMemoryError) as e:
            failure = f"{type(e).__name__}: {e}".splitlines()[0]
            torch.cuda.empty_cache()
        else:
            write_measured(study, r.number, found)
            r = dataclasses.replace(r, measured=found)
            done.append(r)
            logger.info("measure: trial %d: %.4g ms on %s", r.number, found.latency.median_ms, found.device)
        if on_trial is not None:
            on_trial(i, len(todo), r, failure)
    return done
