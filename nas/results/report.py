"""Offline HTML report of a study: fronts, hypervolume history, parallel coordinates, front table.

Figures are plotly (and Optuna's hypervolume plot); the page embeds plotly.js once, so it opens
with no network. ``write_pngs`` renders the same figures to PNG through kaleido.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import logging
import math
import shutil
import textwrap
import warnings
from pathlib import Path

import optuna
import plotly.colors
import plotly.graph_objects as go
from optuna.trial import TrialState
from plotly.subplots import make_subplots

from hardware_profiles import HardwareProfile
from nas.latency import parse_shape, predict, predict_decode, shared_labels
from nas.results.fidelity import fidelity, pairs
from nas.results.pareto import accuracy_epsilon, completed, default_pick, front, primary_cost, reference_point
from nas.search.objectives import Objective
from nas.search.record import TrialRecord, records, study_budgets, study_objectives, study_profile, study_setup
from nas.search.setup import StudyBudgets
from nas.search.storage import file_in_the_way, output_clash
from nas.spec import PRECISION_FIELDS

__all__ = [
    "PLOT_CONFIG",
    "ReportError",
    "check_outputs",
    "figures",
    "find_chrome",
    "hover_text",
    "write_html",
    "write_pngs",
]

PLOT_CONFIG = {"displaylogo": False, "showSendToCloud": False}  # offline: no plotly logo link, no cloud button
_FRONT, _DOMINATED, _INFEASIBLE = "#d62728", "#b8b8b8", "#7f7f7f"
_HEIGHT_3D = 720  # px: the 3-D front's cube whole at the page's 1200 px width (see _front_3d)
_PNG_NAMES = ("front2d", "front3d", "hypervolume", "parallel", "fidelity")  # every figure a PNG may be written for


def _counts(study: optuna.Study) -> str:
    """``12 trained trials, 2 over a budget (not trained), 3 failed (2 diverged, 1 interrupted)``:
    "completed" counted the budget breakers, which never trained, and failures went unmentioned
    (and "12 trained trials (2 over a budget, not trained)" read as if the 2 were among the 12)."""
    done = completed(study)
    trained = sum(r.trained for r in done)
    failed = records(study, (TrialState.FAIL,))
    notes = [f"{len(done) - trained} over a budget (not trained)"] if len(done) > trained else []
    if failed:
        kinds = collections.Counter(r.failure_kind() for r in failed)
        notes.append(f"{len(failed)} failed (" + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()) + ")")
    return ", ".join([f"{trained} trained trials", *notes])


class ReportError(ValueError):
    """The report cannot be made as asked; the message says why."""


def one_line(r: TrialRecord) -> str:
    """``A L L M | d=128 | 412K params | adamw lr=2e-03``"""
    return f"{r.arch_summary} | {r.params_text()} params | {r.recipe()}"


def _spread(lat) -> str:
    """`` (IQR 0.002)`` for a measurement, `` [0.9, 1.1]`` for a prediction's interval."""
    if lat is not None and lat.source == "measured" and lat.iqr_ms:
        return f" (IQR {lat.iqr_ms:.3g})"
    if lat is not None and lat.interval:
        return f" [{lat.low_ms:.4g}, {lat.high_ms:.4g}]"
    return ""


def _predicted(r: TrialRecord, metric: str) -> str:
    """``; predicted 0.0213 [0.0194, 0.0232] ms (h200, …)``: the search's prediction of a latency
    ``nas measure`` timed since, for beside the measurement; empty for any other."""
    lat = r.prediction_of(metric)
    if lat is None:
        return ""
    return f"; {html.escape(lat.source)} {lat.median_ms:.4g}{_spread(lat)} ms ({html.escape(lat.label())})"


def _precision_hover(r: TrialRecord, searched: bool) -> str | None:
    """``kv fp8, weights fp8 (accuracy at it; 0.930 at full precision)``: how the trial stores its KV
    cache, state and weights; ``full`` at full precision in a study that searches precision
    (``searched``); None otherwise, and for a trial without an architecture."""
    if r.arch is None or (r.arch.full_precision and not searched):
        return None
    if r.arch.full_precision:
        return "full (the kernels' dtypes)"
    full = r.full_precision_accuracy
    return r.arch.precision_text() + ("" if full is None else f" (accuracy at it; {full:.3f} at full precision)")


# the front's marker per precision setting, in a study that searches precision (the first: full)
_SETTING_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "hexagon", "pentagon", "cross")


def _by_precision(trials: list[TrialRecord], searched: bool) -> list[tuple[str | None, list[TrialRecord]]]:
    """``trials`` grouped by how they store their KV cache, state and weights (``full precision``
    first, then by name), one group of all with no label where the study does not search it; past
    ``_SETTING_SYMBOLS`` settings the rest share the last group's label ``other precision``."""
    if not searched:
        return [(None, trials)]
    groups: dict[str, list[TrialRecord]] = {}
    for r in trials:
        text = r.arch.precision_text() if r.arch is not None else ""
        groups.setdefault(text or "full precision", []).append(r)
    names = sorted(groups, key=lambda name: (name != "full precision", name))
    keep, rest = names[: len(_SETTING_SYMBOLS) - 1], names[len(_SETTING_SYMBOLS) - 1 :]
    out = [(name, groups[name]) for name in keep]
    if rest:
        out.append((rest[0] if len(rest) == 1 else "other precision", [r for n in rest for r in groups[n]]))
    return out


