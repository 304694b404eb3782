"""What a resume or a worker takes from the study's record rather than from its own command line:
the data file (by resolved path and SHA-256), the space, the sampler and its seed."""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
import re
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from nas.cli import main
from nas.search.record import records, study_setup
from nas.search.study import SearchConfig, SearchError, open_study, prepare, worker_config
from tests.conftest import study_checksum, write_space


def _config(tmp_path: Path, space: Path, **kw) -> SearchConfig:
    base = dict(
        space=str(space), trials=1, storage=str(tmp_path / "s.journal"), study="t", device="cpu", baselines=False
    )
    return SearchConfig(**{**base, **kw})


def _npz(path: Path, rows: int, seq_len: int, seed: int) -> Path:
    """A token-LM data file of ``rows`` x ``seq_len`` tokens below 16."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # np.savez would append .npz to a name without it
        np.savez(f, x=rng.integers(0, 16, (rows, seq_len)), y=rng.integers(0, 16, (rows, seq_len)))
    return path


def _journal(tmp_path: Path) -> tuple[str, str]:
    storage = str(tmp_path / "s.journal")
    return study_checksum(storage, "t"), hashlib.sha256(Path(storage).read_bytes()).hexdigest()


@pytest.mark.parametrize("how", ["resume", "worker"])
def test_a_data_file_changed_since_the_study_was_created_is_refused(tmp_path, tiny_space, how):
    """The study records the file's SHA-256; a resume or a worker used to read whatever the path
    held now (trial 0 on 40 rows of 8 tokens, the next ones on 30 rows of 12)."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    prepare(_config(tmp_path, tiny_space, task=str(data)))
    recorded = hashlib.sha256(data.read_bytes()).hexdigest()
    before = _journal(tmp_path)
    _npz(data, rows=30, seq_len=12, seed=1)
    now = hashlib.sha256(data.read_bytes()).hexdigest()
    if how == "resume":
        config = _config(tmp_path, tiny_space, task=str(data), trials=2)
    else:
        config = worker_config("t", str(tmp_path / "s.journal"), device="cpu", trials=2)
    with pytest.raises(SearchError) as refused:
        prepare(config)
    message = str(refused.value)
    assert "\n" not in message and str(data) in message, message
    assert recorded[:12] in message and now[:12] in message, message
    assert _journal(tmp_path) == before


def test_a_worker_elsewhere_reads_the_data_file_the_study_was_created_with(tmp_path, tiny_space, monkeypatch):
    """``--task data/d.npz`` is resolved where the study is created: a worker started in another
    folder, which holds a data/d.npz of its own, trains on the first one."""
    first, other = tmp_path / "a", tmp_path / "b"
    data = _npz(first / "data" / "d.npz", rows=40, seq_len=8, seed=0)
    _npz(other / "data" / "d.npz", rows=30, seq_len=12, seed=1)
    monkeypatch.chdir(first)
    ctx, _ = prepare(_config(tmp_path, tiny_space, task="data/d.npz"))
    rows = ctx.task.x_train.clone()
    monkeypatch.chdir(other)
    ctx, _ = prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu"))
    assert ctx.task.config["path"] == str(data.resolve())
    assert ctx.task.x_train.shape == rows.shape and bool((ctx.task.x_train == rows).all())


