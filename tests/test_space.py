"""Search spaces: every shipped file loads and samples only what it declares; every user mistake is
one SpaceError line naming the file and the field."""

from __future__ import annotations

import copy
import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
import yaml

import search_spaces
from nas.space import Choice, SearchSpace, SpaceError, list_spaces, load_space, parse_space_text
from nas.spec import PRECISION_FIELDS, ArchSpec, Candidate, LayerSpec, TrainSpec, arch_hash, training_seed
from nas.tasks import Task, load_task

optuna.logging.set_verbosity(optuna.logging.WARNING)

SHIPPED = Path(search_spaces.__file__).parent
N_TRIALS = 50


def stub_task(vocab: int = 37, n_out: int = 37, readout: str = "token") -> Task:
    """sample() reads only the task's sizes: no need to generate (possibly Zoology-sized) data."""
    x = torch.zeros(1, 4, dtype=torch.long)
    return Task("stub", {}, vocab, n_out, readout, x, x, x, x)


def within(choice: Choice, value: Any) -> bool:
    if choice.choices is not None:
        return value in choice.choices
    if not choice.low <= value <= choice.high:
        return False
    if choice.is_int:
        return isinstance(value, int) and (value - choice.low) % (choice.step or 1) == 0
    return True


def check_candidate(space: SearchSpace, cand: Candidate, params: dict[str, Any], task: Task) -> set[str]:
    """Assert ``cand`` is inside ``space`` and ``params`` holds exactly the parameters it should;
    returns the mixers seen (so callers can check the conditionals were exercised)."""
    arch, tr = cand.arch, cand.train
    assert (arch.vocab_size, arch.n_out, arch.readout) == (task.vocab_size, task.n_out, task.readout)
    assert within(space.depth, arch.depth) and within(space.d_model, arch.d_model)
    expected: dict[str, Any] = {"depth": arch.depth, "d_model": arch.d_model}
    for i, layer in enumerate(arch.layers):
        drawn = ["mixer", "mlp_ratio", "activation", "norm"]
        if layer.mixer != "none":
            drawn += ["heads", "short_conv"]
        if layer.mixer == "linear_attention":
            drawn.append("feature_map")
        for field in drawn:
            if field in space.layer:
                value = getattr(layer, field)
                assert within(space.layer[field], value), f"layer{i}.{field}={value!r} not in {space.layer[field]}"
                expected[f"layer{i}.{field}"] = value
        for field, allowed in PRECISION_FIELDS.items():  # drawn where the layer stores what it is about
            if layer.stores(field) and field in space.layer:
                assert within(space.layer[field], getattr(layer, field))
                expected[f"layer{i}.{field}"] = getattr(layer, field)
            elif field not in space.precision:
                assert getattr(layer, field) == allowed[0]  # never drawn: the default
        if layer.mixer == "none":
            assert layer.heads == 0 and layer.short_conv == 0 and layer.feature_map is None
    for field, choice in space.precision.items():  # study-wide: one draw, every layer that stores it
        holders = [getattr(la, field) for la in arch.layers if la.stores(field)]
        if holders:
            assert len(set(holders)) == 1 and within(choice, holders[0])
            expected[f"precision.{field}"] = holders[0]
    for field, choice in space.train.items():
        if field in ("momentum", "nesterov") and tr.optimizer != "sgd":
            continue
        assert within(choice, getattr(tr, field)), f"train.{field}={getattr(tr, field)!r} not in {choice}"
        expected[f"train.{field}"] = getattr(tr, field)
    # a field with one choice is fixed, not a searched parameter
    fixed = {
        name for name in expected if _choice(space, name).choices is not None and len(_choice(space, name).choices) == 1
    }
    assert params == {k: v for k, v in expected.items() if k not in fixed}
    return {layer.mixer for layer in arch.layers}


def _choice(space: SearchSpace, name: str) -> Choice:
    if name in ("depth", "d_model"):
        return getattr(space, name)
    section, field = name.split(".")
    if section == "precision":
        return space.precision[field]
    return space.train[field] if section == "train" else space.layer[field]


def sample_many(space: SearchSpace, task: Task, n: int = N_TRIALS, seed: int = 0) -> set[str]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    mixers: set[str] = set()
    optimizers: set[str] = set()
    for _ in range(n):
        trial = study.ask()
        cand = space.sample(trial, task)
        mixers |= check_candidate(space, cand, trial.params, task)
        optimizers.add(cand.train.optimizer)
        # the training seed is the configuration's (study seed 0 here), whatever the trial number
        recipe = dataclasses.replace(cand.train, seed=0)
        assert cand.train.seed == training_seed(0, cand.arch, recipe)
        assert (cand.train.seeds, cand.train.lr_multipliers) == (space.seeds, space.lr_multipliers)
        study.tell(trial, 0.0)
    return mixers | optimizers


# ---------------------------------------------------------------- shipped spaces


def test_shipped_spaces_are_listed():
    names = list_spaces()
    assert names == sorted(p.stem for p in SHIPPED.glob("*.yaml"))
    assert {"hybrid_tiny", "hybrid_small", "hybrid_mqar", "hybrid_long"} <= set(names)


@pytest.mark.parametrize("name", list_spaces())
def test_shipped_space_loads_and_samples_inside_itself(name):
    space = load_space(name)
    assert space.source == str(SHIPPED / f"{name}.yaml") and space.name == name and space.description
    assert re.fullmatch(r"[a-z_]+(:.+)?", space.task)
    seen = sample_many(space, stub_task())
    declared = set(space.layer["mixer"].values()) | set(space.train["optimizer"].values())
    assert seen == declared, "50 random trials should reach every mixer and optimizer"


