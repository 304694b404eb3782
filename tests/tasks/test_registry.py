"""Registry: spec parsing, config round trips, and one contract run over every registered task."""

import json

import numpy as np
import pytest
import torch

from nas.tasks import (
    IGNORE_INDEX,
    Task,
    TaskError,
    in_context_recall,
    list_tasks,
    load_task,
    mqar,
    selective_copying,
    task_file,
    task_from_config,
)

SMALL = {
    "mqar": "vocab_size=32,seq_len=32,num_kv_pairs=4,n_train=40,n_test=12",
    "mqar_long": "seq_len=1024,num_kv_pairs=64,n_train=6,n_test=3",
    "mad_recall": "seq_len=32,n_train=40,n_test=12",
    "mad_noisy_recall": "seq_len=32,n_train=40,n_test=12",
    "mad_selective_copy": "seq_len=40,num_tokens_to_copy=5,n_train=40,n_test=12",
}


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    npz = tmp_path / "data.npz"
    with open(npz, "wb") as f:
        np.savez(f, x=rng.integers(0, 9, size=(30, 7)), y=rng.integers(0, 4, size=30))
    txt = tmp_path / "corpus.txt"
    txt.write_text("abcdefghij" * 20)
    return {"npz": f"path={npz}", "text": f"path={txt},seq_len=16"}


def test_list_tasks():
    assert list_tasks() == sorted(list_tasks())
    assert set(list_tasks()) == set(SMALL) | {"npz", "text"}


@pytest.mark.parametrize("name", sorted(SMALL) + ["npz", "text"])
def test_contract_and_config_round_trip(name, files):
    """Every task: tensors in range, something scored, config survives JSON and rebuilds it exactly."""
    task = load_task(f"{name}:{(SMALL | files)[name]}", seed=7)
    assert isinstance(task, Task) and task.name == name == task.config["name"] and task.config["seed"] == 7
    for x, y in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        assert x.dtype == y.dtype == torch.int32 and x.ndim == 2 and x.shape[1] == task.seq_len
        assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
        scored = y[y != IGNORE_INDEX]
        assert scored.numel() > 0 and int(scored.min()) >= 0 and int(scored.max()) < task.n_out
        assert y.shape == (x.shape if task.readout == "token" else x.shape[:1])
    again = task_from_config(json.loads(json.dumps(task.config)))
    assert again.config == task.config
    for k in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(task, k), getattr(again, k)), k


def test_spec_matches_direct_call_and_parses_types():
    via_spec = load_task(" mqar : vocab_size=32, seq_len=32 ,num_kv_pairs=4,power_a=1,n_train=1e1,n_test=4 ", seed=2)
    direct = mqar(seed=2, vocab_size=32, seq_len=32, num_kv_pairs=4, power_a=1.0, n_train=10, n_test=4)
    assert torch.equal(via_spec.x_train, direct.x_train) and via_spec.config == direct.config
    assert isinstance(via_spec.config["power_a"], float) and isinstance(via_spec.config["n_train"], int)
    single = load_task("mad_recall:multi_query=False,seq_len=16,n_train=2,n_test=2")
    assert single.config["multi_query"] is False and single.seq_len == 16
    assert load_task("mad_recall:multi_query=TRUE,seq_len=16,n_train=2,n_test=2").seq_len == 15


def test_seed_in_spec_overrides_argument():
    a = load_task("mad_selective_copy:seed=3,seq_len=20,num_tokens_to_copy=3,n_train=5,n_test=5", seed=9)
    b = selective_copying(seed=3, seq_len=20, num_tokens_to_copy=3, n_train=5, n_test=5)
    assert a.config["seed"] == 3 and torch.equal(a.x_test, b.x_test)


def test_path_specs(files, tmp_path):
    npz = files["npz"].removeprefix("path=")
    assert load_task(npz).config["test_frac"] == 0.1
    assert len(load_task(f"{npz}:test_frac=0.5").x_test) == 15
    assert load_task(f"{tmp_path / 'corpus.txt'}:seq_len=8").seq_len == 8
    with pytest.raises(TaskError, match="path is given twice"):
        load_task(f"{npz}:path=other.npz")