@pytest.mark.parametrize(
    "spelling",
    [
        pytest.param(lambda d: str(d.resolve()), id="absolute"),
        pytest.param(lambda d: "./d.npz", id="dot-slash"),
        pytest.param(lambda d: "npz:path=d.npz", id="npz-path"),
        pytest.param(lambda d: "d.npz:test_frac=0.1", id="default-written-out"),
        pytest.param(lambda d: "sub/../d.npz", id="dot-dot"),
    ],
)
def test_a_resume_may_name_the_data_file_in_other_words(tmp_path, tiny_space, monkeypatch, spelling):
    """``--task`` is compared as the task it names: a resume spelling the study's file another way
    was refused ("created with task='d.npz', not '/abs/d.npz'")."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    _, study = prepare(_config(tmp_path, tiny_space, task="d.npz"))
    ctx, study = prepare(_config(tmp_path, tiny_space, task=spelling(data), trials=2))
    assert study_setup(study).task == "d.npz" and ctx.task.config["path"] == str(data.resolve())


def test_a_resume_may_name_the_synthetic_task_in_other_words(tmp_path, tiny_space):
    spec = "mqar:seq_len=16,num_kv_pairs=2,n_train=64,n_test=16"
    prepare(_config(tmp_path, tiny_space, task=spec))
    reordered = "mqar:n_test=16, num_kv_pairs=2,seq_len=16,n_train=64,vocab_size=128"  # 128: the default
    _, study = prepare(_config(tmp_path, tiny_space, task=reordered, trials=2))
    assert study_setup(study).task == spec
    before = _journal(tmp_path)
    with pytest.raises(SearchError, match=r"created with task='mqar:.*', not 'mqar:seq_len=16,num_kv_pairs=3"):
        prepare(_config(tmp_path, tiny_space, task="mqar:seq_len=16,num_kv_pairs=3,n_train=64,n_test=16", trials=2))
    assert _journal(tmp_path) == before


@pytest.mark.parametrize("name", ["d.npz", "e.npz"])
def test_a_resume_naming_another_data_file_here_is_refused(tmp_path, tiny_space, monkeypatch, name):
    """Run from another folder, ``--task d.npz`` names that folder's d.npz: when it holds other
    bytes the resume is refused (it trained on the study's file without a word), naming both files;
    when it holds the same bytes it is the same data and resumes."""
    first, other = tmp_path / "a", tmp_path / "b"
    data = _npz(first / "d.npz", rows=40, seq_len=8, seed=0)
    there = _npz(other / name, rows=30, seq_len=12, seed=1)
    monkeypatch.chdir(first)
    prepare(_config(tmp_path, tiny_space, task="d.npz"))
    before = _journal(tmp_path)
    monkeypatch.chdir(other)
    with pytest.raises(SearchError) as refused:
        prepare(_config(tmp_path, tiny_space, task=name, trials=2))
    message = str(refused.value)
    assert "\n" not in message and str(data.resolve()) in message and str(there.resolve()) in message, message
    for file in (data, there):
        assert hashlib.sha256(file.read_bytes()).hexdigest()[:12] in message, message
    assert _journal(tmp_path) == before
    there.write_bytes(data.read_bytes())  # the same bytes in another place: the same data
    ctx, _ = prepare(_config(tmp_path, tiny_space, task=name, trials=2))
    assert ctx.task.config["path"] == str(data.resolve())


def test_a_resume_naming_an_unreadable_file_here_by_the_recorded_name_is_refused(tmp_path, tiny_space, monkeypatch):
    first, other = tmp_path / "a", tmp_path / "b"
    _npz(first / "d.npz", rows=40, seq_len=8, seed=0)
    other.mkdir()
    (other / "d.npz").write_text("not an archive")
    monkeypatch.chdir(first)
    prepare(_config(tmp_path, tiny_space, task="d.npz"))
    monkeypatch.chdir(other)
    with pytest.raises(SearchError, match=r"trains on .*a/d\.npz \(sha256 .*; --task d\.npz here: .*not a readable"):
        prepare(_config(tmp_path, tiny_space, task="d.npz", trials=2))


def test_a_moved_data_file_is_used_where_it_is_now_if_it_holds_the_same_bytes(tmp_path, tiny_space, caplog):
    """A file moved (or mounted elsewhere on a worker's host) after the study was created: a
    resume's --task or a worker's --data names where it is now, and only the recorded bytes are
    accepted there. Without it, the refusal says how to name it."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    prepare(_config(tmp_path, tiny_space, task=str(data)))
    rows = data.read_bytes()
    moved = tmp_path / "elsewhere" / "moved.npz"
    moved.parent.mkdir()
    data.rename(moved)
    before = _journal(tmp_path)
    with pytest.raises(
        SearchError,
        match=r"d\.npz: no such file; restore that file \(or name where it is now: a resume's --task, nas worker",
    ):
        prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu", trials=2))
    other = _npz(tmp_path / "other.npz", rows=40, seq_len=8, seed=1)
    with pytest.raises(SearchError, match=r"d\.npz: no such file, and .*other\.npz: contents changed"):
        prepare(_config(tmp_path, tiny_space, task=str(other), trials=2))
    with pytest.raises(SearchError, match=r"other\.npz: contents changed"):
        prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu", trials=2, data=str(other)))
    assert _journal(tmp_path) == before
    ctx, study = prepare(_config(tmp_path, tiny_space, task=str(moved), trials=2))
    assert ctx.task.config["path"] == str(moved) and study_setup(study).task == str(data)
    assert "training on " + str(moved) in caplog.text
    ctx, _ = prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu", trials=2, data=str(moved)))
    assert ctx.task.config["path"] == str(moved) and moved.read_bytes() == rows


def test_a_data_path_given_is_the_one_used_even_while_the_recorded_one_holds_the_data(tmp_path, tiny_space, capsys):
    """``nas worker --data`` and ``nas export --data`` naming a file with other bytes, or none, while
    the recorded file is still in place: they were silently ignored (the recorded file served), so
    a user who meant other data never learned it was not used. Refused in one line now."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(tiny_space), "--storage", storage, "--study", "t", "--device", "cpu"]
    assert main([*argv, "--task", str(data), "--trials", "1", "--no-baselines"]) == 0
    other = _npz(tmp_path / "other.npz", rows=40, seq_len=8, seed=1)
    before = _journal(tmp_path)
    said = f"{other}: contents changed"
    with pytest.raises(SearchError, match=re.escape(said) + r".*\(the recorded .*d\.npz holds the data: leave"):
        prepare(worker_config("t", storage, device="cpu", trials=2, data=str(other)))
    with pytest.raises(SearchError, match=r"missing\.npz: no such file \(the recorded"):
        prepare(worker_config("t", storage, device="cpu", trials=2, data=str(tmp_path / "missing.npz")))
    assert _journal(tmp_path) == before
    capsys.readouterr()
    export = ["export", "--study", "t", "--storage", storage, "--device", "cpu", "--out", str(tmp_path / "x")]
    assert main([*export, "--retrain-steps", "2", "--data", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and "holds the data: leave the path out" in err, err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_workers_started_by_a_search_train_on_the_file_where_it_is_now(tmp_path, tiny_space):
    """``nas search --workers 2 --task NEW_PATH`` on a study whose file moved: the workers it starts
    read the recorded path, so they are told where the file is (``nas worker --data``)."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(tiny_space), "--storage", storage, "--study", "t", "--device", "cpu"]
    assert main([*argv, "--task", str(data), "--trials", "1", "--no-baselines"]) == 0
    moved = data.rename(tmp_path / "moved.npz")
    assert main([*argv, "--task", str(moved), "--trials", "3", "--workers", "2"]) == 0
    trials = open_study("t", storage, create=False).trials
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3, [t.state for t in trials]


SPACE_EDITS = [
    # a searched field's choices: Optuna refused the old trials' distribution (a traceback, and a
    # RUNNING trial the next run failed as "worker died")
    ("choices", "d_model: [16, 32]", "d_model: [16, 48]", "d_model: [16, 32] -> [16, 48]"),
    # a fixed field: accepted silently, new trials trained 9 steps and the study kept the old text
    ("fixed", "steps: [5]", "steps: [9]", "train.steps: [5] -> [9]"),
    ("range", "log: true}", "log: false}", "train.lr: {low: 0.001, high: 0.01, log: true} -> {low: 0.001, high: 0.01}"),
    ("added", "batch_size: [8]", "batch_size: [8]\n  grad_clip: [1.0]", "train.grad_clip: (absent) -> [1.0]"),
    ("guard", "max_train_seconds: 600", "max_train_seconds: 60", "max_train_seconds: 600 -> 60"),
]


@pytest.mark.parametrize(("old", "new", "said"), [pytest.param(*c[1:], id=c[0]) for c in SPACE_EDITS])
def test_a_resume_with_an_edited_space_of_the_same_name_is_refused(tmp_path, capsys, old, new, said):
    space = write_space(tmp_path)
    space.write_text(space.read_text().replace("d_model: [16]", "d_model: [16, 32]"))
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(space), "--storage", storage, "--study", "t", "--device", "cpu"]
    assert main([*argv, "--trials", "1", "--no-baselines"]) == 0
    capsys.readouterr()
    before = _journal(tmp_path)
    assert old in space.read_text()
    space.write_text(space.read_text().replace(old, new))
    assert main([*argv, "--trials", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nas: error: "), err
    assert said in err and "--study NEW_NAME" in err and "name:" in err, err
    assert _journal(tmp_path) == before
    assert [t.state for t in open_study("t", storage, create=False).trials] == [TrialState.COMPLETE]


def test_a_space_file_that_differs_only_in_layout_resumes(tmp_path):
    """Comments, key order, number spelling and the description are not the space."""
    space = write_space(tmp_path)
    prepare(_config(tmp_path, space))
    text = space.read_text()
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        "# my copy\n"
        + text.replace("description: test space", "description: mine")
        .replace("1.0e-3", "0.001")
        .replace("  steps: [5]\n  batch_size: [8]\n", "  batch_size: [8]  # clipped\n  steps: [5]\n")
        .replace("d_model: [16]", "d_model: 16")
    )
    ctx, study = prepare(_config(tmp_path, edited, trials=2))
    assert ctx.space.train["steps"].choices == (5,) and study_setup(study).space_yaml == text


@pytest.mark.parametrize(("flag", "value"), [("seed", 5), ("sampler", "random")])
def test_a_resume_asking_for_another_sampler_or_seed_is_refused(tmp_path, tiny_space, flag, value):
    prepare(_config(tmp_path, tiny_space))
    before = _journal(tmp_path)
    with pytest.raises(SearchError, match=f"created with --{flag} (0|tpe), not {value}; drop --{flag}"):
        prepare(_config(tmp_path, tiny_space, trials=2, **{flag: value}))
    assert _journal(tmp_path) == before


def _first_candidate(config: SearchConfig) -> dict:
    ctx, study = prepare(config)
    trial = study.ask()
    ctx.space.sample(trial, ctx.task)
    return trial.params


def test_a_resume_without_sampler_or_seed_follows_the_study(tmp_path, tiny_space):
    """A study created with --seed 7 --sampler random and resumed with neither flag keeps both:
    it proposes what the same study resumed with both flags proposes, not what seed 0 would."""
    recorded = dict(seed=7, sampler="random")
    for folder in "abc":
        (tmp_path / folder).mkdir()
    prepare(_config(tmp_path / "a", tiny_space, **recorded))
    prepare(_config(tmp_path / "b", tiny_space, **recorded))
    prepare(_config(tmp_path / "c", tiny_space))
    resumed = _first_candidate(_config(tmp_path / "a", tiny_space, trials=2))
    assert resumed == _first_candidate(_config(tmp_path / "b", tiny_space, trials=2, **recorded))
    assert resumed != _first_candidate(_config(tmp_path / "c", tiny_space, trials=2))
    setup = study_setup(open_study("t", str(tmp_path / "a" / "s.journal"), create=False))
    assert (setup.seed, setup.sampler) == (7, "random")


def test_export_retrains_on_a_moved_data_file_named_with_data(tmp_path, tiny_space, capsys):
    """``nas export --retrain-steps`` rebuilds the study's task from its record: a file that moved is
    refused in one line saying how to name it, and ``--data NEW_PATH`` (only with the recorded
    bytes) retrains on it. ``--data`` without ``--retrain-steps`` would be moot: refused."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(tiny_space), "--storage", storage, "--study", "t", "--device", "cpu"]
    assert main([*argv, "--task", str(data), "--trials", "1", "--no-baselines"]) == 0
    moved = data.rename(tmp_path / "moved.npz")
    other = _npz(tmp_path / "other.npz", rows=40, seq_len=8, seed=1)
    export = ["export", "--study", "t", "--storage", storage, "--device", "cpu", "--out"]
    capsys.readouterr()
    for extra, said in (
        ([], "d.npz: no such file; restore that file, or name where it is now with --data PATH"),
        (["--data", str(other)], "d.npz: no such file, and " + str(other) + ": contents changed"),
    ):
        assert main([*export, str(tmp_path / "x"), "--retrain-steps", "3", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
        assert not (tmp_path / "x").exists()
    assert main([*export, str(tmp_path / "x"), "--data", str(moved)]) == 2
    assert "--data names the data to retrain on: it needs --retrain-steps" in capsys.readouterr().err
    assert main([*export, str(tmp_path / "x"), "--retrain-steps", "3", "--data", str(moved)]) == 0
    record = json.loads((tmp_path / "x" / "arch.json").read_text())
    assert record["retrained_steps"] == 3 and record["task"]["sha256"] == hashlib.sha256(moved.read_bytes()).hexdigest()


def _profile_file(path: Path, name: str = "mygpu", bandwidth: float = 864.0) -> Path:
    """A user's profile (the shipped l4.yaml, renamed, with another bandwidth)."""
    from hardware_profiles import load_profile

    data = yaml.safe_load(Path(load_profile("l4").path).read_text())
    data.update(name=name, memory_bandwidth_gb_s=bandwidth)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_worker_elsewhere_predicts_with_the_profile_the_study_was_created_with(tmp_path, tiny_space, monkeypatch):
    """``--target my.yaml`` is a path: a worker in another folder loaded that folder's my.yaml (or
    failed without one) and recorded its trials under another GPU's latencies."""
    first, other = tmp_path / "a", tmp_path / "b"
    _profile_file(first / "my.yaml", "mygpu", 864.0)
    _profile_file(other / "my.yaml", "othergpu", 86.0)
    monkeypatch.chdir(first)
    ctx, study = prepare(_config(tmp_path, tiny_space, target="my.yaml"))
    recorded = ctx.profile
    assert study_setup(study).profile_yaml == (first / "my.yaml").read_text()
    for folder in (other, tmp_path):  # another my.yaml there; none at all
        monkeypatch.chdir(folder)
        ctx, _ = prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu"))
        assert ctx.profile == recorded and ctx.profile.memory_bandwidth_gb_s == 864.0


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda p: _profile_file(p, "mygpu", 86.0),
            r"another version of profile 'mygpu' \(my.yaml now differs in "
            r"memory_bandwidth_gb_s\): its latencies rest on the recorded one; restore the file",
        ),
        (
            lambda p: _profile_file(p, "othergpu", 864.0),
            r"created with hardware profile 'mygpu'; --target my.yaml "
            r"is 'othergpu'",
        ),
    ],
    ids=["edited", "renamed"],
)
def test_a_resume_with_an_edited_profile_file_is_refused(tmp_path, tiny_space, monkeypatch, edit, said):
    """Trials 0-1 were predicted with 864 GB/s, then 2-3 with 86 GB/s, on one front, under one label."""
    monkeypatch.chdir(tmp_path)
    _profile_file(tmp_path / "my.yaml")
    prepare(_config(tmp_path, tiny_space, target="my.yaml"))
    before = _journal(tmp_path)
    edit(tmp_path / "my.yaml")
    with pytest.raises(SearchError, match=said) as refused:
        prepare(_config(tmp_path, tiny_space, target="my.yaml", trials=2))
    assert "\n" not in str(refused.value) and _journal(tmp_path) == before
    _profile_file(tmp_path / "my.yaml")  # restored (the YAML's layout is not the profile): it resumes
    text = (tmp_path / "my.yaml").read_text()
    (tmp_path / "my.yaml").write_text("# my card\n" + text.replace("description: ", "description: mine, "))
    prepare(_config(tmp_path, tiny_space, target="my.yaml", trials=2))  # nor its comments and description