def test_long_space_reaches_hybrids_and_head_dims_16_to_64():
    """hybrid_long: a 3:1 linear:attention stack is a point of the space (drawn through Optuna as a
    trial would be), every width/head pair gives a head dim in 16-64, and its task trains through
    a length curriculum."""
    from nas.tasks import load_task

    space = load_space("hybrid_long")
    assert space.task.split(":")[0] == "mqar_long" and "curriculum_len=64" in space.task and space.max_train_seconds
    task = load_task(space.task.replace("n_train=20000", "n_train=40").replace("n_test=512", "n_test=4"))
    assert task.seq_len == 256 and task.x_stage1.shape[1] == 64 and task.stage1_frac == 0.7
    dims = {d // h for d in space.d_model.values() for h in space.layer["heads"].values()}
    assert min(dims) == 16 and max(dims) == 64
    assert set(space.layer["feature_map"].values()) == {"identity", "elu+1", "relu"}
    stack = ("linear_attention",) * 3 + ("attention",)
    params = {"depth": 4, "d_model": 128, "train.optimizer": "adamw", "train.lr": 1e-3}
    for i, mixer in enumerate(stack):
        params |= {f"layer{i}.mixer": mixer, f"layer{i}.mlp_ratio": 2, f"layer{i}.heads": 2}
        params |= {f"layer{i}.activation": "gelu", f"layer{i}.norm": "rmsnorm", f"layer{i}.short_conv": 4}
        params |= {f"layer{i}.feature_map": "elu+1"} if mixer == "linear_attention" else {}
    params |= {f"train.{f}": space.train[f].values()[0] for f in ("weight_decay", "warmup_frac", "steps")}
    cand = space.sample(optuna.trial.FixedTrial(params), stub_task(vocab=128, n_out=128))
    assert tuple(layer.mixer for layer in cand.arch.layers) == stack and cand.arch.d_model == 128


@pytest.mark.parametrize("readout", ["token", "last"])
def test_sampled_arch_is_sized_for_the_task(readout):
    task = stub_task(vocab=11, n_out=3, readout=readout)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    cand = load_space("hybrid_tiny").sample(study.ask(), task)
    assert (cand.arch.vocab_size, cand.arch.n_out, cand.arch.readout) == (11, 3, readout)


# ---------------------------------------------------------------- user files

RANGES = """\
name: ranges
depth: {low: 1, high: 6, step: 1}
d_model: [24, 48]
layer:
  mixer: [attention, linear_attention, none]
  heads: [1, 2, 3, 6]
  feature_map: [relu]
  short_conv: {low: 0, high: 8, step: 2}
  mlp_ratio: {low: 0.0, high: 4.0, step: 0.5}
train:
  optimizer: [sgd, lion]
  lr: {low: 1.0e-4, high: 1.0, log: true}
  weight_decay: {low: 0.0, high: 0.2}
  warmup_frac: {low: 0.0, high: 0.5}
  steps: {low: 10, high: 1000, log: true}
  batch_size: [8]
  momentum: {low: 0.5, high: 0.99}
  nesterov: [false, true]
"""

# nine levels of an anchor listing the previous one nine times: 9^8 values once expanded
LAUGHS = (
    "[&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    + "".join(f", &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9))
    + "]"
)


def test_user_yaml_with_ranges_samples_inside_them(tmp_path):
    path = tmp_path / "ranges.yml"
    path.write_text(RANGES)
    space = load_space(path)
    assert space.source == str(path) and space.task == "mqar" and space.max_train_seconds is None
    assert space.layer["short_conv"].is_int and not space.layer["mlp_ratio"].is_int
    assert sample_many(space, stub_task(), seed=3) == {"attention", "linear_attention", "none", "sgd", "lion"}


def test_exponent_without_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 1e-3 as a string; users write it that way, so the loader takes it as 0.001
    path = tmp_path / "exp.yaml"
    path.write_text(
        RANGES.replace(
            next(line for line in RANGES.splitlines() if line.strip().startswith("lr:")),
            "  lr: {low: 1e-4, high: 1e-2, log: true}",
        )
    )
    lr = load_space(path).train["lr"]
    assert (lr.low, lr.high, lr.log) == (1e-4, 1e-2, True)


def test_user_copy_of_a_shipped_space_loads_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    shutil.copy(SHIPPED / "hybrid_tiny.yaml", path)
    for ref in (path, str(path)):
        assert load_space(ref).d_model == load_space("hybrid_tiny").d_model
    bare = tmp_path / "no_suffix"
    shutil.copy(path, bare)
    assert load_space(str(bare)).source == str(bare)  # an existing file needs no suffix


# ---------------------------------------------------------------- user mistakes

BASE: dict[str, Any] = yaml.safe_load(RANGES)


