"""Objectives chosen by the user: a study of generation costs at a context, end to end on a CPU
(decode latency predicted and said to be), and the catalogue's parsing."""

from __future__ import annotations

import json

import pytest
from optuna.trial import TrialState

from nas.cli import main
from nas.latency import cache_memory
from nas.results.pareto import accuracy_epsilon, epsilon_dominates, front, pick, primary_cost
from nas.results.report import figures, front_table_html, write_html
from nas.search.objectives import CATALOGUE, parse_objectives
from nas.search.record import records, study_objectives, study_setup
from nas.search.study import SearchConfig, run_search
from tests.conftest import write_space

OBJECTIVES = ("accuracy", "decode_latency", "cache_memory")
CONTEXT = 4096


@pytest.fixture(scope="module")
def decode_study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("decode")
    config = SearchConfig(
        space=str(write_space(tmp)),
        trials=4,
        storage=str(tmp / "s.journal"),
        study="gen",
        device="cpu",
        baselines=False,
        objectives=OBJECTIVES,
        context=CONTEXT,
        decode_batch=2,
    )
    return run_search(config), config.storage, tmp


def test_the_study_stores_the_chosen_objectives_in_their_order(decode_study):
    study, _, _ = decode_study
    assert study.metric_names == ["accuracy", "decode_latency_ms", "cache_memory_mb"]
    assert [d.name.lower() for d in study.directions] == ["maximize", "minimize", "minimize"]
    setup = study_setup(study)
    assert (setup.objectives, setup.context, setup.decode_batch) == (OBJECTIVES, CONTEXT, 2)
    from nas.tasks import load_task

    task = load_task(setup.task)  # the front's accuracy resolution is recorded as scored targets, not rows
    assert setup.test_targets == task.scored_targets and setup.test_size == len(task.x_test)
    assert setup.test_targets != setup.test_size
    done = [r for r in records(study, (TrialState.COMPLETE,)) if r.trained]
    assert len(done) == 4
    for r in done:
        lat = r.decode_latency
        assert lat is not None and lat.kind == "decode" and lat.predicted and lat.interval > 0
        assert (lat.shape.batch, lat.shape.seq_len) == (2, CONTEXT)
        assert r.values["decode_latency_ms"] == pytest.approx(lat.median_ms)
        expected = cache_memory(r.arch, CONTEXT, 2)
        assert r.values["cache_memory_mb"] == pytest.approx(expected.total_mb)
        # the forward's costs are still recorded (budgets, the table), and the accuracy is kept
        assert r.latency is not None and r.latency.kind == "forward" and r.memory_mb > 0
        assert r.trained_accuracy == pytest.approx(r.values["accuracy"])


def test_the_front_is_over_the_chosen_objectives(decode_study):
    study, _, _ = decode_study
    objectives = study_objectives(study)
    assert primary_cost(objectives).name == "decode_latency"
    best = front(study)
    on_front = {b.number for b in best}
    done = [r for r in records(study, (TrialState.COMPLETE,)) if r.trained and r.feasible]
    eps = accuracy_epsilon(study)
    for r in done:  # nothing dominates a front trial; anything else is (ε-)dominated by one
        if r.number in on_front:
            assert not any(epsilon_dominates(o, r, 0.0, objectives) for o in done if o is not r)
        else:
            assert any(epsilon_dominates(o, r, eps, objectives) for o in best)
    fastest = min(best, key=lambda r: r.values["decode_latency_ms"])
    assert pick(study, "latency").number == fastest.number


def test_report_axes_and_table_follow_the_objectives(decode_study):
    study, _, _ = decode_study
    figs = figures(study)
    assert figs["front2d"].layout.xaxis.title.text.startswith(f"decode latency (ms/token) at {CONTEXT:,} tokens × 2")
    assert "predicted" in figs["front2d"].layout.xaxis.title.text
    scene = figs["front3d"].layout.scene
    assert (scene.xaxis.title.text, scene.yaxis.title.text) == ("decode latency (ms/token)", "cache memory (MiB)")
    table = front_table_html(study)
    assert "decode latency (ms/token)" in table and "cache memory (MiB)" in table and "latency (ms)" not in table


def test_report_header_names_the_context_not_the_forward_shape(decode_study, tmp_path):
    """A generation-only study is costed at its context: the header does not quote the unused
    forward shape (1x256) as if latency were scored there."""
    study, _, _ = decode_study
    page = write_html(study, tmp_path / "r.html").read_text()
    head = page[page.index("<h1>") : page.index("</p>")]
    assert f"generation costs at {CONTEXT:,} tokens × 2 sequence(s)" in head
    assert "latency at" not in head and "costs for " in head


def test_table_and_export_card_show_decode_latency_and_cache_bytes(decode_study, capsys):
    study, storage, tmp = decode_study
    from nas.commands._front import front_table as _front_table

    table = _front_table(study)
    headers = [str(c.header) for c in table.columns]
    assert headers[3:6] == ["acc", "decode latency ms", "cache memory MiB"]
    assert "generation costs at context 4,096 tokens, batch 2" in str(table.caption)
    assert main(["export", "--study", "gen", "--storage", storage, "--out", str(tmp / "bundle")]) == 0
    assert "decode latency " in capsys.readouterr().out
    card = (tmp / "bundle" / "card.md").read_text()
    bundle = json.loads((tmp / "bundle" / "arch.json").read_text())
    g = bundle["generation"]
    assert (g["context"], g["decode_batch"]) == (CONTEXT, 2) and g["decode_latency"]["kind"] == "decode"
    assert f"| decode latency (per token) | {g['decode_latency']['median_ms']:.4g} ms" in card
    assert "predicted (" in card.split("decode latency (per token)")[1].splitlines()[0]
    assert f"| cache memory | {g['cache']['total_mb']:.4g} MiB at context {CONTEXT:,} tokens × 2" in card
    assert "Searched for: accuracy, decode_latency, cache_memory." in card