def test_a_shipped_profile_that_changed_since_keeps_the_recorded_one(tmp_path, tiny_space, monkeypatch, caplog):
    """A newer package's recalibrated h200.yaml (or --target auto on another GPU): the study keeps
    predicting with the profile it was created with, and says so."""
    import nas.search.start as study_module

    ctx, _ = prepare(_config(tmp_path, tiny_space, target="h200"))
    recorded = ctx.profile
    newer = dataclasses.replace(recorded, launch_overhead_us=recorded.launch_overhead_us * 2)
    monkeypatch.setattr(study_module, "resolve_target", lambda target: newer)
    ctx, _ = prepare(_config(tmp_path, tiny_space, target="h200", trials=2))
    assert ctx.profile == recorded != newer
    assert "predicts latency with the profile it was created with (h200)" in caplog.text
    assert "differs in launch_overhead_us" in caplog.text


def test_a_study_named_before_names_held_its_settings_keeps_resuming(tmp_path, tiny_space, monkeypatch):
    """A decode study an older version created took the name <space>-<task>-<target>: it resumes
    under it, but only a run of its settings does (a study of other settings is another one)."""
    import nas.search.studies as study_module

    decode = dict(study=None, objectives=("accuracy", "decode_latency"), context=64)
    named = study_module.study_name
    monkeypatch.setattr(study_module, "study_name", lambda *a, **k: named(*a, **{**k, "legacy_settings": True}))
    _, old = prepare(_config(tmp_path, tiny_space, **decode))
    assert old.study_name == "ci_tiny-mqar-auto"
    monkeypatch.setattr(study_module, "study_name", named)
    _, resumed = prepare(_config(tmp_path, tiny_space, trials=2, **decode))
    assert resumed.study_name == "ci_tiny-mqar-auto"
    for other, name in (
        ({"context": 128}, "ci_tiny-mqar-auto-accuracy+decode_latency-ctx128"),
        (
            {"objectives": ("accuracy", "latency", "memory"), "context": None, "latency_shape": "8X1024"},
            "ci_tiny-mqar-auto-8x1024",
        ),
    ):
        _, study = prepare(_config(tmp_path, tiny_space, **{**decode, **other}))
        assert study.study_name == name