def edit(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must be there) replaced: for what a mapping cannot express
    (YAML's .nan and .inf, a key given twice)."""
    assert old in text, old
    return text.replace(old, new)


def mutate(edit) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    edit(raw)
    return raw


def drop(section: str | None, field: str):
    def edit(raw):
        (raw[section] if section else raw).pop(field)

    return edit


def put(section: str | None, field: str, value: Any):
    def edit(raw):
        (raw[section] if section else raw)[field] = value

    return edit


MISTAKES = [
    # (id, file text or mutated mapping, what the message must name)
    ("invalid-yaml", "depth: [1, 2\nd_model: [16]\n", ["invalid YAML", "line"]),
    ("tab-indent", "layer:\n\tmixer: [none]\n", ["invalid YAML", "line 2"]),
    ("not-a-mapping", "- depth\n- d_model\n", ["mapping"]),
    ("empty-file", "", ["mapping"]),
    ("unknown-top-field", mutate(put(None, "widths", [16])), ["widths", "unknown field"]),
    ("unknown-layer-field", mutate(put("layer", "hedas", [2])), ["layer.hedas", "unknown field"]),
    ("unknown-train-field", mutate(put("train", "lr_decay", [0.1])), ["train.lr_decay", "unknown field"]),
    ("unknown-mixer", mutate(put("layer", "mixer", ["attention", "mamba"])), ["layer.mixer", "'mamba'", "attention"]),
    ("unknown-optimizer", mutate(put("train", "optimizer", ["adam"])), ["train.optimizer", "'adam'", "adamw"]),
    ("unknown-norm", mutate(put("layer", "norm", "batchnorm")), ["layer.norm", "'batchnorm'"]),
    ("empty-list", mutate(put("layer", "activation", [])), ["layer.activation", "empty"]),
    ("empty-range", mutate(put("train", "lr", {"low": 0.1, "high": 0.01})), ["train.lr", "empty range"]),
    ("empty-int-range", mutate(put(None, "depth", {"low": 4, "high": 2})), ["depth", "empty range"]),
    (
        "log-low-zero",
        mutate(put("train", "weight_decay", {"low": 0.0, "high": 0.1, "log": True})),
        ["train.weight_decay", "log"],
    ),
    ("negative-low", mutate(put("train", "lr", {"low": -1.0, "high": 0.1, "log": True})), ["train.lr", "(0, 1000000]"]),
    ("range-bad-key", mutate(put("train", "lr", {"low": 0.1, "hi": 1.0})), ["train.lr", "'high'"]),
    ("range-for-categorical", mutate(put("layer", "mixer", {"low": 0, "high": 1})), ["layer.mixer", "list"]),
    ("heads-not-dividing", mutate(put("layer", "heads", [1, 5])), ["layer.heads", "5", "d_model=24"]),
    ("heads-range", mutate(put("layer", "heads", {"low": 1, "high": 2})), ["layer.heads"]),
    ("missing-depth", mutate(drop(None, "depth")), ["depth", "required"]),
    ("missing-mixer", mutate(drop("layer", "mixer")), ["layer.mixer", "required"]),
    ("missing-steps", mutate(drop("train", "steps")), ["train.steps", "required"]),
    ("missing-feature-map", mutate(drop("layer", "feature_map")), ["layer.feature_map", "required"]),
    ("warmup-one", mutate(put("train", "warmup_frac", [0.0, 1.0])), ["train.warmup_frac", "[0, 1)"]),
    ("warmup-range-past-one", mutate(put("train", "warmup_frac", {"low": 0.5, "high": 1.5})), ["train.warmup_frac"]),
    ("lr-not-numeric", mutate(put("train", "lr", "fast")), ["train.lr", "'fast'", "not a number"]),
    ("lr-bool", mutate(put("train", "lr", True)), ["train.lr", "not a number"]),
    ("lr-zero", mutate(put("train", "lr", [0.0, 0.1])), ["train.lr", "(0, 1000000]"]),
    # past 1e6 Adam's fp32 step scalar overflowed: a traceback, and a trial left RUNNING
    ("lr-overflowing", mutate(put("train", "lr", [1.0e-3, 1.0e38])), ["train.lr", "1e+38", "(0, 1000000]"]),
    ("steps-not-int", mutate(put("train", "steps", [1.5])), ["train.steps", "integer"]),
    # YAML 1.1 read 1:30 as the base-60 number 90: 90 steps, silently
    (
        "steps-base-60",
        edit(RANGES, "steps: {low: 10, high: 1000, log: true}", "steps: [1:30]"),
        ["train.steps", "'1:30'"],
    ),
    ("nesterov-not-bool", mutate(put("train", "nesterov", ["yes please"])), ["train.nesterov", "true/false"]),
    ("duplicate-choice", mutate(put("layer", "norm", ["rmsnorm", "rmsnorm"])), ["layer.norm", "duplicate"]),
    ("short-conv-too-wide", mutate(put("layer", "short_conv", [4, 17])), ["layer.short_conv", "16"]),
    ("d-model-range", mutate(put(None, "d_model", {"low": 16, "high": 64})), ["d_model", "list"]),
    ("depth-zero", mutate(put(None, "depth", [0, 1])), ["depth", "[1, 128]"]),
    ("max-seconds-negative", mutate(put(None, "max_train_seconds", -5)), ["max_train_seconds", "positive"]),
    ("layer-not-mapping", mutate(put(None, "layer", ["attention"])), ["layer", "mapping"]),
    # --- the file itself
    ("not-utf8", b"\xff\xfe\x00bad", ["not UTF-8", "0xff", "offset 0"]),
    ("control-character", "depth: [1]\x00\n", ["invalid YAML", "line 1", "#x0000"]),
    ("nested-too-deeply", "[" * 20000, ["invalid YAML", "nested too deeply"]),
    # a "billion laughs" in a field the space checks: 533 bytes took 2.4 GB to quote in the message
    (
        "aliases-expanding-past-the-limit",
        RANGES.replace("  mixer: [", "  mixer: [" + LAUGHS + ", "),
        ["invalid YAML", "aliases expand to more than 100,000 values"],
    ),
    ("alias-inside-itself", RANGES.replace("  mixer: [", "  mixer: [&me [*me], "), ["invalid YAML", "its own anchor"]),
    ("larger-than-1mib", "# " + "x" * (1 << 20) + "\n" + RANGES, ["larger than 1 MiB"]),
    ("duplicate-top-key", RANGES + "depth: [2]\n", ["depth", "given twice", "lines 2 and 19"]),
    ("duplicate-nested-key", edit(RANGES, "  batch_size: [8]\n", "  batch_size: [8]\n  lr: [0.1]\n"), ["lr", "twice"]),
    # --- integer fields take integers only, inside their limits
    (
        "int-overflowing-float",
        edit(RANGES, "d_model: [24, 48]", "d_model: [1.0e400]"),
        ["d_model", "'1.0e400'", "not an integer"],
    ),
    ("int-overflowing-yaml-float", edit(RANGES, "d_model: [24, 48]", "d_model: [1.0e+400]"), ["d_model", "inf"]),
    ("int-float", mutate(put(None, "d_model", [24.0, 48])), ["d_model", "24.0", "not an integer"]),
    ("int-bool", mutate(put(None, "depth", [True])), ["depth", "True", "not an integer"]),
    ("int-range-inf", edit(RANGES, "{low: 1, high: 6, step: 1}", "{low: 1, high: .inf}"), ["depth", "integer"]),
    ("int-range-float-step", mutate(put(None, "depth", {"low": 1, "high": 4, "step": 0.5})), ["depth.step", "integer"]),
    ("d-model-too-wide", mutate(put(None, "d_model", [24, 1048576])), ["d_model", "1048576", "[1, 16384]"]),
    ("depth-too-deep", mutate(put(None, "depth", {"low": 1, "high": 1000000})), ["depth", "1000000", "[1, 128]"]),
    ("heads-too-many", mutate(put("layer", "heads", [1, 2048])), ["layer.heads", "2048", "[1, 1024]"]),
    ("heads-zero", mutate(put("layer", "heads", [0, 1])), ["layer.heads", "[1, 1024]"]),
    ("mlp-ratio-too-big", mutate(put("layer", "mlp_ratio", [2, 64])), ["layer.mlp_ratio", "64", "[0, 16]"]),
    ("steps-too-many", mutate(put("train", "steps", {"low": 10, "high": 10**7})), ["train.steps", "[1, 1000000]"]),
    ("batch-too-big", mutate(put("train", "batch_size", [1 << 21])), ["train.batch_size", "[1, 1048576]"]),
    # --- float fields take finite numbers only, inside their limits
    ("mlp-ratio-nan", edit(RANGES, "{low: 0.0, high: 4.0, step: 0.5}", "[.nan]"), ["layer.mlp_ratio", "finite"]),
    ("mlp-ratio-overflowing", edit(RANGES, "{low: 0.0, high: 4.0, step: 0.5}", "[1.0e400]"), ["mlp_ratio", "finite"]),
    ("lr-nan", edit(RANGES, "{low: 1.0e-4, high: 1.0, log: true}", "[.nan]"), ["train.lr", "nan", "finite"]),
    ("lr-nan-word", edit(RANGES, "{low: 1.0e-4, high: 1.0, log: true}", "[nan]"), ["train.lr", "finite"]),
    ("lr-inf", edit(RANGES, "{low: 1.0e-4, high: 1.0, log: true}", "[.inf]"), ["train.lr", "inf", "finite"]),
    ("lr-range-nan", edit(RANGES, "{low: 1.0e-4, high: 1.0, log: true}", "{low: .nan, high: 1.0}"), ["train.lr"]),
    ("lr-range-inf", edit(RANGES, "high: 1.0, log: true}", "high: .inf, log: true}"), ["train.lr", "finite"]),
    ("float-step-nan", edit(RANGES, "step: 0.5}", "step: .nan}"), ["layer.mlp_ratio.step", "finite"]),
    ("momentum-two", mutate(put("train", "momentum", [2.0])), ["train.momentum", "2.0", "[0, 1)"]),
    ("momentum-one", mutate(put("train", "momentum", {"low": 0.5, "high": 1.0})), ["train.momentum", "[0, 1)"]),
    ("weight-decay-too-big", mutate(put("train", "weight_decay", [100.0])), ["train.weight_decay", "[0, 10]"]),
    ("weight-decay-negative", mutate(put("train", "weight_decay", [-0.1])), ["train.weight_decay", "[0, 10]"]),
    ("grad-clip-inf", edit(RANGES, "  batch_size: [8]\n", "  batch_size: [8]\n  grad_clip: [.inf]\n"), ["grad_clip"]),
    ("grad-noise-negative", mutate(put("train", "grad_noise", [-0.01])), ["train.grad_noise", ">= 0"]),
    (
        "nesterov-without-momentum",
        mutate(put("train", "momentum", {"low": 0.0, "high": 0.9})),
        ["train.nesterov", "momentum > 0"],
    ),
    (
        "max-seconds-nan",
        edit(RANGES, "name: ranges\n", "name: ranges\nmax_train_seconds: .nan\n"),
        ["max_train_seconds"],
    ),
    ("max-seconds-inf", mutate(put(None, "max_train_seconds", float("inf"))), ["max_train_seconds", "finite"]),
    ("max-seconds-bool", mutate(put(None, "max_train_seconds", True)), ["max_train_seconds", "not a number"]),
    # --- booleans are YAML booleans; strings are strings
    ("log-not-bool", edit(RANGES, "high: 1.0, log: true}", "high: 1.0, log: maybe}"), ["train.lr", "log", "'maybe'"]),
    ("log-number", mutate(put("train", "lr", {"low": 1e-4, "high": 1.0, "log": 1})), ["train.lr", "log", "1"]),
    ("name-list", mutate(put(None, "name", ["a", "b"])), ["name", "['a', 'b']", "letters, digits"]),
    ("name-empty", mutate(put(None, "name", "")), ["name", "''"]),
    ("name-path", mutate(put(None, "name", "../x")), ["name", "'../x'"]),
    ("name-with-space", mutate(put(None, "name", "my space")), ["name", "'my space'"]),
    ("name-like-a-flag", mutate(put(None, "name", "--help")), ["name", "'--help'"]),
    ("name-too-long", mutate(put(None, "name", "n" * 101)), ["name", "1-100"]),
    ("description-list", mutate(put(None, "description", ["a"])), ["description", "a string"]),
    ("task-blank", mutate(put(None, "task", "  ")), ["task", "task spec"]),
    ("task-number", mutate(put(None, "task", 3)), ["task", "task spec"]),
    ("field-without-value", mutate(put("layer", "heads", None)), ["layer.heads", "no value"]),
    ("python-tag", "depth: !!python/object/apply:os.getcwd []\n", ["invalid YAML", "python/object"]),
    ("unknown-keys-of-two-kinds", mutate(lambda raw: raw["train"].update({1: [2], "zz": [3]})), ["train.1", "unknown"]),
    # --- the population each candidate trains as: fixed settings, not choices
    ("seeds-zero", mutate(put("train", "seeds", 0)), ["train.seeds", "[1, 16]"]),
    ("seeds-a-choice", mutate(put("train", "seeds", [1, 2])), ["train.seeds", "not a choice"]),
    ("seeds-bool", mutate(put("train", "seeds", True)), ["train.seeds", "True"]),
    ("seeds-too-many", mutate(put("train", "seeds", 17)), ["train.seeds", "17"]),
    ("lr-multipliers-empty", mutate(put("train", "lr_multipliers", [])), ["train.lr_multipliers", "distinct"]),
    ("lr-multipliers-scalar", mutate(put("train", "lr_multipliers", 2)), ["train.lr_multipliers", "list"]),
    ("lr-multipliers-zero", mutate(put("train", "lr_multipliers", [0, 1])), ["train.lr_multipliers", "0 must"]),
    ("lr-multipliers-repeat", mutate(put("train", "lr_multipliers", [1, 1])), ["train.lr_multipliers", "distinct"]),
    ("lr-multipliers-text", mutate(put("train", "lr_multipliers", ["x"])), ["train.lr_multipliers", "'x'"]),
    ("lr-multipliers-nine", mutate(put("train", "lr_multipliers", list(range(1, 10)))), ["train.lr_multipliers"]),
]


def test_the_population_fields_reach_every_candidate(tmp_path):
    """train.seeds and train.lr_multipliers are fixed settings every sampled recipe carries; a space
    without them trains the default population; 1 x [1] is a single run."""
    from nas.space import DEFAULT_LR_MULTIPLIERS, DEFAULT_SEEDS

    path = tmp_path / "pop.yaml"
    path.write_text(yaml.safe_dump(mutate(lambda raw: raw["train"].update(seeds=3, lr_multipliers=[0.25, 4]))))
    space = load_space(path)
    task = load_task(space.task)
    cand = space.sample(optuna.create_study().ask(), task)
    assert (cand.train.seeds, cand.train.lr_multipliers, cand.train.population) == (3, (0.25, 4.0), 6)
    path.write_text(yaml.safe_dump(BASE))
    default = load_space(path)
    assert (default.seeds, default.lr_multipliers) == (DEFAULT_SEEDS, DEFAULT_LR_MULTIPLIERS)


@pytest.mark.parametrize("content, names", [pytest.param(c, n, id=i) for i, c, n in MISTAKES])
def test_mistake_is_one_line_naming_file_and_field(tmp_path, content, names):
    path = tmp_path / "bad_space.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    with pytest.raises(SpaceError) as err:
        load_space(path)
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for name in names:
        assert name in msg, f"{name!r} missing from: {msg}"


def test_base_of_the_mistakes_is_valid(tmp_path):
    """Each mistake above is the one thing wrong with its file."""
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert isinstance(load_space(path), SearchSpace)


def test_every_limit_is_allowed_at_its_edge(tmp_path):
    """The limits refuse typos, not real spaces: a space at every closed end loads and samples."""
    path = tmp_path / "edges.yaml"
    path.write_text(
        edit(RANGES, "{low: 1, high: 6, step: 1}", "[1, 128]")
        .replace("d_model: [24, 48]", "d_model: [1024, 16384]")
        .replace("heads: [1, 2, 3, 6]", "heads: [1, 1024]")
        .replace("{low: 0, high: 8, step: 2}", "[0, 16]")
        .replace("{low: 0.0, high: 4.0, step: 0.5}", "[0, 16]")
        .replace("{low: 1.0e-4, high: 1.0, log: true}", "{low: 1.0e-4, high: 1.0e+6, log: true}")
        .replace("{low: 0.0, high: 0.2}", "[0, 10]")
        .replace("{low: 10, high: 1000, log: true}", "[1, 1000000]")
        .replace("batch_size: [8]", "batch_size: [1, 1048576]\n  grad_clip: [0, 1.0e+6]\n  grad_noise: [0, 100]")
        .replace("{low: 0.5, high: 0.99}", "{low: 0.5, high: 0.9999}")
    )
    space = load_space(path)
    assert space.depth.choices == (1, 128) and space.d_model.choices == (1024, 16384)
    assert space.layer["mlp_ratio"].choices == (0.0, 16.0) and space.train["lr"].high == 1e6
    assert sample_many(space, stub_task(), n=3)  # drawn through Optuna (nothing is built)


def test_limits_are_the_docs():
    """Each limit is documented in docs/spaces.md's space section, as the message states it."""
    from nas.space import LIMITS

    doc = (SHIPPED.parent / "docs" / "spaces.md").read_text()
    start = doc.index("## Search spaces are data")
    section = doc[start : doc.index("\n## ", start)]
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in section.splitlines() if "| `" in line
    }
    assert {field: str(bound).removeprefix("in ") for field, bound in LIMITS.items()} == rows


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    """Only a key written twice in one mapping is refused: a '<<' merge's keys may be overridden,
    as YAML defines."""
    path = tmp_path / "merge.yaml"
    path.write_text(edit(RANGES, "  batch_size: [8]\n", "  batch_size: [8]\n  <<: {grad_clip: [0.5], lr: [0.5]}\n"))
    space = load_space(path)
    assert space.train["lr"].low == 1e-4 and space.train["grad_clip"].choices == (0.5,)