def _searches_precision(study: optuna.Study) -> bool:
    """Whether some trial of ``study`` stores its KV cache, state or weights below full precision."""
    return any(r.arch is not None and not r.arch.full_precision for r in completed(study))


def hover_text(r: TrialRecord, objectives: tuple[Objective, ...] = (), precision: bool = False) -> str:
    """The trial, its accuracy, memory, forward latency and any other objective of the study
    (a latency with its spread and how it was obtained; a measured one with its prediction), and
    its precision where it is below full, or in a study that searches it (``precision``)."""
    extra = []
    for o in objectives:
        lat = r.latency_of(o.metric)
        if o.metric in ("accuracy", "latency_ms", "memory_mb") or (value := r.value(o.metric)) is None:
            continue
        if lat is not None:
            extra.append(
                f"{o.name.replace('_', ' ')} {value:.4g}{_spread(lat)} ms, {html.escape(lat.label())}"
                + _predicted(r, o.metric)
            )
        else:
            extra.append(f"{o.name.replace('_', ' ')} {html.escape(o.format(value))}")
    return "<br>".join(
        [
            html.escape(one_line(r)),
            f"trial {r.number}: accuracy {r.accuracy_text()}, memory {r.memory_mb:.3g} MiB",
            *([html.escape(f"accuracy: {pop}")] if (pop := r.population_text()) else []),
            *([html.escape(f"precision: {text}")] if (text := _precision_hover(r, precision)) else []),
            f"latency {r.latency_ms:.4g}{_spread(r.latency_of('latency_ms'))} ms, {html.escape(r.latency_label())}"
            + _predicted(r, "latency_ms"),
            *extra,
            *([f"baseline: {html.escape(r.baseline)}"] if r.baseline else []),
            *([f"not trained: {html.escape(r.skipped_training)}"] if r.skipped_training else []),
            *([f"not on the front: {html.escape(late)}"] if (late := r.over_budget_text()) else []),
            *(
                [f"not on the front: training stopped early ({html.escape(r.truncation_text())})"]
                if r.truncated
                else []
            ),
        ]
    )


def _split(study: optuna.Study, epsilon: float | None = None) -> dict[str, list[TrialRecord]]:
    """Completed trials by how they are drawn: front, dominated, truncated (training cut short by
    the wall-clock guard), over budget (a hard budget broken, so never trained: no accuracy) and
    infeasible (trained, yet over a budget the study set after it was trained)."""
    best = front(study, epsilon)
    ids = {r.number for r in best}
    done = completed(study)
    return {
        "front": best,
        "dominated": [r for r in done if r.feasible and not r.truncated and r.number not in ids],
        "truncated": [r for r in done if r.truncated],
        "over_budget": [r for r in done if not r.trained],
        "infeasible": [r for r in done if r.trained and not r.feasible and not r.truncated],
    }


# A candidate over a hard budget is never trained, so it has no accuracy: it is drawn at its cost
# on the accuracy-0 line, as a tick, under a name that says so (the hover names the budget)
_OVER_BUDGET = "over budget (not trained: no accuracy, drawn at 0)"
# a trial trained before a resume tightened a budget it breaks: shown, kept off the front
_OVER_LATER = "over budget (set after it was trained)"


def _error(trials: list[TrialRecord], metric: str) -> dict | None:
    """Error bars of a latency objective: a prediction's interval, a measurement's IQR (half each
    side); None for an objective that is not a latency."""
    if not any(r.latency_of(metric) is not None for r in trials):
        return None

    def bounds(r: TrialRecord) -> tuple[float, float]:
        lat = r.latency_of(metric)
        if lat is None:
            return 0.0, 0.0
        if lat.interval:
            return lat.high_ms - lat.median_ms, lat.median_ms - lat.low_ms
        return lat.iqr_ms / 2, lat.iqr_ms / 2

    plus, minus = zip(*(bounds(r) for r in trials), strict=True) if trials else ((), ())
    return dict(type="data", array=list(plus), arrayminus=list(minus), visible=True, thickness=1, width=2)


def _accuracy_error(trials: list[TrialRecord]) -> dict | None:
    """Error bars of accuracy: each trial's ``±`` (``accuracy_interval``) above and below it, cut
    at 0 and 1 (an accuracy is neither below nor above them); None when no trial recorded one."""
    if not any(r.accuracy_interval for r in trials):
        return None
    spread = [r.accuracy_interval or 0.0 for r in trials]
    accuracy = [r.accuracy or 0.0 for r in trials]
    up = [round(min(s, 1.0 - a), 6) for s, a in zip(spread, accuracy, strict=True)]
    down = [round(min(s, a), 6) for s, a in zip(spread, accuracy, strict=True)]
    return dict(type="data", array=up, arrayminus=down, symmetric=False, visible=True, thickness=1, width=2)


_PICK_RULE = "the cheapest trial within ε of the best accuracy"  # nas export's default pick


def _picks(epsilon: float | None, what: str = "this") -> str:
    """``nas export picks this``: the note, plot label and header line of the trial ``nas export``
    takes by default (with the report's ``--accuracy-epsilon``, if it set one)."""
    flag = "" if epsilon is None else f" --accuracy-epsilon {epsilon:g}"
    return f"nas export{flag} picks {what}"