def test_a_path_with_commas_and_colons_is_given_as_path(files, tmp_path):
    """``npz:path=`` is how a path holding ':' is given; a ',' inside it was read as the next
    parameter ("expected key=value, got 'name.npz'"), so no such file could be named."""
    import shutil

    from nas.search.study import SearchConfig, study_name
    from nas.space import load_space

    odd = tmp_path / "a:b" / "comma,name.npz"
    odd.parent.mkdir()
    shutil.copy(files["npz"].removeprefix("path="), odd)
    for spec in (f"npz:path={odd}", f"npz:path={odd},test_frac=0.5", f"npz:test_frac=0.5,path={odd},"):
        task = load_task(spec)
        assert task.config["path"] == str(odd), spec
    assert task_file(f"npz:path={odd},seed=3") == str(odd)
    # empty pieces inside the path are part of it (skipped, "a,,b" read the file a,b); a trailing
    # comma after it separates nothing
    assert [task_file(f"npz:path={p}") for p in ("a,,b.npz", "a, ,b.npz", "a.npz,", "a.npz, ")] == [
        "a,,b.npz",
        "a, ,b.npz",
        "a.npz",
        "a.npz",
    ]
    assert len(load_task(f"npz:test_frac=0.5,path={odd}").x_test) == 15
    # the default study name takes the file's name: every file given this way was "…-npz-…"
    space = load_space("hybrid_tiny")
    assert study_name(SearchConfig(), space, f"npz:path={odd}") == "hybrid_tiny-comma,name.npz-auto"
    assert study_name(SearchConfig(), space, f"npz:path={odd}", legacy_task=True) == "hybrid_tiny-npz-auto"


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("transformer", "unknown task 'transformer'; known: mad_noisy_recall, mad_recall"),
        ("data.csv", "unknown task 'data.csv'"),
        ("", "names no task"),
        (":seq_len=4", "names no task"),
        (
            "mqar:heads=4",
            "unknown parameter(s) heads; allowed: curriculum_frac, curriculum_len, n_test, n_train, "
            "num_kv_pairs, power_a, random_non_queries, seed, seq_len, short_frac",
        ),
        ("mqar:vocab_size=1.5", "vocab_size='1.5' is not an int"),
        ("mqar:vocab_size=lots", "vocab_size='lots' is not an int"),
        ("mqar:power_a=low", "power_a='low' is not a float"),
        ("mad_recall:multi_query=yes", "multi_query='yes' is not true/false"),
        ("mqar:vocab_size", "expected key=value, got 'vocab_size'"),
        ("mqar:=3", "expected key=value"),
        ("mqar:seq_len=8,seq_len=16", "'seq_len' given twice"),
        ("npz", "npz: missing parameter(s) path"),
        ("mqar:num_kv_pairs=100", "too few keys"),
        ("nowhere/missing.npz", "nowhere/missing.npz: no such file"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_bad_specs_are_one_line_task_errors(spec, needle):
    with pytest.raises(TaskError) as err:
        load_task(spec)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"seed": 0}, "with a 'name'"),
        ("mqar", "with a 'name'"),
        ({"name": "mqar", "colour": "red"}, "unknown parameter(s) colour"),
        ({"name": "mqar", "vocab_size": True}, "vocab_size=True is not an int"),
        ({"name": "mqar", "vocab_size": 64.5}, "is not an int"),
        ({"name": "mad_recall", "multi_query": 1}, "multi_query=1 is not true/false"),
        ({"name": "npz", "path": 3}, "path=3 is not a string"),
    ],
    ids=["no-name", "not-a-dict", "unknown", "bool-for-int", "fraction", "int-for-bool", "int-for-path"],
)
def test_bad_configs(config, needle):
    with pytest.raises(TaskError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        task_from_config(config)


def test_config_defaults_are_filled_in():
    cfg = in_context_recall(n_train=2, n_test=2, seq_len=8).config
    assert cfg == dict(
        name="mad_recall",
        seed=0,
        vocab_size=16,
        seq_len=8,
        multi_query=True,
        train_all_tokens=True,
        n_train=2,
        n_test=2,
    )