def test_the_space_keeps_the_text_it_was_read_from(tmp_path):
    """What a study records (so workers rebuild the space) is the text that was validated, not a
    second read of the file; a recorded text without name: takes the recorded name unchecked."""
    path = tmp_path / "my space.yaml"  # a file name may hold a space: it was never a `name:`
    path.write_bytes(RANGES.replace("name: ranges\n", "").encode())
    space = load_space(path)
    assert space.text == path.read_text() and space.name == "my space"
    again = parse_space_text(space.text, "my space (as recorded in the study)", "my space")
    assert again.name == "my space" and again.train == space.train
    with pytest.raises(SpaceError, match=r"^my space \(as recorded in the study\): depth: given twice"):
        parse_space_text(space.text + "depth: [1]\n", "my space (as recorded in the study)", "my space")


def test_missing_file_names_it(tmp_path):
    for path in (tmp_path / "nope.yaml", tmp_path / "nope.yml"):
        with pytest.raises(SpaceError, match=re.escape(str(path)) + ".*no such") as err:
            load_space(path)
        assert "\n" not in str(err.value)


def test_unreadable_path_names_it(tmp_path):
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(SpaceError, match=re.escape(str(folder))):
        load_space(folder)


def test_unknown_shipped_name_lists_the_shipped_spaces():
    with pytest.raises(SpaceError) as err:
        load_space("hybrid_huge")
    msg = str(err.value)
    assert "'hybrid_huge'" in msg and "\n" not in msg
    for name in list_spaces():
        assert repr(name) in msg