def _axis(study: optuna.Study, o: Objective) -> str:
    """``latency (ms) (measured (NVIDIA H200))``: the objective and how its values were obtained."""
    labels = shared_labels(lat for r in completed(study) if (lat := r.latency_of(o.metric)) is not None)
    setup = study_setup(study)
    at = f" at {setup.context:,} tokens × {setup.decode_batch}" if o.context and setup and setup.context else ""
    return f"{o.label}{at}" + (f" ({'; '.join(labels)})" if labels else "")


def _cost(r: TrialRecord, o: Objective) -> float:
    value = r.value(o.metric)
    return math.nan if value is None else value


def _front_2d(study: optuna.Study, budgets: dict, epsilon: float | None = None) -> go.Figure:
    objectives = study_objectives(study)
    cost = primary_cost(objectives)
    searched = _searches_precision(study)
    hover = lambda trials: [hover_text(r, objectives, searched) for r in trials]  # noqa: E731
    groups = _split(study, epsilon)
    best = groups["front"]
    fig = go.Figure()
    for name, trials, style in (
        (_OVER_BUDGET, groups["over_budget"], dict(color=_INFEASIBLE, symbol="line-ns-open", size=9)),
        (_OVER_LATER, groups["infeasible"], dict(color=_INFEASIBLE, symbol="x", size=7)),
        ("truncated (not on the front)", groups["truncated"], dict(color=_INFEASIBLE, symbol="triangle-down", size=7)),
        ("dominated", groups["dominated"], dict(color=_DOMINATED, size=7)),
    ):
        if not trials and name != "dominated":
            continue  # drawn only when some trial is of that kind
        fig.add_trace(
            go.Scatter(
                x=[_cost(r, cost) for r in trials],
                y=[r.accuracy for r in trials],
                mode="markers",
                name=name,
                marker=style,
                error_y=_accuracy_error(trials) if name == "dominated" else None,
                hovertext=hover(trials),
                hoverinfo="text",
            )
        )
    front_name = f"Pareto front ({', '.join(o.name.replace('_', ' ') for o in objectives)})"
    for (setting, trials), symbol in zip(_by_precision(best, searched), _SETTING_SYMBOLS, strict=False):
        fig.add_trace(
            go.Scatter(
                x=[_cost(r, cost) for r in trials],
                y=[r.accuracy for r in trials],
                mode="markers",
                name=front_name if setting is None else f"{front_name}: {setting}",
                error_x=_error(trials, cost.metric),
                error_y=_accuracy_error(trials),
                marker=dict(color=_FRONT, size=10, symbol=symbol, line=dict(color="white", width=1)),
                hovertext=hover(trials),
                hoverinfo="text",
            )
        )
    refs = [r for r in completed(study) if r.baseline is not None and r.trained]
    if refs:  # the reference architectures, ringed and named wherever they landed
        refs.sort(key=lambda r: (_cost(r, cost), r.number))
        fig.add_trace(
            go.Scatter(
                x=[_cost(r, cost) for r in refs],
                y=[r.accuracy for r in refs],
                mode="markers+text",
                name="baselines",
                text=[r.baseline for r in refs],
                # neighbours in cost take turns below and above their marker: two baselines that
                # land together (often: they score alike) keep their names apart
                textposition=[_LABEL_SIDES[i % len(_LABEL_SIDES)] for i in range(len(refs))],
                marker=dict(symbol="diamond-open", color="black", size=15, line=dict(width=2)),
                hovertext=hover(refs),
                hoverinfo="text",
            )
        )
    _add_staircase(fig, best, cost)
    _add_pick_and_budget(fig, study, cost, budgets, epsilon)
    fig.update_layout(
        title=f"Accuracy vs {cost.name.replace('_', ' ')}",
        xaxis_title=_wrapped(_axis(study, cost)),
        yaxis_title="accuracy",
        template="plotly_white",
        height=520,
    )
    return fig


_LABEL_SIDES = ("bottom center", "top center")
_TITLE_WIDTH = 90  # characters a line of an axis title holds in the report's figures (and their PNGs)


def _wrapped(title: str) -> str:
    """``title`` broken into lines of at most ``_TITLE_WIDTH`` characters (plotly's ``<br>``): a
    long one (a latency's label with its precision note) runs past the figure's edges, clipped."""
    keep = title.replace(" %", "\u00a0%")  # never "±24" at a line's end and "%" on the next
    return "<br>".join(textwrap.wrap(keep, _TITLE_WIDTH, break_long_words=False)) or title


def _add_staircase(fig: go.Figure, best: list[TrialRecord], cost: Objective) -> None:
    # The staircase joins the trials that stay optimal in this 2D view (each more accurate than
    # every cheaper one); the others are on the front only through another objective.
    stairs, best_acc = [], -1.0
    for r in sorted(best, key=lambda r: (_cost(r, cost), -r.accuracy)):
        if r.accuracy > best_acc:
            stairs.append(r)
            best_acc = r.accuracy
    fig.add_trace(
        go.Scatter(
            x=[_cost(r, cost) for r in stairs],
            y=[r.accuracy for r in stairs],
            mode="lines",
            name=f"accuracy–{cost.name.replace('_', ' ')} front",
            line=dict(color=_FRONT, shape="hv", width=1.5),
            hoverinfo="skip",
        )
    )


