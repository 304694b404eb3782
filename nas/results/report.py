"""Offline HTML report of a study: fronts, hypervolume history, parallel coordinates, front table.

Figures are plotly (and Optuna's hypervolume plot); the page embeds plotly.js once, so it opens
with no network. ``write_pngs`` renders the same figures to PNG through kaleido.
"""

from __future__ import annotations

import html
import math
import shutil
import warnings
from pathlib import Path

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from nas.results.pareto import completed, feasible, front, reference_point

__all__ = ["PLOT_CONFIG", "ReportError", "figures", "hover_text", "write_html", "write_pngs", "find_chrome"]

PLOT_CONFIG = {"displaylogo": False, "showSendToCloud": False}  # offline: no plotly logo link, no cloud button
_FRONT, _DOMINATED, _INFEASIBLE = "#d62728", "#b8b8b8", "#7f7f7f"


class ReportError(ValueError):
    """The report cannot be made as asked; the message says why."""


def one_line(t: FrozenTrial) -> str:
    """``A L L M | d=128 | 0.41M params | adamw lr=2e-03``"""
    train = t.user_attrs.get("train", {})
    return (f"{t.user_attrs.get('arch_summary', '?')} | {t.user_attrs.get('params', 0) / 1e6:.2f}M params | "
            f"{train.get('optimizer', '?')} lr={train.get('lr', 0):.0e}")


def hover_text(t: FrozenTrial) -> str:
    lat = t.user_attrs.get("latency", {})
    spread = f" ± {lat.get('iqr_ms', 0):.3g}" if lat.get("iqr_ms") else ""
    why = t.user_attrs.get("skipped_training")
    return "<br>".join([
        html.escape(one_line(t)),
        f"trial {t.number}: accuracy {t.values[0]:.3f}, memory {t.values[2]:.3g} MB",
        f"latency {t.values[1]:.4g}{spread} ms, {lat.get('source', '?')} on {html.escape(str(lat.get('device', '?')))}",
        *([f"not trained: {html.escape(why)}"] if why else []),
    ])


def _split(study: optuna.Study) -> tuple[list[FrozenTrial], list[FrozenTrial], list[FrozenTrial]]:
    """(front, dominated feasible, infeasible) completed trials."""
    best = front(study)
    ids = {t.number for t in best}
    done = completed(study)
    return best, [t for t in done if feasible(t) and t.number not in ids], [t for t in done if not feasible(t)]


def _front_2d(study: optuna.Study, budgets: dict) -> go.Figure:
    best, dominated, infeasible = _split(study)
    fig = go.Figure()
    for name, trials, style in (
        ("infeasible", infeasible, dict(color=_INFEASIBLE, symbol="x", size=7)),
        ("dominated", dominated, dict(color=_DOMINATED, size=7)),
    ):
        fig.add_trace(go.Scatter(x=[t.values[1] for t in trials], y=[t.values[0] for t in trials], mode="markers",
                                 name=name, marker=style, hovertext=[hover_text(t) for t in trials],
                                 hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[t.values[1] for t in best], y=[t.values[0] for t in best], mode="markers",
                             name="Pareto front (accuracy, latency, memory)",
                             marker=dict(color=_FRONT, size=10, line=dict(color="white", width=1)),
                             hovertext=[hover_text(t) for t in best], hoverinfo="text"))
    # The staircase joins the trials that stay optimal in this 2D view (each more accurate than
    # every faster one); the others are on the front only through memory.
    stairs, best_acc = [], -1.0
    for t in sorted(best, key=lambda t: (t.values[1], -t.values[0])):
        if t.values[0] > best_acc:
            stairs.append(t)
            best_acc = t.values[0]
    fig.add_trace(go.Scatter(x=[t.values[1] for t in stairs], y=[t.values[0] for t in stairs], mode="lines",
                             name="accuracy–latency front", line=dict(color=_FRONT, shape="hv", width=1.5),
                             hoverinfo="skip"))
    if budgets.get("max_latency_ms"):
        fig.add_vline(x=budgets["max_latency_ms"], line_dash="dash", line_color="black",
                      annotation_text=f"max latency {budgets['max_latency_ms']:g} ms")
    lat_source = sorted({f"{t.user_attrs.get('latency_source', '?')} on {t.user_attrs.get('latency_device', '?')}"
                         for t in completed(study)})
    fig.update_layout(title="Accuracy vs latency", xaxis_title=f"latency ms ({', '.join(lat_source)})",
                      yaxis_title="accuracy", template="plotly_white", height=520)
    return fig


def _front_3d(study: optuna.Study) -> go.Figure:
    best, dominated, infeasible = _split(study)
    fig = go.Figure()
    for name, trials, color, size in (("infeasible", infeasible, _INFEASIBLE, 3), ("dominated", dominated, _DOMINATED, 4),
                                      ("Pareto front", best, _FRONT, 6)):
        fig.add_trace(go.Scatter3d(x=[t.values[1] for t in trials], y=[t.values[2] for t in trials],
                                   z=[t.values[0] for t in trials], mode="markers", name=name,
                                   marker=dict(color=color, size=size), hovertext=[hover_text(t) for t in trials],
                                   hoverinfo="text"))
    fig.update_layout(title="Accuracy × latency × memory", template="plotly_white", height=600,
                      scene=dict(xaxis_title="latency ms", yaxis_title="memory MB", zaxis_title="accuracy"))
    return fig


