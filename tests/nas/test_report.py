"""``nas report``: one offline HTML file whose plots render in headless Chromium with no network."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from nas.cli import main
from nas.results.pareto import default_pick, front
from nas.results.report import hover_text
from nas.search.record import record
from nas.search.storage import open_storage
from tests.conftest import write_space

pytestmark = pytest.mark.slow  # end-to-end: a nas search, then nas report in Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# CI installs Chromium and sets this, so a missing browser fails there instead of skipping
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("NAS_REQUIRE_CHROMIUM"), reason="no Chromium on PATH (CI installs it)"
)


class _Tree(HTMLParser):
    """Minimal DOM: nested (tag, attrs, children) lists, enough to walk plotly's SVG."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "source", "wbr", "embed"}

    def __init__(self) -> None:
        super().__init__()
        self.root: dict = {"tag": "root", "attrs": {}, "children": []}
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "children": []}
        self.stack[-1]["children"].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1]["children"].append({"tag": tag, "attrs": dict(attrs), "children": []})

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break


def _walk(node):
    yield node
    for child in node["children"]:
        yield from _walk(child)


def _classes(node) -> set[str]:
    return set((node["attrs"].get("class") or "").split())


def _render(html_path: Path, tmp_path: Path) -> dict:
    """The DOM after scripts ran, from Chromium with every host unresolvable and a dead proxy."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-sync",
        "--disable-background-networking",
        "--disable-component-update",
        "--proxy-server=http://127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={tmp_path / 'chrome'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        html_path.resolve().as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    tree = _Tree()
    tree.feed(dom)
    return tree.root


@pytest.fixture(scope="module")
def study_with_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    storage = str(tmp / "s.journal")
    space = write_space(tmp)  # its guard (600 s) cuts no training short, so the trace order is fixed
    assert (
        main(
            [
                "search",
                "--space",
                str(space),
                "--trials",
                "6",
                "--storage",
                storage,
                "--study",
                "r",
                "--max-latency-ms",
                "0.03",
            ]
        )
        == 0
    )
    out = tmp / "report.html"
    assert main(["report", "--study", "r", "--storage", storage, "--out", str(out)]) == 0
    return optuna.load_study(study_name="r", storage=open_storage(storage)), out, tmp


def test_report_is_self_contained(study_with_report):
    _, out, _ = study_with_report
    text = out.read_text()
    assert "<script src=" not in text and "<link" not in text  # plotly.js inline, nothing fetched
    assert text.count("Plotly.newPlot(") == 5 and text.count('class="plotly-graph-div') == 5
    assert text.count('"showSendToCloud": false') == 5
    head = text[text.index("<h1>") : text.index("</p>")]
    assert "latency at 1x256 for " in head  # the default objectives: the forward's shape is named


@needs_chromium
def test_report_renders_offline_with_front_points(study_with_report):
    study, out, tmp = study_with_report
    root = _render(out, tmp)
    divs = {n["attrs"].get("id"): n for n in _walk(root) if n["tag"] == "div" and n["attrs"].get("id")}
    front2d = divs["front2d"]
    assert any(n["tag"] == "svg" and "main-svg" in _classes(n) for n in _walk(front2d)), "no plotly SVG rendered"
    traces = [n for n in _walk(front2d) if n["tag"] == "g" and {"trace", "scatter"} <= _classes(n)]
    assert len(traces) == 4  # over budget, dominated, Pareto front markers, 2D staircase line (in that order)
    front_points = [n for n in _walk(traces[2]) if n["tag"] == "path" and "point" in _classes(n)]
    feasible_best = {t.number for t in study.best_trials if all(v <= 0 for v in t.constraints.values())}
    shown = front(study)  # Optuna's best trials less those ε-dominated (accuracy within 1 / test rows)
    assert len(front_points) == len(shown) > 0 and {r.number for r in shown} <= feasible_best
    assert not [n for n in _walk(traces[3]) if n["tag"] == "path" and "point" in _classes(n)]  # a line only
    all_points = sum(len([n for n in _walk(t) if n["tag"] == "path" and "point" in _classes(n)]) for t in traces)
    assert all_points == len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    titles = [n["attrs"].get("data-title", "") for n in _walk(root) if "modebar-btn" in _classes(n)]
    assert titles and not any("Cloud" in t or "Chart Studio" in t or "plotly" in t.lower() for t in titles)
    # the budget line and the other figures rendered too
    assert any("max latency" in (n["attrs"].get("data-unformatted") or "") for n in _walk(front2d))
    assert any(n["tag"] == "g" and "parcoords" in _classes(n) for n in _walk(divs["parallel"]))
    # where the front's latency goes: one bar per front trial in each kernel family's trace
    families = [n for n in _walk(divs["breakdown"]) if n["tag"] == "g" and {"trace", "bars"} <= _classes(n)]
    assert families and all(
        len([p for p in _walk(t) if p["tag"] == "g" and "point" in _classes(p)]) == len(front(study)) for t in families
    )
    table = next(n for n in _walk(root) if n["tag"] == "table" and n["attrs"].get("id") == "front-table")
    rows = [n for n in _walk(table) if n["tag"] == "tr"]
    on_front = {r.number for r in front(study)}
    # every front trial has its row under the header, then the baselines off it (over budget too)
    # and nas export's default pick where a cheaper trial level with it stands for it on the front
    off = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)) if t.number not in on_front]
    chosen = default_pick(study)
    refs = [t for t in off if record(study, t).baseline is not None or t.number == chosen.number]
    assert len(rows) == len(on_front) + len(refs) + 1


def test_over_budget_trials_are_drawn_as_untrained(study_with_report):
    """A candidate over a hard budget was never trained: its trace says it has no accuracy (it is
    drawn at its cost on the 0 line), it is not an "infeasible" point with a score of 0, and the
    parallel-coordinates plot, coloured by accuracy, leaves it out and says how many it left."""
    from nas.results.report import figures

    study, _, _ = study_with_report
    records = [record(study, t) for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    untrained = sorted(r.number for r in records if r.skipped_training is not None)
    assert untrained and len(untrained) < len(records)  # the fixture's budget keeps some, skips some
    figs = figures(study)
    names = [trace.name for trace in figs["front2d"].data]
    over = figs["front2d"].data[0]
    assert over.name.startswith("over budget (not trained") and "infeasible" not in names
    assert len(over.x) == len(untrained) and set(over.y) == {0.0}
    assert figs["front3d"].data[0].name == over.name and len(figs["front3d"].data[0].x) == len(untrained)
    parallel = figs["parallel"]
    assert len(parallel.data[0].line.color) == len(records) - len(untrained)
    assert f"({len(untrained)} over budget, never trained, left out)" in parallel.layout.title.text


def test_hover_names_architecture_latency_source(study_with_report):
    study, _, _ = study_with_report
    t = record(study, study.best_trials[0])
    text = hover_text(t)
    assert t.arch_summary in text and f"trial {t.number}" in text
    assert re.search(r"predicted \((h100_sxm|h200), calibrated \d{4}-\d\d-\d\d, ±\d+ %\)", text)
    assert f"| {t.params_text()} params |" in text


def test_report_unknown_study_and_empty_study(study_with_report, capsys):
    _, _, tmp = study_with_report
    storage = str(tmp / "s.journal")
    assert main(["report", "--study", "ghost", "--storage", storage]) == 2
    assert "no study named 'ghost'" in capsys.readouterr().err
    from nas.search.study import open_study

    open_study("empty", storage)
    assert main(["report", "--study", "empty", "--storage", storage]) == 2
    assert "no completed trial" in capsys.readouterr().err


def test_png_without_a_browser_says_so(study_with_report, capsys, monkeypatch):
    _, _, tmp = study_with_report
    monkeypatch.setattr("nas.results.report.find_chrome", lambda: None)
    assert (
        main(
            [
                "report",
                "--study",
                "r",
                "--storage",
                str(tmp / "s.journal"),
                "--out",
                str(tmp / "r2.html"),
                "--png",
                str(tmp / "png"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs Chrome or Chromium" in err
    assert not (tmp / "r2.html").exists(), "a --png that cannot be written is refused before the HTML"


def test_out_replaces_an_earlier_report_but_no_other_file_without_force(study_with_report, capsys):
    """Re-running a report replaces it; a data file, space or note at --out is refused (one line,
    exit 2, the file unchanged) unless --force; the study's journal never, even with --force."""
    _, out, tmp = study_with_report
    storage = str(tmp / "s.journal")
    base = ["report", "--study", "r", "--storage", storage, "--out"]
    assert main([*base, str(out)]) == 0 and "hybrid-nas report</title>" in out.read_text()
    data = tmp / "user_data.npz"
    data.write_bytes(b"PK\x03\x04 not a report")
    capsys.readouterr()
    assert main([*base, str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and is not a report" in err and "--force" in err
    assert data.read_bytes() == b"PK\x03\x04 not a report"
    assert main([*base, str(data), "--force"]) == 0 and "hybrid-nas report</title>" in data.read_text()
    journal = (tmp / "s.journal").read_bytes()
    assert main([*base, storage, "--force"]) == 2 and "is the study's" in capsys.readouterr().err
    assert (tmp / "s.journal").read_bytes() == journal
    empty = tmp / "empty.html"
    empty.touch()
    assert main([*base, str(empty)]) == 0  # an empty file holds nothing to lose


def test_the_default_report_path_stays_under_runs(study_with_report, tmp_path, monkeypatch):
    """A study whose name holds path characters (made through Optuna or an older version) still
    reports to one file under runs/, never to where the name points."""
    _, _, tmp = study_with_report
    storage = str(tmp / "s.journal")
    optuna.copy_study(
        from_study_name="r",
        from_storage=open_storage(storage),
        to_storage=open_storage(storage),
        to_study_name="../x/y",
    )
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--study", "../x/y", "--storage", storage]) == 0
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [Path("runs/.._x_y-report.html")], written


def test_the_header_says_the_latency_is_predicted(study_with_report):
    _, out, _ = study_with_report
    text = out.read_text()
    assert "predicted latency at 1x256 for h100_sxm" in text[text.index("<h1>") : text.index("</p>")]


def test_the_3d_front_fits_its_figure_in_a_1400_px_window(study_with_report):
    """At a 1400 px window (the page is 1200 px wide) plotly's default camera in a 600 px figure put
    the cube's near corner, and the memory axis with it, below the figure: it was clipped. The
    figure is taller, its margins slim and its camera further out and lower (checked by a headless
    Chromium screenshot of a report at 1400 x 1400)."""
    from nas.results.report import figures

    study, _, _ = study_with_report
    layout = figures(study)["front3d"].layout
    assert layout.height >= 700 and layout.margin.b <= 20
    eye = layout.scene.camera.eye
    assert min(eye.x, eye.y) >= 1.5 and eye.z < 1.0  # further out than plotly's 1.25 and lower


def test_the_front_is_split_by_precision_setting_only_where_searched():
    """One group per storage setting (full precision first), the overflow past the marker list
    folded into one; a study that does not search precision keeps one unlabelled group."""
    from nas.results.report import _SETTING_SYMBOLS, _by_precision
    from nas.search.record import TrialRecord
    from nas.spec import ArchSpec, LayerSpec

    def rec(n: int, **dtypes) -> TrialRecord:
        layer = LayerSpec(mixer="attention", heads=1, **dtypes)
        arch = ArchSpec(d_model=16, layers=(layer,), vocab_size=8, n_out=8)
        return TrialRecord(n, optuna.trial.TrialState.COMPLETE, arch=arch)

    trials = [rec(0, kv_dtype="fp8"), rec(1), rec(2, weight_dtype="fp8"), rec(3, kv_dtype="fp8")]
    assert _by_precision(trials, False) == [(None, trials)]
    groups = _by_precision(trials, True)
    assert [name for name, _ in groups] == ["full precision", "kv fp8", "weights fp8"]
    assert [[r.number for r in rs] for _, rs in groups] == [[1], [0, 3], [2]]
    many = [rec(i, kv_dtype="fp8", weight_dtype="fp8") for i in range(2)] + trials
    assert len(_by_precision(many, True)) <= len(_SETTING_SYMBOLS)


def test_baseline_names_take_turns_below_and_above_their_markers(tmp_path):
    """Neighbouring baselines (in cost) are named on alternate sides: two that land together
    (they often score alike) do not print their names over each other."""
    from optuna.trial import create_trial

    from nas.latency import Latency, parse_shape
    from nas.results.report import figures
    from nas.search.record import TrialRecord
    from nas.search.study import open_study
    from nas.spec import ArchSpec, LayerSpec, TrainSpec

    study = open_study("b", str(tmp_path / "b.journal"))
    arch = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)
    for label, acc, lat in (("all-linear", 0.5, 0.0301), ("all-attention", 0.9, 0.03), ("2:1 hybrid", 0.89, 0.0302)):
        latency = Latency(lat, 0.0, "predicted", "h200", "bf16", parse_shape("1x256"))
        r = TrialRecord(
            0,
            optuna.trial.TrialState.COMPLETE,
            arch=arch,
            train=TrainSpec("adamw", 1e-3, 0.0, 0.0, 10, 8),
            arch_summary=arch.summary(),
            latency=latency,
            steps_done=10,
            baseline=label,
        )
        study.add_trial(create_trial(values=[acc, lat, 1.0], user_attrs={**r.to_dict(), "memory": {"total_mb": 1.0}}))
    (trace,) = [t for t in figures(study)["front2d"].data if t.name == "baselines"]
    assert list(trace.text) == ["all-attention", "all-linear", "2:1 hybrid"]  # in cost order
    assert list(trace.textposition) == ["bottom center", "top center", "bottom center"]


def test_report_refuses_an_out_or_png_in_a_missing_folder(tmp_path, capsys):
    """A mistyped --out or --png folder is one line and exit 2, and no folder is made (the default
    runs/ folder is made, as a journal's is not)."""
    from nas.search import record as study_record
    from nas.search.setup import SearchSetup
    from nas.search.study import open_study

    study_record.write_study_setup(
        open_study("s", str(tmp_path / "s.journal")), SearchSetup("s", "", "mqar", "auto", "h200", "1x256")
    )
    for flag, path in (("--out", tmp_path / "typo" / "r.html"), ("--png", tmp_path / "typo" / "figs")):
        args = ["report", "--study", "s", "--storage", str(tmp_path / "s.journal"), flag, str(path)]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{flag} {path}: folder {path.parent} does not exist" in " ".join(err.split())
        assert not (tmp_path / "typo").exists()