def _add_pick_and_budget(
    fig: go.Figure, study: optuna.Study, cost: Objective, budgets: dict, epsilon: float | None
) -> None:
    """``nas export``'s default pick, starred, and the latency budget as a dashed line."""
    if (chosen := default_pick(study, epsilon)) is not None:  # a note, not a trace: the point keeps its hover
        fig.add_annotation(
            x=_cost(chosen, cost),
            y=chosen.accuracy,
            text=f"★ {_picks(epsilon, f'trial {chosen.number}')}",
            hovertext=_PICK_RULE,
            showarrow=True,
            arrowhead=2,
            ax=40,
            ay=-30,
        )
    if budgets.get("max_latency_ms") and cost.metric == "latency_ms":
        fig.add_vline(
            x=budgets["max_latency_ms"],
            line_dash="dash",
            line_color="black",
            annotation_text=f"max latency {budgets['max_latency_ms']:g} ms",
        )


def _front_3d(study: optuna.Study, epsilon: float | None = None) -> go.Figure | None:
    """Accuracy over the study's first two costs; None when it has only one."""
    objectives = study_objectives(study)
    searched = _searches_precision(study)
    costs = [o for o in objectives if o.metric != "accuracy"]
    if len(costs) < 2:
        return None
    x, y = costs[0], costs[1]
    groups = _split(study, epsilon)
    fig = go.Figure()
    for name, trials, color, size in (
        (_OVER_BUDGET, groups["over_budget"], _INFEASIBLE, 2),
        (f"{_OVER_LATER} or truncated", groups["infeasible"] + groups["truncated"], _INFEASIBLE, 3),
        ("dominated", groups["dominated"], _DOMINATED, 4),
        ("Pareto front", groups["front"], _FRONT, 6),
    ):
        if not trials and name != "Pareto front":
            continue
        fig.add_trace(
            go.Scatter3d(
                x=[_cost(r, x) for r in trials],
                y=[_cost(r, y) for r in trials],
                z=[r.accuracy for r in trials],
                mode="markers",
                name=name,
                marker=dict(color=color, size=size),
                error_z=_accuracy_error(trials) if name == "Pareto front" else None,
                hovertext=[hover_text(r, objectives, searched) for r in trials],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title=f"Accuracy × {x.name.replace('_', ' ')} × {y.name.replace('_', ' ')}",
        template="plotly_white",
        # plotly's default camera (eye 1.25, 1.25, 1.25) in a 600 px figure pushed the cube's near
        # corner below the plot in a 1400 px window: a taller figure, slim margins, a camera further
        # out and lower keep all three axes inside it
        height=_HEIGHT_3D,
        margin=dict(l=10, r=10, t=60, b=10),
        scene=dict(
            xaxis_title=x.label,
            yaxis_title=y.label,
            zaxis_title="accuracy",
            aspectmode="cube",
            camera=dict(eye=dict(x=1.6, y=1.6, z=0.9)),
        ),
    )
    return fig


def _hypervolume(study: optuna.Study) -> go.Figure:
    objectives = study_objectives(study)
    # Optuna's history is of the stored values, which keep a prediction nas measure timed since
    searched = [dataclasses.replace(r, measured=None) for r in completed(study)]
    reference = reference_point(searched, objectives)
    quiet = logging.getLogger("optuna.visualization._hypervolume_history")
    level = quiet.level
    with warnings.catch_warnings():  # experimental since Optuna 3.3
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # feasible trials only (Optuna's rule): truncated and over-budget trials add nothing. With
        # none, Optuna logs a warning of its own; the report's header and front table say it.
        quiet.setLevel(logging.ERROR)
        try:
            fig = optuna.visualization.plot_hypervolume_history(study, [reference[o.metric] for o in objectives])
        finally:
            quiet.setLevel(level)
    arrows = ", ".join(f"{o.name.replace('_', ' ')} {'↑' if o.maximize else '↓'}" for o in objectives)
    fig.update_layout(title=f"Hypervolume history ({arrows})", template="plotly_white")
    return fig


def _parallel(study: optuna.Study) -> go.Figure:
    """The trained trials' parameters and objectives, coloured by accuracy. Candidates over a hard
    budget were never trained and have no accuracy: they are left out (the title counts them)."""
    done = [r for r in completed(study) if r.arch is not None and r.train is not None]
    trials = [r for r in done if r.trained]
    untrained = len(done) - len(trials)
    mixers = [[layer.mixer for layer in r.arch.layers] for r in trials]

    def dim(label: str, values: list[float]) -> dict:
        return dict(label=label, values=values)

    dims = [
        dim("depth", [len(m) for m in mixers]),
        dim("d_model", [r.arch.d_model for r in trials]),
        dim("# attention", [m.count("attention") for m in mixers]),
        dim("# linear attn", [m.count("linear_attention") for m in mixers]),
        dim("# MLP-only", [m.count("none") for m in mixers]),
        dim("log10 params", [math.log10(max(1, r.params)) for r in trials]),
        dim("log10 lr", [math.log10(r.train.lr) for r in trials]),
        dim("steps", [r.train.steps for r in trials]),
        *(_precision_dims(trials) if _searches_precision(study) else []),
        *(dim(o.label, [_cost(r, o) for r in trials]) for o in study_objectives(study) if o.metric != "accuracy"),
        dim("accuracy", [r.accuracy for r in trials]),
    ]
    fig = go.Figure(
        go.Parcoords(
            line=dict(
                color=[r.accuracy for r in trials],
                colorscale="Viridis",
                showscale=True,
                colorbar=dict(title="accuracy"),
            ),
            dimensions=dims,
        )
    )
    left_out = f" ({untrained} over budget, never trained, left out)" if untrained else ""
    fig.update_layout(
        title=f"Architecture parameters, coloured by accuracy{left_out}", template="plotly_white", height=480
    )
    return fig


def _precision_dims(trials: list[TrialRecord]) -> list[dict]:
    """Per trial, how many of its layers store each field narrower than full precision (``# kv
    fp8``, ``# state bf16``, ``# weight fp8``): the parallel plot's axes in a study that searches it."""
    out = []
    for name, allowed in PRECISION_FIELDS.items():
        narrow = allowed[-1]
        counts = [sum(getattr(la, name) == narrow for la in r.arch.layers if la.stores(name)) for r in trials]
        out.append(dict(label=f"# {name.removesuffix('_dtype')} {narrow}", values=counts))
    return out


def _fidelity(study: optuna.Study, epsilon: float | None = None) -> go.Figure | None:
    """Short-run (the search's) vs long-run (``nas verify``'s) accuracy of the verified trials, the
    front's in its colour, with the diagonal and the rank correlations in the title; None for a
    study never verified."""
    found = fidelity(study)
    if found is None:
        return None
    on_front = {r.number for r in front(study, epsilon)}
    both = [(r, row) for r, row in pairs(study) if row.accuracy is not None]
    fig = go.Figure()
    for name, group, color in (
        ("front", [p for p in both if p[0].number in on_front], _FRONT),
        ("off the front", [p for p in both if p[0].number not in on_front], _DOMINATED),
    ):
        if not group:
            continue
        fig.add_trace(
            go.Scatter(
                x=[r.accuracy for r, _ in group],
                y=[row.accuracy for _, row in group],
                mode="markers+text",
                name=name,
                text=[str(r.number) for r, _ in group],
                textposition="top center",
                marker=dict(color=color, size=10, line=dict(color="white", width=1)),
                hovertext=[
                    f"{hover_text(r)}<br>long run: {row.steps} steps, accuracy {row.accuracy:.3f}" for r, row in group
                ],
                hoverinfo="text",
            )
        )
    values = [v for r, row in both for v in (r.accuracy, row.accuracy)] or [0.0, 1.0]
    low, high = min(values), max(values)
    fig.add_trace(
        go.Scatter(
            x=[low, high], y=[low, high], mode="lines", name="equal", line=dict(color="black", dash="dot", width=1)
        )
    )
    fig.update_layout(
        title=f"Short-run vs {found.steps_factor:g}× steps accuracy, {found.ranked} trials: {found.proxy.text()}"
        + ("" if found.proxy.too_few else f" (parameter count: {found.params.text()})"),
        xaxis_title="accuracy in the search (short run)",
        yaxis_title=f"accuracy after {found.steps_factor:g}× the steps (nas verify)",
        template="plotly_white",
        height=520,
    )
    return fig


# kernel families of a forward's breakdown (``Latency.breakdown`` names, ``layers.<i>.<op>``) and
# of a decode step's (``nas.latency._decode.DECODE_FEATURES``), in stacking order
_FORWARD_FAMILIES = {
    "embed": "embedding",
    "mixer_norm": "norms",
    "mlp_norm": "norms",
    "final_norm": "norms",
    "qkv": "q/k/v projection",
    "short_conv": "short conv",
    "attention": "softmax attention",
    "linear_attention": "linear attention",
    "out": "output projection",
    "mlp_up": "MLP",
    "mlp_down": "MLP",
    "head": "output head",
    "graph": "launch / graph overhead",
}
_DECODE_FAMILIES = {
    "launches": "kernel launches",
    "weight_mb": "reading weights",
    "cache_mb_d16": "reading the KV cache",
    "cache_mb_d32": "reading the KV cache",
    "cache_mb_d64": "reading the KV cache",
    "cache_mb_d128": "reading the KV cache",
    "state_mb": "reading / writing the state",
    "unaligned_launches": "kernel launches",
    "unaligned_weight_mb": "reading weights",
}


def _families(breakdown: tuple[tuple[str, float], ...], names: dict[str, str]) -> dict[str, float]:
    """ms per family (an unknown op keeps its own name), in ``names``' order first."""
    out: dict[str, float] = {family: 0.0 for family in dict.fromkeys(names.values())}
    for op, ms in breakdown:
        family = names.get(op.rsplit(".", 1)[-1], op.rsplit(".", 1)[-1])
        out[family] = out.get(family, 0.0) + ms
    return {k: v for k, v in out.items() if v > 0}


def _latency_split(r: TrialRecord, metric: str, profile: HardwareProfile | None, setup) -> tuple[dict, str] | None:
    """``r``'s latency for ``metric`` by op (ms, summing to the latency shown for it) and where the
    split comes from. A measured latency is one graph replay with no per-op times: it is split in
    the shares of the cost model's prediction (the search's own, or one made now for the study's
    profile), scaled to the measured total, and says so."""
    shown = r.latency_of(metric)
    if shown is None:
        return None
    if shown.breakdown:
        return dict(shown.breakdown), f"{shown.source} on {shown.device}"
    model = r.searched_latency(metric)
    if (model is None or not model.breakdown) and profile is not None and r.arch is not None and setup is not None:
        if metric == "latency_ms":
            model = predict(r.arch, parse_shape(setup.latency_shape), profile)
        elif metric == "decode_latency_ms" and setup.context:
            model = predict_decode(r.arch, setup.decode_batch, setup.context, profile)
    if model is None or not model.breakdown or model.median_ms <= 0:
        return None
    scale = shown.median_ms / model.median_ms
    split = {op: ms * scale for op, ms in model.breakdown}
    return split, f"measured on {shown.device}, split in the cost model's shares ({profile.name if profile else '?'})"


def _breakdown(study: optuna.Study, epsilon: float | None = None) -> go.Figure | None:
    """Where the front's latency goes: a stacked bar per front trial of the forward (and, with a
    decode objective, the decode step) by kernel family, adding up to the latency the table shows:
    a prediction's own per-launch terms, or a measurement split in the cost model's shares."""
    shown = sorted(front(study, epsilon), key=lambda r: r.latency_ms)
    profile, setup = study_profile(study), study_setup(study)
    panels = [("forward", "latency_ms", _FORWARD_FAMILIES)]
    if "decode_latency_ms" in {o.metric for o in study_objectives(study)}:
        panels.append(("decode step", "decode_latency_ms", _DECODE_FAMILIES))
    bars: list[tuple[str, list[str], dict[str, list[float]], list[str]]] = []
    for title, metric, names in panels:
        rows = [(r, found) for r in shown if (found := _latency_split(r, metric, profile, setup)) is not None]
        if not rows:
            continue
        labels = [f"#{r.number} {r.arch_summary}" for r, _ in rows]
        per = [_families(tuple(split.items()), names) for _, (split, _) in rows]
        order = list(dict.fromkeys(names.values()))
        seen = dict.fromkeys(f for p in per for f in p)
        families = sorted(seen, key=lambda f: order.index(f) if f in order else len(order))
        sources = [source for _, (_, source) in rows]
        bars.append((title, labels, {f: [p.get(f, 0.0) for p in per] for f in families}, sources))
    if not bars:
        return None
    titles = [f"{t} (ms, {', '.join(sorted(set(sources)))})" for t, _, _, sources in bars]
    fig = make_subplots(rows=1, cols=len(bars), subplot_titles=titles, horizontal_spacing=0.2)
    palette = plotly.colors.qualitative.Plotly + plotly.colors.qualitative.Set2
    colour: dict[str, str] = {}
    for col, (title, labels, by_family, sources) in enumerate(bars, start=1):
        for family, values in by_family.items():
            colour.setdefault(family, palette[len(colour) % len(palette)])
            fig.add_trace(
                go.Bar(
                    y=labels,
                    x=values,
                    name=family,
                    orientation="h",
                    marker_color=colour[family],
                    legendgroup=family,
                    showlegend=col == 1 or family not in _FORWARD_FAMILIES.values(),
                    customdata=sources,
                    hovertemplate=f"%{{y}}<br>{family}: %{{x:.4g}} ms ({title}, %{{customdata}})<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_layout(
        barmode="stack",
        title="where the front's latency goes, by kernel family",
        height=max(160 + 28 * max(len(labels) for _, labels, _, _ in bars), 200 + 22 * len(colour)),
        legend={"traceorder": "normal"},
    )
    fig.update_yaxes(autorange="reversed")  # the cheapest front trial on top
    return fig


def _cell(r: TrialRecord, o: Objective) -> str:
    """A front-table cell: the value, a prediction's interval (accuracy: its spread over seeds) and
    whether it was measured; a latency ``nas measure`` timed, with the search's prediction beside
    it (``0.025 (measured; predicted 0.0213 ±9%)``)."""
    value = r.value(o.metric)
    if value is None:
        return "?"
    if o.metric == "accuracy":
        return r.accuracy_text() if r.trained else "not trained"
    lat = r.latency_of(o.metric)
    if lat is None:
        return f"{value:.4g}"
    interval = f" ±{lat.interval * 100:.0f}%" if lat.interval else ""
    if (predicted := r.prediction_of(o.metric)) is not None:
        spread = f" ±{predicted.interval * 100:.0f}%" if predicted.interval else ""
        return f"{value:.4g}{interval} ({lat.source}; predicted {predicted.median_ms:.4g}{spread})"
    return f"{value:.4g}{interval} ({lat.source})"


def front_table_html(study: optuna.Study, epsilon: float | None = None) -> str:
    """The front as a plain HTML table: every row shows, however many (a plotly table figure has a
    fixed height and clipped long fronts), and it reads without scripts. The baselines follow
    the front rows, marked, wherever they landed, and so does the trial ``nas export`` takes when a
    cheaper level trial stands for it on the front (its note says it is the pick). Columns: the
    study's objectives."""
    objectives = study_objectives(study)
    if "accuracy" not in [o.metric for o in objectives]:
        objectives = (Objective("accuracy", "accuracy", "maximize", "accuracy"), *objectives)
    best = front(study, epsilon)
    ids = {r.number for r in best}
    chosen = default_pick(study, epsilon)
    star = chosen.number if chosen is not None else None
    refs = [  # over budget too
        r for r in completed(study) if r.number not in ids and (r.baseline is not None or r.number == star)
    ]
    header = ("trial", "architecture", *(o.label for o in objectives), "note")

    profile = study_profile(study)  # a memory over its GPU's is noted: such a model cannot run on it

    def note(r: TrialRecord) -> str:
        pick = f"{_picks(epsilon)} ({_PICK_RULE})" if r.number == star else ""
        return "; ".join(n for n in (_note(r, r.number in ids), pick, *r.over_device(objectives, profile)) if n)

    rows = [(str(r.number), one_line(r), *(_cell(r, o) for o in objectives), note(r)) for r in best + refs]
    cell = "<td>{}</td>".format
    body = "".join("<tr>" + "".join(cell(html.escape(v)) for v in row) + "</tr>" for row in rows)
    return (
        f"<h2>Pareto front: {len(best)} trials</h2>"
        f"<table id='front-table'><thead><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in header)}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _note(r: TrialRecord, on_front: bool) -> str:
    """``baseline: all-attention`` for a reference trial on the front, and why one is off it
    (``…, truncated (time budget: 177/300 steps), not on the front``, over a budget, or
    dominated); ``not on the front`` for another trial listed off it (the pick); empty for a
    front trial."""
    if r.baseline is None:
        return "" if on_front else "not on the front (a cheaper trial level with it stands for it)"
    if not r.trained:
        return f"baseline: {r.baseline}, over budget ({r.skipped_training}), never trained"
    if on_front:
        return f"baseline: {r.baseline}"
    if r.truncated:
        why = f"truncated ({r.truncation_text()}), not on the front"
    elif (late := r.over_budget_text()) is not None:
        why = f"{late}, not on the front"
    else:
        why = "not on the front (a front trial is as good or better on every objective)"
    return f"baseline: {r.baseline}, {why}"


def figures(study: optuna.Study, epsilon: float | None = None) -> dict[str, go.Figure]:
    """The report's figures by element id, in page order (``epsilon``: ``pareto.accuracy_epsilon``)."""
    if not completed(study):
        raise ReportError(f"study {study.study_name!r} has no completed trial yet; run nas search first")
    budgets = (study_budgets(study) or StudyBudgets()).to_dict()
    figs = {
        "front2d": _front_2d(study, budgets, epsilon),
        "front3d": _front_3d(study, epsilon),
        "hypervolume": _hypervolume(study),
        "parallel": _parallel(study),
        "fidelity": _fidelity(study, epsilon),
        "breakdown": _breakdown(study, epsilon),
    }
    return {name: fig for name, fig in figs.items() if fig is not None}


_REPORT_TITLE = "hybrid-nas report</title>"  # in every report's <head>: what --out may replace


def _check_file(path: Path, flag: str, storage: str | None) -> None:
    """ReportError unless ``path`` can be written as a file without touching the study's storage."""
    if storage is not None and (clash := output_clash(path, storage)) is not None:
        raise ReportError(f"{flag} {path} {clash}; write the report elsewhere")
    if path.is_dir():
        raise ReportError(f"{flag} {path} is a directory; give a file path (e.g. {path / 'report.html'})")
    if (blocker := file_in_the_way(path)) is not None:
        raise ReportError(f"{flag} {path}: {blocker} is a file, not a directory")


def is_report(path: Path) -> bool:
    """Whether ``path`` is a report this module wrote (its title is in the first 4 KB) or empty:
    the only files ``--out`` replaces without ``--force``."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return not head or _REPORT_TITLE.encode() in head


def png_renderer() -> str:
    """The Chrome/Chromium kaleido will drive for ``--png``, or ReportError naming what is missing
    (a browser, kaleido): checked with the other outputs, before the HTML is written."""
    chrome = find_chrome()
    if chrome is None:
        raise ReportError("--png needs Chrome or Chromium on PATH (e.g. apt install chromium); none was found")
    try:
        import kaleido  # noqa: F401 — optional extra: pip install -e '.[png]'
    except ImportError:
        raise ReportError("--png needs kaleido: pip install -e '.[png]'") from None
    return chrome


def check_outputs(
    out: str | Path, png: str | Path | None = None, *, storage: str | None = None, force: bool = False
) -> None:
    """ReportError naming the flag when ``--out`` (the HTML file) or ``--png`` (a directory) cannot
    be written, would overwrite the study's journal, database or artifacts (``storage``; never,
    even with ``force``), or ``--out`` is an existing file other than an earlier report (a data
    file, a space; ``force`` replaces it), or ``--png`` has no browser or kaleido to render with:
    checked before anything is written."""
    out = Path(out)
    _check_file(out, "--out", storage)
    if not force and out.is_file() and not is_report(out):
        raise ReportError(f"--out {out} exists and is not a report; give another path, or --force to replace it")
    if png is not None:
        _check_png_dir(Path(png), storage)
        png_renderer()


def _check_png_dir(png: Path, storage: str | None) -> None:
    if png.exists() and not png.is_dir():
        raise ReportError(f"--png {png} is a file; give a directory for the PNGs")
    for name in _PNG_NAMES:
        _check_file(png / f"{name}.png", "--png", storage)


def write_html(
    study: optuna.Study, out: str | Path, epsilon: float | None = None, *, storage: str | None = None
) -> Path:
    """One self-contained HTML file (plotly.js inline, no CDN, no cloud buttons); ``epsilon``:
    the accuracy resolution of the front (``pareto.accuracy_epsilon``; None: the study's, or a
    trial's spread over seeds where larger), which the mark of ``nas export``'s pick uses too;
    ``storage``: the study's, which ``out`` must not overwrite."""
    out = Path(out)
    check_outputs(out, storage=storage, force=True)  # the CLI checked --force; the storage is never replaced
    figs = figures(study, epsilon)
    setup = study_setup(study)
    search = setup.to_dict() if setup is not None else {}
    truncated = len(_split(study, epsilon)["truncated"])
    truncated_note = (
        f"; {truncated} trial(s) stopped early by the time budget, shown but kept off the front" if truncated else ""
    )
    pruned = [r for r in records(study, (TrialState.PRUNED,)) if r.pruned_at is not None]
    if pruned:
        truncated_note += (
            f"; {len(pruned)} trial(s) stopped early by the pruner (dominated at their cost: "
            f"{sum(r.train_seconds or 0.0 for r in pruned):.0f} s of training)"
        )
    eps = accuracy_epsilon(study, epsilon)
    resolution = "the test set's resolution, 1 / its scored targets"
    if epsilon is None and any(r.accuracy_interval for r in completed(study)):
        spread = "either trial's spread over seeds"
        within = f"{eps:.2g} ({resolution}) or {spread}, the larger," if eps else spread
        truncated_note += f"; accuracies within {within} count as equal on the front"
    elif eps:
        truncated_note += (
            f"; accuracies within {eps:.2g} count as equal on the front ({resolution}, unless "
            "--accuracy-epsilon set it)"
        )
    if (chosen := default_pick(study, epsilon)) is not None:
        truncated_note += f"; ★ {_picks(epsilon, f'trial {chosen.number}')} ({_PICK_RULE})"
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=name, config=PLOT_CONFIG)
        for i, (name, fig) in enumerate(figs.items())
    ]
    head = (
        f"<h1>{html.escape(study.study_name)}</h1><p>space <b>{html.escape(str(search.get('space', '?')))}</b>, "
        f"task <b>{html.escape(str(search.get('task', '?')))}</b>, {_costed(setup, search)}"
        f"{_generation(setup)}{_measured_note(study)}; "
        f"{_counts(study)}, {len(front(study, epsilon))} on the front"
        f"{truncated_note}.</p>"
    )
    if (found := fidelity(study)) is not None:  # nas verify's numbers, in words, above the figures
        head += "<p id='fidelity-note'>" + html.escape("; ".join(found.lines())) + ".</p>"
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(study.study_name)} — hybrid-nas report</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
        "table{border-collapse:collapse}th,td{text-align:left;padding:3px 10px;border-bottom:1px solid #ddd}"
        "</style></head><body>"
        f"{head}{''.join(parts)}{front_table_html(study, epsilon)}</body></html>"
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as e:  # permissions, a full disk: the flag and the reason, not a traceback
        raise ReportError(f"--out {out}: cannot write it ({e.strerror or e})") from None
    return out