def test_a_cpu_search_says_its_generation_costs_are_predicted(tmp_path, capsys):
    """Before any trial ends, the CPU run names its objectives, that the decode latency is a
    prediction for the target profile, and the context it is costed at; the table says the basis."""
    args = ["search", "--space", str(write_space(tmp_path)), "--storage", str(tmp_path / "s.journal")]
    args += ["--objectives", "accuracy,decode_latency,cache_memory", "--context", "8192", "--trials", "1"]
    assert main([*args, "--device", "cpu", "--no-baselines", "--target", "h200"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "objectives accuracy, decode latency, cache memory;" in out
    assert "decode latency per token at the context predicted for h200 (not timed here)" in out
    assert "generation costs at context 8,192 tokens, batch 1" in out
    assert "decode latency predicted (h200, calibrated" in out  # the front table's caption


def test_cache_memory_counts_kv_cache_state_and_conv_windows():
    from nas.spec import ArchSpec, LayerSpec

    attn = LayerSpec("attention", heads=4, short_conv=4)
    lin = LayerSpec("linear_attention", heads=4, feature_map="elu+1", short_conv=0)
    ident = LayerSpec("linear_attention", heads=2, feature_map="identity")
    arch = ArchSpec(64, (attn, lin, ident, LayerSpec("none")), 32, 32)
    c = cache_memory(arch, 1000, 3)
    assert c.kv_cache_bytes == 3 * 2 * 1000 * 64 * 2  # K and V, 64 channels, bf16, 3 sequences
    # fp32 states: 4 heads of 16x16 plus their normalizers; identity keeps no normalizer (2 heads of 32x32)
    assert c.state_bytes == 3 * 4 * (4 * (16 * 16 + 16) + 2 * 32 * 32)
    assert c.conv_bytes == 3 * 3 * (3 * 64) * 2  # K-1 = 3 rows of the 3d projection
    assert cache_memory(arch, 2000, 3).state_bytes == c.state_bytes  # a state does not grow with context
    assert cache_memory(arch, 2000, 3).kv_cache_bytes == 2 * c.kv_cache_bytes
    assert c.total_mb == pytest.approx((c.cache_bytes + c.weight_bytes) / 2**20)
    with pytest.raises(ValueError, match="context must be a positive integer"):
        cache_memory(arch, 0)


@pytest.mark.parametrize(
    "text, error",
    [
        ("accuracy", "choose 2-4"),
        ("accuracy,latency,memory,decode_latency,cache_memory", "choose 2-4"),
        ("accuracy,throughput", "unknown objective(s) ['throughput']"),
        ("latency,latency", "each objective once"),
        ("latency,memory", "leaves out accuracy, so the front would be the smallest model alone"),
        ("latency,memory,prefill_latency,decode_latency", "add it: --objectives accuracy,latency,memory,prefill"),
    ],
)
def test_parse_objectives_refuses(text, error):
    with pytest.raises(ValueError, match=__import__("re").escape(error)):
        parse_objectives(text)


def test_every_objective_has_a_metric_a_direction_and_a_label():
    assert parse_objectives(" accuracy , cache_memory ") == ("accuracy", "cache_memory")
    metrics = [o.metric for o in CATALOGUE.values()]
    assert len(set(metrics)) == len(metrics)
    for o in CATALOGUE.values():
        assert o.direction in ("maximize", "minimize") and o.label
        assert o.context == (o.name in ("prefill_latency", "decode_latency", "cache_memory"))


def test_a_study_without_accuracy_is_refused_before_anything_is_written(tmp_path, tiny_space):
    """Costs alone are lowest for the smallest model: a cost-only study trained every candidate
    and its front was that model alone (found by a new-user audit: three copies of it)."""
    config = SearchConfig(
        space=str(tiny_space),
        trials=2,
        storage=str(tmp_path / "s.journal"),
        study="cost",
        device="cpu",
        objectives=("prefill_latency", "cache_memory"),
        context=256,
    )
    with pytest.raises(ValueError, match="prefill_latency,cache_memory leaves out accuracy"):
        run_search(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def test_the_report_breaks_the_front_down_by_kernel_family_for_the_forward_and_the_decode_step(decode_study):
    study, _, _ = decode_study
    fig = figures(study)["breakdown"]
    shown = {f"#{r.number} {r.arch_summary}": r for r in front(study)}
    for axis, latency_of in (("x", lambda r: r.latency), ("x2", lambda r: r.decode_latency)):
        bars = [t for t in fig.data if t.xaxis == axis]
        assert bars and {t.type for t in bars} == {"bar"}
        assert set(bars[0].y) == set(shown)
        for label, r in shown.items():  # the stacked families add up to the recorded latency
            total = sum(t.x[list(t.y).index(label)] for t in bars)
            assert total == pytest.approx(latency_of(r).median_ms, rel=1e-9)
    decode_families = {t.name for t in fig.data if t.xaxis == "x2"}
    assert "reading the KV cache" in decode_families or "reading / writing the state" in decode_families
