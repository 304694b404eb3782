"""The tables the commands print about a study: its Pareto front (one column per objective, the
baselines below it, ★ on ``nas export``'s default pick) and its proxy fidelity (after ``nas verify``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from nas.commands._common import console

if TYPE_CHECKING:
    import optuna

    from hardware_profiles import HardwareProfile
    from nas.latency import Latency
    from nas.search.objectives import Objective
    from nas.search.record import TrialRecord, Verified


def print_front(study: optuna.Study) -> None:
    console.print(front_table(study))


def front_table(study: optuna.Study) -> Table:
    """The front as a table: one column per objective of the study, the baselines below it; ★ marks
    the trial ``nas export`` takes by default (listed below the front when ε-dominated there)."""
    from nas.latency import shared_labels
    from nas.results.pareto import accuracy_epsilon, completed, default_pick, front
    from nas.search.record import study_objectives, study_profile, study_setup

    objectives = study_objectives(study)
    profile = study_profile(study)
    trials = front(study)
    on_front = {r.number for r in trials}
    chosen = default_pick(study)
    star = chosen.number if chosen is not None else None
    # the baselines off the front, trained or over a hard budget (never trained: no accuracy), and
    # the default pick when a cheaper trial level with it stands for it on the displayed front
    refs = [r for r in completed(study) if r.number not in on_front and (r.baseline is not None or r.number == star)]
    caption = []
    for o in objectives:
        shown = (trials + refs) or [r for r in completed(study) if r.trained]  # every row shown; an empty front too
        sources = shared_labels(lat for r in shown if (lat := r.latency_of(o.metric)) is not None)
        if sources:
            caption.append(f"{o.name.replace('_', ' ')} {'; '.join(sources)}")
    if any(r.measured is not None for r in trials + refs):
        caption.append("(predicted …): the search's prediction of a latency nas measure has timed since")
    setup = study_setup(study)
    if setup is not None and setup.context:
        caption.append(f"generation costs at context {setup.context:,} tokens, batch {setup.decode_batch}")
    if any(r.baseline is not None for r in refs):
        over = " (over budget: never trained, no accuracy)" if any(not r.trained for r in refs) else ""
        truncated = any(r.truncated for r in refs)
        cut = "; truncated: stopped by the time guard before their planned steps" if truncated else ""
        caption.append(f"below the line: baselines not on the front{over}{cut}")
    if late := [r for r in completed(study) if r.over_budget_text() is not None]:
        caption.append(
            f"{len(late)} trained trial(s) over the study's current budgets (set after they were trained; "
            f"{', '.join(str(r.number) for r in late)}): off the front, not picked"
        )
    if too_big := sorted(r.number for r in trials + refs if r.over_device(objectives, profile)):
        caption.append(
            f"> {profile.memory_gb:g} GB: trial(s) {', '.join(map(str, too_big))} need more memory than "
            f"{profile.name}'s {profile.memory_gb:g} GB ({profile.memory_mib:,.0f} MiB): they cannot run on one "
            f"{profile.name} as costed"
        )
    if chosen is not None:
        caption.append(f"★ nas export's pick: {_pick_text(accuracy_epsilon(study), star in on_front)}")
    table = Table(title=f"Pareto front of {study.study_name}: {len(trials)} trials", caption="\n".join(caption) or None)
    columns = ["trial", "architecture", "params", *(_column(o) for o in objectives), "recipe"]
    if "accuracy" not in [o.metric for o in objectives]:
        columns.insert(3, "acc")
    for col in columns:
        table.add_column(col, justify="left" if col in ("architecture", "recipe") else "right", overflow="fold")
    for r in trials + refs:  # the baselines that missed the front follow it, dimmed
        over = ", over budget" if not r.trained or r.over_budget else ""
        cut = f", truncated {r.steps_done}/{r.planned_steps} steps" if r.truncated else ""
        label = r.arch_summary + (f" ({r.baseline}{over}{cut})" if r.baseline else "")
        values = [_cell(r, o, profile) for o in objectives]
        if "accuracy" not in [o.metric for o in objectives]:
            values.insert(0, r.accuracy_text() if r.trained else "-")
        table.add_row(
            f"★ {r.number}" if r.number == star else str(r.number),
            label,
            r.params_text(),
            *values,
            r.recipe(),
            style="dim" if r.number not in on_front else None,
            end_section=bool(trials and refs) and r is trials[-1],
        )
    return table


def _pick_text(resolution: float, on_front: bool) -> str:
    """``the cheapest trial within ε of the best accuracy (ε: 0.00049 or the best's seed spread, the
    larger)``, and where a pick off the displayed front is listed."""
    eps = f"ε: {resolution:.2g} or the best's seed spread, the larger" if resolution else "ε: the best's seed spread"
    off = "; listed below the line, as a cheaper level trial stands for it on the front" if not on_front else ""
    return f"the cheapest trial within ε of the best accuracy ({eps}){off}"


def _column(o: Objective) -> str:
    """``acc``, ``latency ms``, ``cache memory MiB``: a front table column."""
    return {"accuracy": "acc", "memory_mb": "mem MiB"}.get(o.metric, f"{o.name.replace('_', ' ')} {o.unit}")


def _cell(r: TrialRecord, o: Objective, profile: HardwareProfile | None = None) -> str:
    """A front table cell: the value in the column's unit, with a prediction's interval (accuracy:
    its spread over seeds), a latency ``nas measure`` timed with the search's prediction beside it
    (``0.0250 (predicted 0.0213 ±9%)``); a memory over ``profile``'s GPU memory is marked ``> 141 GB``."""
    value = r.value(o.metric)
    if value is None:
        return "?"
    if o.metric == "accuracy":
        return r.accuracy_text() if r.trained else "-"
    lat = r.latency_of(o.metric)
    interval = f" ±{lat.interval * 100:.0f}%" if lat is not None and lat.interval else ""
    over = f" > {profile.memory_gb:g} GB" if profile is not None and r.over_device((o,), profile) else ""
    # measured by nas measure: the search's prediction beside it
    predicted = f" ({predicted_text(p).replace(' ms', '')})" if (p := r.prediction_of(o.metric)) is not None else ""
    # ms to 4 decimals (a column of like latencies); MiB and counts to 4 significant figures, as the
    # progress lines: 0.009888 and 0.01221 MiB are different caches, and 2 decimals showed both as 0.01
    shown = f"{value:.4f}" if o.unit == "ms" else f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return shown + interval + predicted + over