@pytest.mark.parametrize(
    ("widths", "names"), [([24, 384], ["d_model=384", "head dim 384", "128"]), ([24, 18], ["d_model=18", "head dim 9"])]
)
def test_measuring_needs_even_head_dims_up_to_128(tmp_path, widths, names):
    """Such a space loads (``nas spaces`` shows it) but no search runs it: ``check_measurable``."""
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump(mutate(put(None, "d_model", widths))))
    space = load_space(path)
    with pytest.raises(SpaceError) as err:
        space.check_measurable()
    msg = str(err.value)
    assert "\n" not in msg and "layer.heads" in msg and all(n in msg for n in names), msg
    ok = tmp_path / "ranges.yaml"
    ok.write_text(RANGES)
    load_space(ok).check_measurable()  # head dims 4-48: all measurable


def test_shipped_spaces_are_measurable():
    for name in list_spaces():
        load_space(name).check_measurable()


def test_head_dim_rule_is_the_kernels(tmp_path):
    """The space asks the kernels' padded_head_dim: a head dim it refuses (odd, or above the
    largest supported) makes a measured space invalid, one it pads is fine."""
    from kernels._common import SUPPORTED_HEAD_DIMS, padded_head_dim

    top = max(SUPPORTED_HEAD_DIMS)
    assert padded_head_dim(top) == top and padded_head_dim(top + 2) is None and padded_head_dim(7) is None
    assert padded_head_dim(6) == min(SUPPORTED_HEAD_DIMS)
    for d, ok in ((2 * top, True), (4 * top, False), (14, False)):
        path = tmp_path / f"d{d}.yaml"
        path.write_text(
            RANGES.replace("d_model: [24, 48]", f"d_model: [{d}]").replace("heads: [1, 2, 3, 6]", "heads: [2]")
        )
        if ok:
            load_space(path).check_measurable()
        else:
            with pytest.raises(SpaceError, match="head dim"):
                load_space(path).check_measurable()


