"""Reference architectures every study starts with: drawn from the space, queued once per study
(resumes, racing creators, worker processes), trained in full, labelled in table and report."""

from __future__ import annotations

import functools
import threading

import optuna
import pytest
from optuna.trial import TrialState

from nas.cli import main
from nas.search import record
from nas.search.baselines import baselines
from nas.search.study import SearchConfig, prepare, run_search
from nas.space import load_space, parse_space
from nas.tasks import load_task
from tests.conftest import TINY_SPACE, write_space


def _space(**changes: str):
    text = TINY_SPACE.replace("STEPS", "5")
    for old, new in changes.items():
        text = text.replace(old, new)
    import yaml

    return parse_space(yaml.safe_load(text), "user.yaml")


@functools.cache
def _task(spec: str):
    return load_task(spec, seed=0)  # Zoology-scale MQAR takes seconds to draw: once per spec


def _mixers(space, params) -> tuple[str, ...]:
    """The mixers of the candidate ``params`` draw from ``space`` (through Optuna, as a trial would)."""
    cand = space.sample(optuna.trial.FixedTrial(params), _task(space.task))
    return tuple(layer.mixer for layer in cand.arch.layers), cand.arch.d_model


@pytest.mark.parametrize("name", ["hybrid_small", "hybrid_tiny", "hybrid_mqar", "hybrid_long"])
def test_shipped_spaces_get_three_references_of_one_width_and_depth(name):
    space = load_space(name)
    refs = baselines(space)
    assert [b.label for b in refs][:2] == ["all-attention", "all-linear"] and refs[2].label.endswith("hybrid")
    drawn = [_mixers(space, b.params) for b in refs]
    assert len({d for _, d in drawn}) == 1 and len({len(m) for m, _ in drawn}) == 1  # differ in mixers only
    mixers = [m for m, _ in drawn]
    assert set(mixers[0]) == {"attention"} and set(mixers[1]) == {"linear_attention"}
    assert mixers[2][-1] == "attention" and set(mixers[2][:-1]) == {"linear_attention"}
    widths = sorted(space.d_model.values())
    assert drawn[0][1] == widths[len(widths) // 2]  # the middle width


def test_depth_four_makes_a_three_to_one_hybrid():
    space = _space(**{"depth: {low: 1, high: 2}": "depth: {low: 2, high: 6}", "d_model: [16]": "d_model: [16, 32]"})
    hybrid = baselines(space)[2]
    assert hybrid.label == "3:1 hybrid"
    assert _mixers(space, hybrid.params) == (("linear_attention",) * 3 + ("attention",), 32)


def test_a_space_without_a_mixer_or_depth_gets_fewer_references():
    no_linear = _space(**{"mixer: [attention, linear_attention, none]": "mixer: [attention, none]"})
    assert [b.label for b in baselines(no_linear)] == ["all-attention"]
    one_block = _space(**{"depth: {low: 1, high: 2}": "depth: [1]"})
    assert [b.label for b in baselines(one_block)] == ["all-attention", "all-linear"]
    mlp_only = _space(**{"mixer: [attention, linear_attention, none]": "mixer: [none]"})
    assert baselines(mlp_only) == []


def test_the_references_store_the_widest_precision_the_space_offers():
    """A baseline takes each precision field's widest choice: the default where the space offers
    it (bf16 KV cache, study-wide or per layer), the only value where one narrower value fixes it
    (weight_dtype: [fp8] stores every candidate's weights in fp8, the references' too)."""
    block = "precision:\n  kv_dtype: [bf16, fp8]\n  weight_dtype: [fp8]\n"
    per_layer = "  mlp_ratio: [0, 2]\n  state_dtype: [bf16, fp32]\n"
    for space in (_space(**{"train:": block + "train:"}), _space(**{"  mlp_ratio: [0, 2]\n": per_layer})):
        for ref in baselines(space):
            arch = space.sample(optuna.trial.FixedTrial(ref.params), _task(space.task)).arch
            for layer in arch.layers:
                assert (layer.kv_dtype, layer.state_dtype) == ("bf16", "fp32"), (ref.label, layer)
                assert layer.weight_dtype == ("fp8" if space.precision else "bf16"), (ref.label, layer)


def _baseline_trials(study: optuna.Study) -> list[str]:
    return sorted(record.baseline_of(t) for t in study.get_trials(deepcopy=False) if record.baseline_of(t))


def test_enqueued_once_per_study_across_resumes_and_racing_creators(tmp_path):
    space = write_space(tmp_path)
    expected = sorted(b.label for b in baselines(load_space(str(space))))
    storage = str(tmp_path / "s.journal")
    config = SearchConfig(space=str(space), storage=storage, study="race", device="cpu")
    studies, errors = [], []

    def start() -> None:
        try:
            studies.append(prepare(config)[1])
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(studies) == 4
    _, study = prepare(config)  # a resume queues nothing more
    assert _baseline_trials(study) == expected
    assert len(study.get_trials(deepcopy=False)) == len(expected)


def test_no_baselines_flag_queues_none(tmp_path):
    config = SearchConfig(
        space=str(write_space(tmp_path)), storage=str(tmp_path / "s.journal"), device="cpu", baselines=False
    )
    assert prepare(config)[1].get_trials(deepcopy=False) == []


def test_baselines_are_trained_in_full_even_when_the_pruner_would_stop_them(tmp_path, monkeypatch):
    """Every rung of every trial is told to stop; the baselines still complete their steps."""
    from nas.search.pruning import CostAwarePruner

    monkeypatch.setattr(CostAwarePruner, "reason", lambda self, study, trial: "told to stop")
    space = write_space(tmp_path, steps=16)
    n = len(baselines(load_space(str(space))))
    study = run_search(
        SearchConfig(space=str(space), trials=n, storage=str(tmp_path / "s.journal"), device="cpu", prune=True)
    )
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * n
    recs = record.records(study)
    assert all(r.baseline and r.steps_done == 16 and r.rungs for r in recs)


@pytest.mark.slow
def test_two_worker_processes_share_one_set_of_baselines(tmp_path, capsys):
    space = write_space(tmp_path)
    storage = str(tmp_path / "w.journal")
    args = [
        "search",
        "--space",
        str(space),
        "--workers",
        "2",
        "--device",
        "cpu",
        "--trials",
        "4",
        "--study",
        "w",
        "--storage",
        storage,
    ]
    assert main(args) == 0
    from nas.search.storage import open_storage

    study = optuna.load_study(study_name="w", storage=open_storage(storage))
    assert _baseline_trials(study) == sorted(b.label for b in baselines(load_space(str(space))))
    out = capsys.readouterr().out
    assert "hybrid" in out and ("all-attention" in out or "all-linear" in out)


def test_table_and_report_name_the_baselines(tmp_path, capsys):
    space = write_space(tmp_path)
    storage = str(tmp_path / "s.journal")
    assert main(["search", "--space", str(space), "--trials", "3", "--study", "b", "--storage", storage]) == 0
    out = capsys.readouterr().out
    for label in ("all-attention", "all-linear", "1:1 hybrid"):
        assert label in out
    html_path = tmp_path / "r.html"
    assert main(["report", "--study", "b", "--storage", storage, "--out", str(html_path)]) == 0
    page = html_path.read_text()
    assert page.count("baseline: ") >= 3 and '"name":"baselines"' in page.replace(" ", "")


def test_a_requeued_baseline_keeps_its_label(tmp_path):
    study = prepare(SearchConfig(space=str(write_space(tmp_path)), storage=str(tmp_path / "s.journal"), device="cpu"))[
        1
    ]
    trial = study.ask()  # the first baseline, now RUNNING in a worker that dies
    frozen = study._storage.get_trial(trial._trial_id)  # noqa: SLF001
    assert record.fail_stale(study, frozen, "worker died")
    assert _baseline_trials(study).count(record.baseline_of(frozen)) == 2  # the failed one and its re-queue
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    assert record.baseline_of(frozen) in [record.baseline_of(t) for t in waiting]
    again = next(t for t in waiting if t.user_attrs.get("requeued_from") == frozen.number)
    # killed before it drew anything: queued with the baseline's own parameters, not an empty set
    # (which would have sampled a random candidate under the baseline's label)
    assert again.system_attrs["fixed_params"] == frozen.system_attrs["fixed_params"] != {}


def _table_and_report(tmp_path, study: str, flags: list[str]):
    """Search the tiny space with ``flags``; the final table, its columns, the row of trial 0 (the
    all-attention baseline) and the report's HTML."""
    from nas.commands._front import front_table as _front_table
    from nas.search.storage import open_storage

    storage = str(tmp_path / "s.journal")
    assert main(["search", "--space", str(write_space(tmp_path)), "--study", study, "--storage", storage, *flags]) == 0
    table = _front_table(optuna.load_study(study_name=study, storage=open_storage(storage)))
    column = {str(c.header): list(c._cells) for c in table.columns}  # noqa: SLF001
    html_path = tmp_path / "r.html"
    assert main(["report", "--study", study, "--storage", storage, "--out", str(html_path)]) == 0
    return table, column, column["trial"].index("0"), html_path.read_text()


def test_over_budget_baselines_are_listed_as_never_trained(tmp_path):
    """A baseline over a hard budget is never trained: the final table and the report still list
    it below the front, saying it was over budget, with no accuracy (not a score of 0)."""
    # the tiny space's all-attention baseline (trial 0) needs 0.14 MiB, its all-linear one 0.11
    table, column, row, page = _table_and_report(tmp_path, "o", ["--trials", "1", "--max-memory-mb", "0.12"])
    assert column["architecture"][row].endswith("(all-attention, over budget)")
    assert column["acc"][row] == "-" and column["acc"][0] != "-"  # the trained front row has its score
    assert "baselines not on the front (over budget: never trained, no accuracy)" in str(table.caption)
    assert "<td>baseline: all-attention, over budget (" in page and page.count("<td>not trained</td>") == 1


def _tight_guard(tmp_path, steps: int = 5):
    """The tiny space with a wall-clock guard no step fits in (1 ns), as on a busy box."""
    space = write_space(tmp_path, steps=steps)
    space.write_text(space.read_text().replace("max_train_seconds: 600", "max_train_seconds: 1.0e-9"))
    return space


@pytest.mark.slow
def test_baselines_are_not_cut_short_by_the_wall_clock_guard(tmp_path, capsys):
    """Beside CPU-bound jobs the space's max_train_seconds stopped the all-attention baseline at
    177/300 steps, so "what the search beat" was a half-trained yardstick. A baseline trains in
    full (the guard does not apply to it); a sampled trial is still cut short."""
    from nas.search.storage import open_storage

    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(_tight_guard(tmp_path)), "--trials", "4", "--study", "g", "--storage", storage]
    assert main([*argv, "--device", "cpu"]) == 0
    recs = record.records(optuna.load_study(study_name="g", storage=open_storage(storage)))
    refs = [r for r in recs if r.baseline is not None]
    assert len(refs) == 3 and all(r.steps_done == r.planned_steps == 5 and not r.truncated for r in refs)
    assert [r.steps_text() for r in recs if r.baseline is None] == ["1/5"]  # the guard still holds for the rest
    assert "1 trial(s) stopped early by the time budget" in capsys.readouterr().out


def test_a_truncated_baseline_says_so_in_the_table_and_the_report(tmp_path, monkeypatch):
    """A study holding a baseline the guard cut short (written before baselines trained without
    it) listed it as ``x1/5`` in the recipe column and "not on the front" in the report, without
    saying why: both now say it was truncated, and by how many steps."""
    from nas.search import faults

    monkeypatch.setattr(faults, "training_budget", lambda kind, guard, deadline, now: (0.0, deadline))
    table, column, row, page = _table_and_report(tmp_path, "t", ["--trials", "3", "--device", "cpu"])
    assert column["architecture"][row].endswith("(all-attention, truncated 1/5 steps)")
    assert "truncated: stopped by the time guard before their planned steps" in str(table.caption)
    assert "<td>baseline: all-attention, truncated (time budget: 1/5 steps), not on the front</td>" in page