def predicted_text(lat: Latency) -> str:
    """``predicted 0.0213 ms ±9%``: a prediction a measurement replaced, shown beside it."""
    spread = f" ±{lat.interval * 100:.0f}%" if lat.interval else ""
    return f"predicted {lat.median_ms:.4g} ms{spread}"


def print_fidelity(study: optuna.Study, *, table: bool) -> None:
    """The study's proxy fidelity lines (nothing before its first nas verify); ``table``: the
    verified trials first, short- beside long-run accuracy."""
    from nas.results.fidelity import fidelity, pairs
    from nas.results.pareto import front

    found = fidelity(study)
    if found is None:
        return
    if table:
        on_front = [r.number for r in front(study)]
        place = {n: i for i, n in enumerate(on_front)}  # the front's trials first, in its order
        rows = sorted(pairs(study), key=lambda p: (place.get(p[0].number, len(place)), p[0].number))
        out = Table(title=f"{study.study_name}: {len(rows)} trial(s) retrained at {found.steps_factor:g}× steps")
        for col in ("trial", "architecture", "params", "short acc", "long acc", "on front"):
            out.add_column(col, justify="left" if col == "architecture" else "right", overflow="fold")
        for r, row in rows:
            out.add_row(
                str(r.number),
                r.arch_summary,
                r.params_text(),
                f"{r.accuracy:.3f}",
                _long_text(row),
                "yes" if r.number in on_front else "",
            )
        console.print(out)
    for line in found.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _long_text(row: Verified) -> str:
    """``0.900``, ``0.900 (0.890-0.910)`` over several seeds, or ``failed`` for a diverged run."""
    if row.accuracy is None:
        return "failed"
    spread = f" ({min(row.accuracies):.3f}-{max(row.accuracies):.3f})" if len(row.accuracies) > 1 else ""
    return f"{row.accuracy:.3f}{spread}"