def test_the_documented_space_example_runs_as_written(tmp_path):
    """docs/spaces.md's space, copied into a file as a user would: it loads (it used to lack the
    required train.batch_size), documents max_train_seconds, and samples a candidate."""
    doc = (SHIPPED.parent / "docs" / "spaces.md").read_text()
    section = doc[doc.index("## Search spaces are data") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") : section.index("```\n", section.index("```yaml"))]
    path = tmp_path / "my_space.yaml"
    path.write_text(block)
    space = load_space(path)
    assert space.name == "my_space" and space.max_train_seconds == 60
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    assert isinstance(space.sample(study.ask(), stub_task()), Candidate)
    assert "`max_train_seconds`" in section.split("```")[2]  # and the text after the example explains it


SMALL_FINITE = """\
name: finite
task: mqar
depth: [1, 2]
d_model: [16]
layer:
  mixer: [attention, linear_attention, none]
  heads: [2]
  feature_map: [identity, relu]
  short_conv: [0, 3]
  mlp_ratio: [1.0]
train:
  optimizer: [sgd, adamw]
  lr: [0.01]
  momentum: [0.9, 0.5]
  steps: {low: 2, high: 6, step: 2}
  batch_size: [4]
"""


def test_configurations_counts_what_sampling_can_draw():
    """Every candidate ``sample`` can draw, enumerated by Optuna's brute-force sampler (which
    follows the conditional fields: heads and conv only for mixers, the feature map only for linear
    attention, momentum only for SGD): as many distinct ones as ``configurations`` says."""
    import optuna

    from nas.space import parse_space_text
    from nas.tasks import load_task

    space = parse_space_text(SMALL_FINITE, "finite.yaml")
    # per layer: attention 2 (conv), linear attention 4 (conv x map), none 1 = 7; depth 1 or 2: 7 + 49;
    # recipes: sgd 2 momenta x 3 step counts, adamw 3 = 9
    assert space.configurations() == 56 * 9
    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=16,n_test=8")
    seen = set()
    study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a line per trial otherwise
    try:
        study.optimize(lambda t: seen.add(repr(space.sample(t, task))) or 0.0, n_trials=2000)
    finally:
        optuna.logging.set_verbosity(verbosity)
    assert len(seen) == len(study.trials) == space.configurations()
    wider = parse_space_text(SMALL_FINITE.replace("lr: [0.01]", "lr: {low: 0.001, high: 0.01}"), "w.yaml")
    assert wider.configurations() is None  # a continuous range: unbounded


def test_a_search_asking_for_more_trials_than_the_space_holds_is_refused(tmp_path, capsys):
    from nas.cli import main

    one = tmp_path / "one.yaml"
    one.write_text(
        "name: one\ntask: mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=16,n_test=8\ndepth: [1]\n"
        "d_model: [16]\nlayer:\n  mixer: [attention]\n  heads: [2]\n  mlp_ratio: [1]\n"
        "train:\n  optimizer: [adamw]\n  lr: 0.01\n  steps: [2]\n  batch_size: [4]\n"
    )
    storage = tmp_path / "s.journal"
    assert main(["search", "--space", str(one), "--trials", "2", "--storage", str(storage)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 1 distinct configuration(s)" in err, err
    assert not storage.exists()


# ---------------------------------------------------------------- precision fields

PRECISION = """\
precision:
  kv_dtype: [bf16, fp8]
  state_dtype: [fp32, bf16]
  weight_dtype: [bf16, fp8]
"""


def test_a_precision_block_draws_one_dtype_per_candidate_for_the_layers_that_store_it(tmp_path):
    """precision: fields are study-wide choices: one Optuna parameter each (precision.kv_dtype),
    drawn only when some layer holds what it stores, and applied to every such layer."""
    path = tmp_path / "p.yaml"
    path.write_text(RANGES + PRECISION)
    space = load_space(path)
    assert set(space.precision) == set(PRECISION_FIELDS)
    seen = sample_many(space, stub_task(), n=60)  # check_candidate checks the parameters
    assert {"attention", "linear_attention", "none"} <= seen
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    narrower = set()
    for _ in range(60):
        arch = space.sample(study.ask(), stub_task()).arch
        narrower |= set(arch.precision_text().replace(",", "").split()[::2])
    assert narrower == {"kv", "state", "weights"}  # each field drawn narrower at least once


def test_precision_fields_under_layer_are_per_layer_choices(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        edit(RANGES, "  mlp_ratio:", "  kv_dtype: [bf16, fp8]\n  weight_dtype: [fp8]\n  mlp_ratio:")
        + "precision:\n  state_dtype: [fp32, bf16]\n"
    )
    space = load_space(path)
    assert set(space.precision) == {"state_dtype"} and {"kv_dtype", "weight_dtype"} <= set(space.layer)
    sample_many(space, stub_task(), n=40)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    kv = set()
    for _ in range(40):
        trial = study.ask()
        arch = space.sample(trial, stub_task()).arch
        attention = [la.kv_dtype for la in arch.layers if la.mixer == "attention"]
        kv.add(tuple(attention))
        # a fixed single choice is no parameter, and still applies to every layer with linears
        assert all(la.weight_dtype == "fp8" for la in arch.layers if la.stores("weight_dtype"))
        assert not any(k.endswith("weight_dtype") for k in trial.params)
    assert any(len(set(k)) == 2 for k in kv)  # two attention layers of one candidate at different dtypes


@pytest.mark.parametrize(
    "content, names",
    [
        pytest.param(
            RANGES + "precision:\n  kv_dtype: [bf16, fp4]\n",
            ["precision.kv_dtype", "'fp4'", "['bf16', 'fp8']"],
            id="unknown-kv-dtype",
        ),
        pytest.param(
            RANGES + "precision:\n  state_dtype: [fp8]\n",
            ["precision.state_dtype", "'fp8'", "['fp32', 'bf16']"],
            id="fp8-state",
        ),
        pytest.param(
            RANGES + "precision:\n  weight_dtype: [int4]\n",
            ["precision.weight_dtype", "'int4'"],
            id="unknown-weight-dtype",
        ),
        pytest.param(
            edit(RANGES, "  mlp_ratio:", "  kv_dtype: [e5m2]\n  mlp_ratio:"),
            ["layer.kv_dtype", "'e5m2'"],
            id="layer-dtype",
        ),
        pytest.param(
            RANGES + "precision:\n  kv_cache: [fp8]\n", ["precision.kv_cache", "unknown field"], id="unknown-field"
        ),
        pytest.param(RANGES + "precision: [fp8]\n", ["precision", "mapping"], id="not-a-mapping"),
        pytest.param(RANGES + "precision:\n", ["precision", "mapping"], id="no-value"),
        pytest.param(RANGES + "precision: {}\n", ["precision", "no field", "kv_dtype"], id="empty-block"),
        pytest.param(
            RANGES + "precision:\n  kv_dtype: {low: 1, high: 2}\n", ["precision.kv_dtype", "list"], id="range"
        ),
        pytest.param(RANGES + "precision:\n  kv_dtype: []\n", ["precision.kv_dtype", "empty"], id="empty"),
        pytest.param(
            edit(RANGES, "  mlp_ratio:", "  kv_dtype: [fp8]\n  mlp_ratio:") + "precision:\n  kv_dtype: [bf16]\n",
            ["layer.kv_dtype", "precision:", "once"],
            id="both-places",
        ),
        pytest.param(
            edit(RANGES, "mixer: [attention, linear_attention, none]", "mixer: [linear_attention, none]")
            + "precision:\n  kv_dtype: [bf16, fp8]\n",
            ["precision.kv_dtype", "no attention"],
            id="kv-without-attention",
        ),
        pytest.param(
            edit(
                edit(RANGES, "mixer: [attention, linear_attention, none]", "mixer: [none]"),
                "mlp_ratio: {low: 0.0, high: 4.0, step: 0.5}",
                "mlp_ratio: [0]",
            )
            + "precision:\n  weight_dtype: [fp8]\n",
            ["precision.weight_dtype", "no block", "mixer", "MLP"],
            id="weights-without-linear-layers",
        ),
    ],
)
def test_a_bad_precision_field_is_one_line_naming_it(tmp_path, content, names):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(SpaceError) as err:
        load_space(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for name in names:
        assert name in msg, f"{name!r} missing from: {msg}"


def test_a_bad_precision_field_exits_2_through_the_cli(tmp_path, capsys):
    from nas.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(RANGES + "precision:\n  kv_dtype: [fp16]\n")
    storage = tmp_path / "s.journal"
    assert main(["search", "--space", str(path), "--trials", "1", "--storage", str(storage)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "precision.kv_dtype: 'fp16' is not one of ['bf16', 'fp8']" in err, err
    assert not storage.exists()


@pytest.mark.parametrize(("value", "shown"), [("true", "true"), ("null", "null"), ("no", "false"), ("1", "1")])
def test_a_bad_choice_is_named_as_the_yaml_spells_it(tmp_path, value, shown):
    path = tmp_path / "bad.yaml"
    path.write_text(RANGES + f"precision:\n  kv_dtype: [{value}]\n")
    with pytest.raises(SpaceError, match=rf"precision.kv_dtype: {shown} is not one of \['bf16', 'fp8'\]"):
        load_space(path)


def test_a_space_without_precision_is_unchanged(tmp_path):
    """No precision: block: no precision parameter, every candidate at full precision, the same
    recorded fields (a resume compares them) and the same configurations count."""
    path = tmp_path / "p.yaml"
    path.write_text(RANGES)
    space = load_space(path)
    assert space.precision == {} and not any(k.startswith("precision") for k in space._searched())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        assert space.sample(trial, stub_task()).arch.full_precision
        assert not any("dtype" in k for k in trial.params)
    finite = parse_space_text(SMALL_FINITE, "finite.yaml")
    assert finite.configurations() == 56 * 9
    with_it = parse_space_text(SMALL_FINITE + PRECISION, "finite.yaml")
    assert with_it.differences(finite) == [f"precision.{k}: {v} -> (absent)" for k, v in with_it.precision.items()]


def test_configurations_counts_the_precision_draws():
    """The brute-force sampler's distinct candidates of a finite space with precision choices,
    study-wide and per layer, are as many as ``configurations`` says (a study-wide field counts only
    for the stacks that hold what it stores)."""
    from nas.tasks import load_task

    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=16,n_test=8")
    small = SMALL_FINITE.replace("  mlp_ratio: [1.0]", "  mlp_ratio: [0, 1.0]").replace(
        "short_conv: [0, 3]", "short_conv: [0]"
    )
    small = (
        small.replace("  momentum: [0.9, 0.5]\n", "")
        .replace("{low: 2, high: 6, step: 2}", "[2]")
        .replace("[sgd, adamw]", "[adamw]")
    )
    for text in (
        small + PRECISION,
        edit(small, "  mlp_ratio:", "  kv_dtype: [bf16, fp8]\n  weight_dtype: [bf16, fp8]\n  mlp_ratio:"),
    ):
        space = parse_space_text(text, "finite.yaml")
        seen = set()
        study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            study.optimize(
                lambda t, space=space, seen=seen: seen.add(repr(space.sample(t, task))) or 0.0, n_trials=5000
            )
        finally:
            optuna.logging.set_verbosity(verbosity)
        assert len(seen) == len(study.trials) == space.configurations()


def test_default_precision_leaves_the_json_and_hash_of_an_architecture_as_they_were():
    """The precision fields are left out of an ArchSpec's JSON at their defaults: an architecture
    without them keeps the dict, arch_hash and training seed it had before they existed (values
    computed at 15aef22, the commit before them); a narrower one differs in its hash only, and
    trains as its full-precision network does."""
    arch = ArchSpec(
        32,
        (
            LayerSpec("attention", heads=2),
            LayerSpec("linear_attention", heads=2, feature_map="elu+1", short_conv=4),
            LayerSpec("none", mlp_ratio=2),
        ),
        16,
        16,
    )
    assert arch_hash(arch) == "aa6f1a14a793d772"
    assert training_seed(7, arch, TrainSpec()) == 314327625
    assert all(
        set(la) == {"mixer", "heads", "feature_map", "short_conv", "mlp_ratio", "activation", "norm"}
        for la in arch.to_dict()["layers"]
    )
    fp8 = dataclasses.replace(arch, layers=(dataclasses.replace(arch.layers[0], kv_dtype="fp8"), *arch.layers[1:]))
    assert fp8.to_dict()["layers"][0]["kv_dtype"] == "fp8" and ArchSpec.from_dict(fp8.to_dict()) == fp8
    assert arch_hash(fp8) != arch_hash(arch) and fp8.at_full_precision() == arch
    assert training_seed(7, fp8, TrainSpec()) == training_seed(7, arch, TrainSpec())
    assert fp8.summary() == "A L M | d=32 | kv fp8" and arch.summary() == "A L M | d=32"


@pytest.mark.parametrize(
    "layer, message",
    [
        (
            dict(mixer="linear_attention", heads=1, feature_map="relu", kv_dtype="fp8"),
            "kv_dtype applies only to attention",
        ),
        (dict(mixer="attention", heads=1, state_dtype="bf16"), "state_dtype applies only to linear_attention"),
        (dict(mixer="none", mlp_ratio=0, weight_dtype="fp8"), "weight_dtype applies only to blocks"),
        (dict(mixer="attention", heads=1, kv_dtype="fp4"), "kv_dtype 'fp4' is not one of ['bf16', 'fp8']"),
    ],
)
def test_a_layer_refuses_a_dtype_it_does_not_store(layer, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LayerSpec(**layer)
