"""The Optuna glue: objectives, user attrs, resume, constraints, failures, stale-trial recovery."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from nas.results.pareto import front
from nas.search import record
from nas.search.study import (
    DIRECTIONS,
    METRICS,
    SAMPLERS,
    SearchConfig,
    SearchError,
    n_complete,
    n_infeasible,
    open_study,
    prepare,
    run_search,
    worker_config,
)
from nas.spec import ArchSpec, TrainSpec
from tests.conftest import write_space


def _config(tmp_path: Path, space: Path, **kw) -> SearchConfig:
    """A study without baselines unless asked (these tests count and place trials; the baselines
    have their own tests)."""
    base = dict(
        space=str(space), trials=3, storage=str(tmp_path / "s.journal"), study="t", device="cpu", baselines=False
    )
    return SearchConfig(**{**base, **kw})


def test_search_records_objectives_and_attrs(tmp_path, tiny_space):
    study = run_search(_config(tmp_path, tiny_space))
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 3
    assert study.metric_names == list(METRICS)
    assert [d.name.lower() for d in study.directions] == list(DIRECTIONS)
    for t in complete:
        arch = ArchSpec.from_dict(t.user_attrs["arch"])
        TrainSpec.from_dict(t.user_attrs["train"])
        assert arch.vocab_size == 16 and t.user_attrs["params"] > 0
        assert t.user_attrs["latency_source"] == "predicted" and t.user_attrs["latency_device"] == "h100_sxm"
        assert t.values[1] == pytest.approx(t.user_attrs["latency"]["median_ms"])
        assert 0.0 <= t.values[0] <= 1.0 and t.values[2] > 0
        assert t.user_attrs["curve"] and t.user_attrs["steps_done"] == 5
    assert study.user_attrs["search"]["space"] == "ci_tiny"


def test_rerun_resumes_to_the_requested_count(tmp_path, tiny_space):
    first = run_search(_config(tmp_path, tiny_space, trials=2))
    before = {t.number: (t.params, t.values) for t in first.get_trials(states=(TrialState.COMPLETE,))}
    second = run_search(_config(tmp_path, tiny_space, trials=4))
    after = {t.number: (t.params, t.values) for t in second.get_trials(states=(TrialState.COMPLETE,))}
    assert len(after) == 4
    assert all(after[n] == v for n, v in before.items())


def test_hard_budget_skips_training_and_is_infeasible(tmp_path, tiny_space, monkeypatch):
    """Nothing fits 10 parameters: every candidate is recorded untrained, none counts toward
    --trials, and the search stops after MAX_UNTRAINED_IN_A_ROW of them with a message."""
    monkeypatch.setattr("nas.search.loop.MAX_UNTRAINED_IN_A_ROW", 4)
    config = _config(tmp_path, tiny_space, trials=3, max_params=10)
    with pytest.raises(
        SearchError,
        match="4 candidates in a row broke a hard budget.*too few feasible candidates "
        r"\(0 of 3 trained",
    ):
        run_search(config)
    study = open_study(config.study, config.storage)
    infeasible = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(infeasible) == 4 and n_complete(study) == 0 and n_infeasible(study) == 4
    for t in infeasible:
        assert "params" in t.user_attrs["skipped_training"]
        assert "curve" not in t.user_attrs and t.values[0] == 0.0
        assert t.constraints["params"] > 0
    assert front(study) == []


def test_infeasible_candidates_do_not_count_toward_trials(tmp_path, tiny_space):
    """--trials 4 with a parameter budget that part of the space breaks: 4 trained candidates,
    the infeasible ones recorded beside them and counted separately."""
    study = run_search(_config(tmp_path, tiny_space, trials=4, max_params=1500))
    trained = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if "skipped_training" not in t.user_attrs]
    assert len(trained) == 4 == n_complete(study)
    assert all("curve" in t.user_attrs and t.constraints["params"] <= 0 for t in trained)
    assert n_infeasible(study) > 0


def test_budget_keeps_feasible_candidates(tmp_path, tiny_space):
    study = run_search(_config(tmp_path, tiny_space, trials=4, max_latency_ms=1e6))
    assert all(t.constraints["latency_ms"] <= 0 for t in study.get_trials(states=(TrialState.COMPLETE,)))
    assert front(study)


def test_divergence_fails_the_trial_and_the_study_goes_on(tmp_path, monkeypatch):
    space = write_space(tmp_path, steps=40).read_text()
    space = space.replace("optimizer: [adamw, lion, radam, sgd]", "optimizer: [sgd]").replace(
        "lr: {low: 1.0e-3, high: 1.0e-2, log: true}", "lr: [1.0e+6]\n  grad_clip: [0.0]"
    )
    path = tmp_path / "diverge.yaml"
    path.write_text(space)
    config = _config(tmp_path, path, trials=1)
    ctx, study = prepare(config)
    monkeypatch.setattr("nas.search.loop.MAX_FAILURES_IN_A_ROW", 3)
    with pytest.raises(SearchError, match="3 trials in a row failed"):
        run_search(config, ctx_study=(ctx, study))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(failed) == 3
    assert all("diverged" in t.user_attrs["failure"] for t in failed)


def test_stale_running_trial_is_failed_and_requeued(tmp_path, tiny_space):
    config = _config(tmp_path, tiny_space, trials=2)
    ctx, study = prepare(config)
    dead = subprocess.Popen(["true"])
    dead.wait()
    trial = study.ask()
    ctx.space.sample(trial, ctx.task)
    trial.set_user_attr("pid", dead.pid)
    trial.set_user_attr("host", socket.gethostname())
    params = trial.params
    run_search(config, ctx_study=(ctx, study))
    stale = study.get_trials()[trial.number]
    assert stale.state == TrialState.FAIL and "worker died" in stale.user_attrs["failure"]
    requeued = [t for t in study.get_trials() if t.user_attrs.get("requeued_from") == trial.number]
    assert len(requeued) == 1 and requeued[0].params == params and requeued[0].state == TrialState.COMPLETE


def test_a_dead_workers_pid_reused_by_another_process_is_still_dead(tmp_path, tiny_space):
    """A worker's pid names its process with the process's start time: when a busy host hands the
    pid of a killed worker to another process (threads take pids too), its trial is still failed
    and re-queued instead of being waited on (a resume after kill -9 hung so in CI)."""
    import os

    import nas.search.loop as study_mod
    from nas.search.record import process_start

    me = process_start(os.getpid())
    assert me is not None and me == process_start(os.getpid())  # stable for one process
    config = _config(tmp_path, tiny_space, trials=1)
    ctx, study = prepare(config)
    trial = study.ask()
    ctx.space.sample(trial, ctx.task)
    trial.set_user_attr("pid", os.getpid())  # a live pid ...
    trial.set_user_attr("pid_start", me + 1)  # ... of a process that started later than the worker did
    trial.set_user_attr("host", socket.gethostname())
    assert study_mod.recover_stale_trials(study) == [trial.number]
    assert study_mod._pid_alive(os.getpid(), me) and study_mod._pid_alive(os.getpid(), None)  # no record: kill(0)


def test_a_trial_whose_process_died_before_claiming_it_is_failed_after_the_grace(tmp_path, tiny_space, monkeypatch):
    """A trial taken from the study whose process was killed before it recorded its pid (nothing
    says whose it is): left alone within UNCLAIMED_GRACE_S of its start (a live worker is about to
    claim it), failed and re-queued after; the search then trains its parameters instead of waiting
    on it for good (a resume after kill -9 hung on one)."""
    import datetime

    import nas.search.loop as study_mod

    config = _config(tmp_path, tiny_space, trials=1)
    ctx, study = prepare(config)
    orphan = study.ask()
    ctx.space.sample(orphan, ctx.task)
    params = orphan.params
    assert study_mod.recover_stale_trials(study) == []
    later = datetime.datetime.now() + datetime.timedelta(seconds=study_mod.UNCLAIMED_GRACE_S + 1)
    monkeypatch.setattr(study_mod, "_now", lambda: later)
    assert study_mod.recover_stale_trials(study) == [orphan.number]
    failed = study.get_trials()[orphan.number]
    assert failed.state == TrialState.FAIL and "no worker claimed it" in failed.user_attrs["failure"]
    run_search(config, ctx_study=(ctx, study))
    requeued = [t for t in study.get_trials() if t.user_attrs.get("requeued_from") == orphan.number]
    assert len(requeued) == 1 and requeued[0].params == params and requeued[0].state == TrialState.COMPLETE


def test_a_worker_killed_at_any_point_of_its_claim_leaves_a_recoverable_trial(tmp_path, tiny_space, monkeypatch):
    """``record.write_start`` is several storage writes; a worker killed after any of them leaves
    a trial that recovery fails, at once or after the grace, and never one it waits on for good
    (a pid without its host read as another host's trial: a resume after kill -9 hung in CI)."""
    import datetime

    import nas.search.loop as study_mod

    writes: list[tuple[str, object]] = []

    class Recorder:
        def set_user_attr(self, key, value):
            writes.append((key, value))

    record.write_start(Recorder())
    assert {"pid", "host"} <= {k for k, _ in writes}
    dead = subprocess.Popen(["true"])
    dead.wait()
    config = _config(tmp_path, tiny_space, trials=1)
    ctx, study = prepare(config)
    later = datetime.datetime.now() + datetime.timedelta(seconds=study_mod.UNCLAIMED_GRACE_S + 1)
    for cut in range(len(writes) + 1):
        trial = study.ask()
        for key, value in writes[:cut]:
            trial.set_user_attr(key, dead.pid if key == "pid" else value)
        monkeypatch.setattr(study_mod, "_now", datetime.datetime.now)
        now = study_mod.recover_stale_trials(study)
        monkeypatch.setattr(study_mod, "_now", lambda: later)
        assert now + study_mod.recover_stale_trials(study) == [trial.number], writes[:cut]
        assert study.get_trials()[trial.number].state == TrialState.FAIL


def test_a_trial_is_claimed_before_anything_else_runs(tmp_path, tiny_space, monkeypatch):
    """The search records its pid and host on a trial right after taking it: a process killed at
    any later point leaves a trial that stale-trial recovery can attribute."""
    import nas.search.loop as study_mod

    config = _config(tmp_path, tiny_space, trials=1)
    ctx, study = prepare(config)

    def killed(*_):
        raise RuntimeError("killed here")

    monkeypatch.setattr(study_mod, "_surplus", killed)
    with pytest.raises(RuntimeError, match="killed here"):
        run_search(config, ctx_study=(ctx, study))
    (running,) = study.get_trials(states=(TrialState.RUNNING,))
    assert running.user_attrs["pid"] == os.getpid() and running.user_attrs["host"] == socket.gethostname()


def test_running_trial_of_a_live_process_is_left_alone(tmp_path, tiny_space):
    # a live worker's trial counts against the budget: with trials=1 this run only waits for it
    config = _config(tmp_path, tiny_space, trials=1, timeout=2.0)
    ctx, study = prepare(config)
    trial = study.ask()
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("host", socket.gethostname())
    run_search(config, ctx_study=(ctx, study))
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_a_constrained_study(tmp_path, tiny_space, sampler):
    study = run_search(_config(tmp_path, tiny_space, trials=3, sampler=sampler, max_latency_ms=1e6))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3


def test_resume_with_other_settings_is_refused(tmp_path, tiny_space):
    run_search(_config(tmp_path, tiny_space, trials=1))
    with pytest.raises(ValueError, match="was created with task"):
        prepare(_config(tmp_path, tiny_space, task="mqar:vocab_size=16,seq_len=16,num_kv_pairs=3"))


def test_sqlite_storage(tmp_path, tiny_space):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run_search(_config(tmp_path, tiny_space, trials=2, storage=url))
    study = optuna.load_study(study_name="t", storage=url)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 2


def test_open_study_without_create_names_known_studies(tmp_path, tiny_space):
    run_search(_config(tmp_path, tiny_space, trials=1))
    with pytest.raises(ValueError, match=r"no study named 'nope'.*\['t'\]"):
        open_study("nope", str(tmp_path / "s.journal"), create=False)


def test_measured_latency_is_recorded_as_measured(tmp_path, tiny_space, monkeypatch):
    """The objective's GPU path, with the GPU measurement stubbed: what it returns is what the
    trial records, and a kernel that disagrees with the model fails the trial with the reason."""
    import dataclasses

    from nas.latency import KernelMismatchError, Latency

    calls = []

    def fake_measure(model, shape, device=None):
        calls.append(model.arch)
        if len(calls) == 2:
            raise KernelMismatchError("triton forward differs from the torch model: relative error 1e-01")
        return Latency(0.123, 0.002, "measured", "NVIDIA H200", "bf16", shape, versions=(("triton", "3.6"),))

    monkeypatch.setattr("nas.search.objective.measure", fake_measure)
    config = _config(tmp_path, tiny_space, trials=2)
    ctx, study = prepare(config)
    run_search(config, ctx_study=(dataclasses.replace(ctx, measure=True), study))
    trials = study.get_trials()
    assert trials[0].user_attrs["latency_source"] == "measured" and trials[0].values[1] == 0.123
    assert (
        trials[0].user_attrs["latency"]["iqr_ms"] == 0.002 and trials[0].user_attrs["latency_device"] == "NVIDIA H200"
    )
    assert trials[1].state == TrialState.FAIL and "KernelMismatchError" in trials[1].user_attrs["failure"]
    assert len(calls) == 3 and calls[0] == ArchSpec.from_dict(trials[0].user_attrs["arch"])


def test_latency_is_measured_by_default_only_on_the_gpu_it_targets(monkeypatch):
    """--target auto on a CUDA device measures; a named profile measures only when it is this
    GPU's; a CPU run predicts, and --measure there is refused."""
    import torch

    from hardware_profiles import load_profile
    from nas.search.study import resolve_measure

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    h200, h100 = load_profile("h200"), load_profile("h100_sxm")
    assert resolve_measure(None, "auto", h200, cpu) is False
    assert resolve_measure(None, "auto", h200, cuda) is True
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert resolve_measure(None, "h200", h200, cuda) is True
    assert resolve_measure(None, "h100_sxm", h100, cuda) is False
    assert resolve_measure(False, "auto", h200, cuda) is False
    with pytest.raises(SearchError, match="--measure times"):
        resolve_measure(True, "auto", h200, cpu)


def test_a_study_keeps_one_kind_of_latency(tmp_path, tiny_space, monkeypatch):
    """Measured and predicted latencies are not comparable: resuming a predicted study with
    measurement on is refused with one line, and the study is left as it was."""
    run_search(_config(tmp_path, tiny_space, trials=1))
    before = (tmp_path / "s.journal").read_bytes()
    monkeypatch.setattr("nas.search.start.resolve_measure", lambda *a: True)
    with pytest.raises(SearchError, match="holds predicted latencies and this run would record measured"):
        prepare(_config(tmp_path, tiny_space, trials=2))
    assert (tmp_path / "s.journal").read_bytes() == before


def test_a_measured_study_resumes_measured_or_not_at_all(tmp_path, tiny_space):
    """No flag: a resumed study keeps the kind of latency it recorded; on a CPU a measured study
    is refused with a line that says why (no --measure flag to drop), and --predict is refused too."""
    run_search(_config(tmp_path, tiny_space, trials=1))
    from nas.search.storage import open_storage

    study = optuna.load_study(study_name="t", storage=open_storage(str(tmp_path / "s.journal")))
    study.set_user_attr("search", {**study.user_attrs["search"], "measure": True})  # as a GPU run records it
    before = (tmp_path / "s.journal").read_bytes()
    with pytest.raises(SearchError, match="measures latency on a GPU .*--device cuda"):
        prepare(_config(tmp_path, tiny_space, trials=2))
    with pytest.raises(SearchError, match="holds measured latencies and this run would record predicted"):
        prepare(_config(tmp_path, tiny_space, trials=2, measure=False))
    assert (tmp_path / "s.journal").read_bytes() == before


def test_measuring_needs_head_dims_the_kernels_run(tmp_path, monkeypatch):
    """A space with head dim 256 is refused (one line naming the field) whether latency would be
    measured or predicted: predicted, it got a roofline guess beside calibrated predictions."""
    from nas.space import SpaceError
    from tests.conftest import TINY_SPACE

    space = tmp_path / "wide.yaml"
    space.write_text(
        TINY_SPACE.replace("STEPS", "2")
        .replace("d_model: [16]", "d_model: [512]")
        .replace("heads: [1, 2]", "heads: [2]")
    )
    for measure in (False, True):
        monkeypatch.setattr("nas.search.start.resolve_measure", lambda *a, m=measure: m)
        with pytest.raises(SpaceError, match="layer.heads: 2 heads on d_model=512 give head dim 256"):
            prepare(_config(tmp_path, space, trials=1, study="wide"))
    monkeypatch.undo()
    run_search(_config(tmp_path, write_space(tmp_path), trials=1, study="wide"))  # head dims 8, 16: fine


def _wrapped_interrupt(*_args, **_kwargs):
    """What a Ctrl-C inside a class body looks like to the caller: a RuntimeError caused by it."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as ki:
        raise RuntimeError("Error calling __set_name__ on 'Field' instance") from ki


@pytest.mark.parametrize("raised", ["plain", "wrapped", "flag only"])
def test_ctrl_c_in_any_form_records_the_trial_interrupted(tmp_path, tiny_space, monkeypatch, raised):
    """A Ctrl-C during a trial fails it as "interrupted" and leaves the loop by KeyboardInterrupt,
    whether it arrives as KeyboardInterrupt, wrapped by the import machinery, or only as the
    handler's record with some other error on top; an error without Ctrl-C is not swallowed."""
    from nas.search import interrupt

    def plain(*_a, **_k):
        raise KeyboardInterrupt

    def flag_only(*_a, **_k):
        interrupt.request()
        raise ValueError("raised while stopping")

    fake = {"plain": plain, "wrapped": _wrapped_interrupt, "flag only": flag_only}[raised]
    monkeypatch.setattr("nas.search.loop.evaluate", fake)
    config = _config(tmp_path, tiny_space, trials=2)
    with pytest.raises(KeyboardInterrupt):
        run_search(config)
    trials = open_study(config.study, config.storage).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert trials[0].user_attrs["failure"] == "interrupted"


def test_ctrl_c_re_queues_the_trial_it_stopped_and_a_resume_trains_it(tmp_path, tiny_space, monkeypatch):
    """A Ctrl-C during a baseline lost it for good (kill -9 re-queued it): the interrupted trial's
    parameters, and its baseline label, are queued again, and the resume trains them first."""
    from nas.search import loop as study_module

    real = study_module.evaluate

    def stopped(ctx, trial):
        ctx.space.sample(trial, ctx.task)  # the candidate is drawn, then Ctrl-C lands in its training
        raise KeyboardInterrupt

    monkeypatch.setattr(study_module, "evaluate", stopped)
    config = _config(tmp_path, tiny_space, trials=1, baselines=True)
    with pytest.raises(KeyboardInterrupt):
        run_search(config)
    first = open_study(config.study, config.storage).get_trials()[0]
    assert first.state == TrialState.FAIL and first.user_attrs["failure"] == "interrupted; parameters re-queued"
    label = first.user_attrs["baseline"]
    monkeypatch.setattr(study_module, "evaluate", real)
    run_search(dataclasses.replace(config, trials=4))  # the other baselines were queued first
    trained = open_study(config.study, config.storage).get_trials(states=(TrialState.COMPLETE,))
    again = [t for t in trained if t.user_attrs.get("requeued_from") == first.number]
    assert len(again) == 1 and again[0].params == first.params and again[0].user_attrs["baseline"] == label


def test_an_error_without_ctrl_c_is_not_an_interrupt(tmp_path, tiny_space, monkeypatch):
    def boom(*_a, **_k):
        raise ValueError("a bug")

    monkeypatch.setattr("nas.search.loop.evaluate", boom)
    with pytest.raises(ValueError, match="a bug"):
        run_search(_config(tmp_path, tiny_space, trials=1))


def _configs(study: optuna.Study) -> list[dict]:
    return [t.params for t in study.get_trials(states=(TrialState.COMPLETE,))]


def test_resume_continues_the_sampler_sequence(tmp_path, tiny_space):
    """2 trials, then the same command with --trials 4: trials 2 and 3 are new configurations,
    not trials 0 and 1 again (the sampler used to be re-seeded identically on every run)."""
    run_search(_config(tmp_path, tiny_space, trials=2))
    configs = _configs(run_search(_config(tmp_path, tiny_space, trials=4)))
    assert len(configs) == 4 and all(c not in configs[:i] for i, c in enumerate(configs))


def test_a_seeded_run_repeated_from_scratch_proposes_the_same_trials(tmp_path, tiny_space):
    for folder in "abc":
        (tmp_path / folder).mkdir()
    first = _configs(run_search(_config(tmp_path / "a", tiny_space, trials=3)))
    again = _configs(run_search(_config(tmp_path / "b", tiny_space, trials=3)))
    other = _configs(run_search(_config(tmp_path / "c", tiny_space, trials=3, seed=1)))
    assert first == again and first != other


def _two_configs_space(tmp_path: Path) -> Path:
    """A space with exactly two configurations (only layer0.mlp_ratio is searched)."""
    text = write_space(tmp_path, steps=2).read_text()
    for old, new in {
        "depth: {low: 1, high: 2}": "depth: [1]",
        "mixer: [attention, linear_attention, none]": "mixer: [none]",
        "optimizer: [adamw, lion, radam, sgd]": "optimizer: [adamw]",
        "lr: {low: 1.0e-3, high: 1.0e-2, log: true}": "lr: [1.0e-3]",
    }.items():
        text = text.replace(old, new)
    path = tmp_path / "two.yaml"
    path.write_text(text)
    return path


def test_a_completed_configuration_is_not_trained_again(tmp_path, monkeypatch):
    """Two configurations and --trials 3: both are trained once; repeats are pruned with
    ``duplicate_of`` and, many in a row, stop the search (the space is exhausted). A repeat that
    was asked for (enqueued) is trained."""
    monkeypatch.setattr("nas.search.loop.MAX_UNTRAINED_IN_A_ROW", 10)
    # the guard for a space that repeats anyway: a countable one this small is refused up front
    # (test_space.py), so it is made to look uncountable here
    monkeypatch.setattr("nas.space.SearchSpace.configurations", lambda self: None)
    config = _config(tmp_path, _two_configs_space(tmp_path), trials=3)
    with pytest.raises(SearchError, match="repeated configurations already tried; the space seems exhausted after 2"):
        run_search(config)
    study = open_study(config.study, config.storage)
    configs = _configs(study)
    assert sorted(c["layer0.mlp_ratio"] for c in configs) == [0, 2]
    repeats = study.get_trials(states=(TrialState.PRUNED,))
    assert len(repeats) == 10
    assert all(
        configs[[c["layer0.mlp_ratio"] for c in configs].index(t.params["layer0.mlp_ratio"])] == t.params
        and t.user_attrs["duplicate_of"] in (0, 1, 2)
        and "curve" not in t.user_attrs
        for t in repeats
    )
    from nas.results.pareto import PickError, pick

    repeat = repeats[0]
    with pytest.raises(
        PickError,
        match=rf"trial {repeat.number} of .* is PRUNED: the same configuration as trial "
        rf"{repeat.user_attrs['duplicate_of']}, not trained again; export --trial ",
    ):
        pick(study, trial=repeat.number)  # nas export --trial N: it said only "PRUNED, not COMPLETE"
    study.enqueue_trial(configs[0])
    run_search(config)
    assert _configs(study)[2] == configs[0]


def test_user_space_without_name_resumes_from_the_recorded_copy(tmp_path):
    """A worker re-reads the space from the study's record; a file without ``name:`` was recorded
    under its file name, and the worker must see that same name (it used to see 'x (as recorded
    in the study)' and refuse)."""
    path = tmp_path / "my_space.yaml"
    path.write_text(write_space(tmp_path, steps=2).read_text().replace("name: ci_tiny\n", ""))
    ctx, _ = prepare(_config(tmp_path, path, trials=1))
    assert ctx.space.name == "my_space"
    joined = worker_config("t", str(tmp_path / "s.journal"), device="cpu")
    ctx, study = prepare(joined)
    assert ctx.space.name == "my_space" and study.user_attrs["search"]["space"] == "my_space"


def test_an_empty_study_name_is_refused(tmp_path, tiny_space):
    with pytest.raises(SearchError, match="--study must be a non-empty name"):
        prepare(_config(tmp_path, tiny_space, study=""))
    assert not (tmp_path / "s.journal").exists()


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nas.search.study"]


def test_a_resume_that_changes_recorded_budgets_says_so(tmp_path, tiny_space, caplog):
    run_search(_config(tmp_path, tiny_space, trials=2))
    with caplog.at_level("WARNING", logger="nas.search.study"):
        prepare(_config(tmp_path, tiny_space, trials=2))
        assert not _notes(caplog)  # same settings: nothing to say
        _, study = prepare(_config(tmp_path, tiny_space, trials=4))
        assert study.user_attrs["budgets"]["trials"] == 4  # recorded, but more trials alone is no news
        assert not _notes(caplog)
        prepare(_config(tmp_path, tiny_space, trials=2))
        _, study = prepare(_config(tmp_path, tiny_space, trials=1, max_latency_ms=5.0))
    assert study.user_attrs["budgets"]["trials"] == 1
    assert _notes(caplog) == [
        (
            "study 't': recorded budgets changed (max_latency_ms None -> 5.0, trials 2 -> 1); "
            "workers, the front, the report and nas export use the new ones, for the trials trained before too "
            "(the stored constraints and the hypervolume keep the budgets each trial was scored under)"
        )
    ]


def test_batches_larger_than_the_task_are_clipped_with_a_notice(tmp_path, caplog):
    """ci_tiny's task has 128 training rows; a batch of 100000 is clipped to 128, said in one line."""
    space = write_space(tmp_path, steps=2)
    space.write_text(space.read_text().replace("batch_size: [8]", "batch_size: [8, 100000]"))
    with caplog.at_level("WARNING", logger="nas.search.study"):
        study = run_search(_config(tmp_path, space, trials=4))
    assert _notes(caplog) == [
        "train.batch_size: 100000 is more than the 128 training rows of task mqar; batches are clipped to 128"
    ]
    batches = {t.user_attrs["train"]["batch_size"] for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert batches == {8, 128}


def test_time_budget_records_the_steps_actually_trained(tmp_path):
    """max_train_seconds far below one step's time stops every training after its first step
    (deterministically: any step takes longer than a nanosecond); the trial records 1 of 5."""
    space = write_space(tmp_path, steps=5)
    space.write_text(space.read_text().replace("max_train_seconds: 600", "max_train_seconds: 1.0e-9"))
    study = run_search(_config(tmp_path, space, trials=1))
    t = study.get_trials(states=(TrialState.COMPLETE,))[0]
    assert (t.user_attrs["steps_done"], t.user_attrs["stopped"], t.user_attrs["train"]["steps"]) == (
        1,
        "time budget",
        5,
    )