def _costed(setup, search: dict) -> str:
    """``latency at 1x256 for h200`` (``predicted latency …`` where the study predicted it, as
    every row says); only ``costs for h200`` when no objective is the forward's (a generation-only
    study: its costs are at the context, which ``_generation`` names)."""
    profile = html.escape(str(search.get("profile", "?")))
    if setup is not None and not {"latency", "memory"} & set(setup.objectives):
        return f"costs for {profile}"
    how = "predicted latency" if setup is not None and not setup.measure else "latency"
    return f"{how} at {html.escape(str(search.get('latency_shape', '?')))} for {profile}"


def _measured_note(study: optuna.Study) -> str:
    """``, measured on NVIDIA H200 by nas measure for 12 trial(s) (the prediction beside each)``;
    empty for a study never measured."""
    timed = [r for r in completed(study) if r.measured is not None]
    if not timed:
        return ""
    gpus = ", ".join(sorted({r.measured.device for r in timed}))
    return html.escape(f", measured on {gpus} by nas measure for {len(timed)} trial(s) (the prediction beside each)")


def _generation(setup) -> str:
    """``, generation costs at 32,768 tokens × 1 sequence`` for a study with a context."""
    if setup is None or not setup.context:
        return ""
    return html.escape(f", generation costs at {setup.context:,} tokens × {setup.decode_batch} sequence(s)")


def find_chrome() -> str | None:
    """A system Chrome/Chromium for kaleido, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def write_pngs(
    study: optuna.Study, out_dir: str | Path, epsilon: float | None = None, *, storage: str | None = None
) -> list[Path]:
    """Each figure as ``<id>.png`` through kaleido and a system Chrome/Chromium (``storage``: the
    study's, which no PNG may overwrite)."""
    _check_png_dir(Path(out_dir), storage)
    chrome = png_renderer()
    import os

    os.environ.setdefault("BROWSER_PATH", chrome)  # choreographer (kaleido's browser driver) reads this
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures(study, epsilon).items():
        path = out_dir / f"{name}.png"
        fig.write_image(str(path), width=1100, height=fig.layout.height or 520)
        paths.append(path)
    return paths