def _hypervolume(study: optuna.Study) -> go.Figure:
    with warnings.catch_warnings():  # experimental since Optuna 3.3
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fig = optuna.visualization.plot_hypervolume_history(study, reference_point(completed(study)))
    fig.update_layout(title="Hypervolume history (accuracy ↑, latency ↓, memory ↓)", template="plotly_white")
    return fig


def _parallel(study: optuna.Study) -> go.Figure:
    trials = [t for t in completed(study) if "arch" in t.user_attrs]
    mixers = [[la["mixer"] for la in t.user_attrs["arch"]["layers"]] for t in trials]

    def dim(label: str, values: list[float]) -> dict:
        return dict(label=label, values=values)

    dims = [
        dim("depth", [len(m) for m in mixers]),
        dim("d_model", [t.user_attrs["arch"]["d_model"] for t in trials]),
        dim("# attention", [m.count("attention") for m in mixers]),
        dim("# linear attn", [m.count("linear_attention") for m in mixers]),
        dim("# MLP-only", [m.count("none") for m in mixers]),
        dim("log10 params", [math.log10(max(1, t.user_attrs.get("params", 1))) for t in trials]),
        dim("log10 lr", [math.log10(t.user_attrs["train"]["lr"]) for t in trials]),
        dim("steps", [t.user_attrs["train"]["steps"] for t in trials]),
        dim("latency ms", [t.values[1] for t in trials]),
        dim("accuracy", [t.values[0] for t in trials]),
    ]
    fig = go.Figure(go.Parcoords(line=dict(color=[t.values[0] for t in trials], colorscale="Viridis", showscale=True,
                                           colorbar=dict(title="accuracy")), dimensions=dims))
    fig.update_layout(title="Architecture parameters, coloured by accuracy", template="plotly_white", height=480)
    return fig


def _table(study: optuna.Study) -> go.Figure:
    best = front(study)
    cols = {
        "trial": [t.number for t in best],
        "architecture": [one_line(t) for t in best],
        "accuracy": [f"{t.values[0]:.3f}" for t in best],
        "latency ms": [f"{t.values[1]:.4g} ({t.user_attrs.get('latency_source', '?')})" for t in best],
        "memory MB": [f"{t.values[2]:.3g}" for t in best],
    }
    fig = go.Figure(go.Table(columnwidth=[1, 6, 2, 3, 2], header=dict(values=list(cols), align="left"),
                             cells=dict(values=list(cols.values()), align="left")))
    fig.update_layout(title=f"Pareto front: {len(best)} trials", height=120 + 28 * max(1, len(best)))
    return fig


def figures(study: optuna.Study) -> dict[str, go.Figure]:
    """The report's figures by element id, in page order."""
    if not completed(study):
        raise ReportError(f"study {study.study_name!r} has no completed trial yet; run nas search first")
    budgets = study.user_attrs.get("budgets", {})
    return {"front2d": _front_2d(study, budgets), "front3d": _front_3d(study), "hypervolume": _hypervolume(study),
            "parallel": _parallel(study), "front-table": _table(study)}


def write_html(study: optuna.Study, out: str | Path) -> Path:
    """One self-contained HTML file (plotly.js inline, no CDN, no cloud buttons)."""
    out = Path(out)
    figs = figures(study)
    search = study.user_attrs.get("search", {})
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=name, config=PLOT_CONFIG)
             for i, (name, fig) in enumerate(figs.items())]
    head = (f"<h1>{html.escape(study.study_name)}</h1><p>space <b>{html.escape(str(search.get('space', '?')))}</b>, "
            f"task <b>{html.escape(str(search.get('task', '?')))}</b>, latency at "
            f"{html.escape(str(search.get('latency_shape', '?')))} for {html.escape(str(search.get('profile', '?')))}; "
            f"{len(completed(study))} completed trials, {len(front(study))} on the front.</p>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(study.study_name)} — hybrid-nas report</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}</style></head><body>"
            f"{head}{''.join(parts)}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def find_chrome() -> str | None:
    """A system Chrome/Chromium for kaleido, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def write_pngs(study: optuna.Study, out_dir: str | Path) -> list[Path]:
    """Each figure as ``<id>.png`` through kaleido and a system Chrome/Chromium."""
    chrome = find_chrome()
    if chrome is None:
        raise ReportError("--png needs Chrome or Chromium on PATH (e.g. apt install chromium); none was found")
    try:
        import kaleido  # noqa: F401 — optional extra: pip install -e '.[png]'
    except ImportError:
        raise ReportError("--png needs kaleido: pip install -e '.[png]'") from None
    import os

    os.environ.setdefault("BROWSER_PATH", chrome)  # choreographer (kaleido's browser driver) reads this
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures(study).items():
        path = out_dir / f"{name}.png"
        fig.write_image(str(path), width=1100, height=fig.layout.height or 520)
        paths.append(path)
    return paths