# how older versions named a study: its target path whole, its npz:path= file as "npz", or both
@pytest.mark.parametrize(("legacy_target", "legacy_task"), [(True, False), (False, True), (True, True)])
def test_a_profile_path_names_the_study_by_its_file_name(tmp_path, tiny_space, monkeypatch, legacy_target, legacy_task):
    """``--target profiles/my.yaml`` named the study ``tiny-mqar-profiles/my.yaml``, a name
    ``nas search --study`` refuses, and ``--task npz:path=d.npz`` named it ``tiny-npz-…`` (every
    file given that way, one name); a study named either way (or both) keeps resuming under its name."""
    import nas.search.studies as study_module

    monkeypatch.chdir(tmp_path)
    _profile_file(tmp_path / "profiles" / "my.yaml")
    _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    config = _config(tmp_path, tiny_space, study=None, target="profiles/my.yaml", task="npz:path=d.npz")
    _, study = prepare(config)
    assert study.study_name.endswith("-d.npz-my.yaml") and "/" not in study.study_name
    old = dataclasses.replace(config, storage=str(tmp_path / "old.journal"))
    named = study_module.study_name
    legacy = {"legacy_target": legacy_target, "legacy_task": legacy_task}
    monkeypatch.setattr(study_module, "study_name", lambda *a, **k: named(*a, **{**k, **legacy}))
    _, study = prepare(old)
    assert study.study_name.endswith(f"-{'npz' if legacy_task else 'd.npz'}-{'profiles/' * legacy_target}my.yaml")
    monkeypatch.setattr(study_module, "study_name", named)
    _, resumed = prepare(dataclasses.replace(old, trials=2))
    assert resumed.study_name == study.study_name


@pytest.mark.slow
def test_a_budget_tightened_on_resume_applies_to_the_trials_trained_before(tmp_path, capsys, monkeypatch):
    """A resume with a tighter --max-latency-ms used to warn that "the report uses the new ones"
    while the table, the report and ``nas export --pick accuracy`` still judged each trial by the
    constraints stored when it finished: the costliest front trial stayed on the front and was
    exported. Now it is off the front, not picked, and shown as over budget everywhere."""
    from nas.results.pareto import front
    from nas.search.storage import open_storage

    space, storage = write_space(tmp_path), str(tmp_path / "t.journal")
    search = ["search", "--space", str(space), "--trials", "4", "--storage", storage, "--study", "t", "--device", "cpu"]
    assert main(search) == 0

    study = optuna.load_study(study_name="t", storage=open_storage(storage))
    before = front(study, 0.0)
    costliest = max(before, key=lambda r: r.latency_ms)
    budget = costliest.latency_ms * 0.999
    trained = [r for r in records(study, (TrialState.COMPLETE,)) if r.trained]
    assert any(r.latency_ms <= budget for r in trained), "the test needs a trial within the budget"
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "300")  # a table row on one line

    assert main([*search, "--max-latency-ms", f"{budget:.9g}"]) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="t", storage=open_storage(storage))
    over = {r.number for r in records(study, (TrialState.COMPLETE,)) if r.trained and r.latency_ms > budget}
    assert costliest.number in over
    for epsilon in (None, 0.0):  # the displayed front, and the plain one
        now = front(study, epsilon)
        assert now and not {r.number for r in now} & over
    assert "over the study's current budgets" in out  # the final table says why they are gone
    table = out[out.index("Pareto front of t") :]
    listed = re.search(rf"│\s+★?\s*{costliest.number}\s+│[^│]*│", table)  # a baseline is, below the line
    assert listed is None or f"{costliest.baseline}, over budget" in listed.group()

    report = tmp_path / "r.html"
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(report)]) == 0
    page = report.read_text()
    rows = re.findall(r"<tr><td>(\d+)</td>.*?<td>([^<]*)</td></tr>", page[page.index("id='front-table'") :])
    notes = {int(n): html.unescape(note) for n, note in rows}
    assert rows and (costliest.number not in notes or "over the study's budget" in notes[costliest.number])
    assert "over budget (set after it was trained)" in page  # the 2-D front's legend

    out_dir = str(tmp_path / "e")
    assert main(["export", "--study", "t", "--storage", storage, "--pick", "accuracy", "--out", out_dir]) == 0
    exported = json.loads((tmp_path / "e" / "arch.json").read_text())
    assert exported["trial"] not in over
