"""The ``nas`` command line: a real run, and bad input → one clear line, exit 2, study untouched."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from hardware_profiles import load_profile
from nas.cli import main
from tests.conftest import study_checksum, unique_name, write_space


@pytest.fixture(scope="module")
def existing(tmp_path_factory) -> tuple[Path, Path, str]:
    """A journal holding one finished study, shared by the bad-input cases."""
    tmp = tmp_path_factory.mktemp("cli")
    space = write_space(tmp)
    storage = tmp / "studies.journal"
    assert (
        main(
            [
                "search",
                "--space",
                str(space),
                "--trials",
                "2",
                "--storage",
                str(storage),
                "--study",
                "keep",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    from nas.search.storage import open_storage

    optuna.create_study(study_name="foreign", storage=open_storage(str(storage)), directions=["maximize"] * 3)
    return tmp, space, str(storage)


def test_search_prints_front_and_next_steps(existing, capsys):
    tmp, space, storage = existing
    assert main(["search", "--space", str(space), "--trials", "3", "--storage", storage, "--study", "other"]) == 0
    out = capsys.readouterr().out
    assert "Pareto front of other" in out and "next: nas report --study other" in out
    assert main(["studies", "--storage", storage]) == 0
    listing = capsys.readouterr().out
    assert "keep" in listing and "other" in listing


def test_names_print_as_they_are_and_next_steps_paste_into_a_shell(tmp_path, capsys, monkeypatch):
    """A study name or storage path with brackets and spaces: rich read "[red]" as a style and
    printed "xy", a name no command finds; the next: lines were not shell-quoted. Each printed
    command, split as a shell would, runs."""
    import shlex

    monkeypatch.setenv("COLUMNS", "300")
    storage = str(tmp_path / "my runs [red].journal")
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--no-baselines"]
    assert main([*argv, "--storage", storage, "--study", "x[red] y's"]) == 0
    out = capsys.readouterr().out
    assert "study x[red] y's in " in out and "Pareto front of x[red] y's" in out
    commands = [line.split(":", 1)[1] if line.startswith("next:") else line for line in out.splitlines()]
    commands = [c.strip() for c in commands if c.strip().startswith("nas ")]
    assert len(commands) == 2
    report, export = (shlex.split(c)[1:] for c in commands)
    assert report == ["report", "--study", "x[red] y's", "--storage", storage]
    assert main([*report, "--out", str(tmp_path / "r.html")]) == 0
    assert main([*export[:-1], str(tmp_path / "bundle")]) == 0  # its --out export/, placed in tmp_path


def test_memory_over_the_target_gpu_is_said_before_the_search_per_trial_and_in_the_front(tmp_path, capsys, monkeypatch):
    """Issue #49 12a: at --latency-shape 4096x1048576 the candidates need about 2e6 MiB, far over an
    h200's 141 GB (134,468 MiB: the objective is in MiB of 2**20 bytes, the datasheet in GB of 1e9);
    the start of the search, each trial's line, the front table and the report say so in words."""
    monkeypatch.setenv("COLUMNS", "300")
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--storage", storage, "--target", "h200"]
    assert main([*argv, "--study", "big", "--latency-shape", "4096x1048576"]) == 0
    out = capsys.readouterr().out
    said = "more than h200's 141 GB (134,468 MiB)"
    warning = next(line for line in out.splitlines() if line.startswith("warning: "))
    assert warning.startswith("warning: memory at 4096x1048576 of the baselines (all-attention ")
    assert said in warning and "cannot run on one h200" in warning
    trial = next(line for line in out.splitlines() if line.startswith("trial 0 "))
    assert re.search(r" — memory \S+ MiB is " + re.escape(said), trial)
    assert "> 141 GB" in out and "trial(s) 0 need more memory than h200's 141 GB (134,468 MiB)" in " ".join(out.split())
    assert main(["report", "--study", "big", "--storage", storage, "--out", str(tmp_path / "r.html")]) == 0
    assert "is more than h200&#x27;s 141 GB (134,468 MiB)" in (tmp_path / "r.html").read_text()
    bundle = tmp_path / "bundle"
    assert main(["export", "--study", "big", "--storage", storage, "--trial", "0", "--out", str(bundle)]) == 0
    card = " ".join((bundle / "card.md").read_text().split())
    assert "**Does not fit the target GPU:** memory " in card and said in card
    assert any(said in note for note in json.loads((bundle / "arch.json").read_text())["over_device_memory"])

    assert main([*argv, "--study", "small"]) == 0  # the default shape fits: nothing said
    out = capsys.readouterr().out
    assert "Pareto front of small" in out and "141 GB" not in out and "warning" not in out


def test_cache_memory_over_the_target_gpu_is_said(tmp_path, capsys, monkeypatch):
    """The decode cache at --context 1048576 --decode-batch 4096 (all-attention: about 1e6 MiB) is
    over an h200's memory too; a profile without memory_gb says nothing, as before."""
    monkeypatch.setenv("COLUMNS", "300")
    generation = ["--objectives", "accuracy,cache_memory", "--context", "1048576", "--decode-batch", "4096"]
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--storage", str(tmp_path / "s.journal")]
    assert main([*argv, *generation, "--target", "h200", "--study", "cache"]) == 0
    out = capsys.readouterr().out
    assert "warning: cache memory at context 1,048,576 × batch 4096 of the baselines (all-attention " in out
    assert re.search(r" — cache memory \S+ MiB is more than h200's 141 GB \(134,468 MiB\)", out)
    data = yaml.safe_load(Path(load_profile("h200").path).read_text())
    del data["memory_gb"], data["source"]["memory_gb"]
    unsized = tmp_path / "unsized.yaml"
    unsized.write_text(yaml.safe_dump(data))
    assert main([*argv, *generation, "--target", str(unsized), "--study", "unsized"]) == 0
    out = capsys.readouterr().out
    assert "Pareto front of unsized" in out and "141 GB" not in out and "warning" not in out


def test_an_unknown_flag_is_one_line_without_a_repeated_prefix(capsys):
    assert main(["search", "--bogus"]) == 2
    assert capsys.readouterr().err.strip() == "nas: error: unrecognized arguments: --bogus"


BAD_VALUES = [
    # (id, flags, the whole line): a subcommand's flag is named after "nas search: error:", once (it
    # printed "nas: error: nas search: ..."); a value that starts "-<digit>" is a value, not a flag
    # (argparse said "expected one argument")
    ("trials-zero", ["--trials", "0"], "nas search: error: argument --trials: must be >= 1, got 0"),
    (
        "latency-shape-negative",
        ["--latency-shape", "-1x256"],
        "nas: error: --latency-shape: invalid shape '-1x256': expected BATCHxSEQ_LEN with positive integers, "
        "e.g. '8x1024'",
    ),
    (
        "budget-negative-exponent",
        ["--max-latency-ms", "-1e3"],
        "nas search: error: argument --max-latency-ms: must be a finite number > 0, got -1e3",
    ),
    (  # was written into the journal as a non-JSON Infinity; leaving the flag out means no budget
        "budget-infinite",
        ["--max-latency-ms", "inf"],
        "nas search: error: argument --max-latency-ms: must be a finite number > 0, got inf",
    ),
    (
        "guard-infinite",
        ["--max-train-seconds", "1e400"],
        "nas search: error: argument --max-train-seconds: must be a finite number > 0, got 1e400",
    ),
    (  # every candidate was trained and the front was three copies of the smallest model
        "objectives-without-accuracy",
        ["--objectives", "latency,memory"],
        "nas search: error: argument --objectives: latency,memory leaves out accuracy, so the front would be the "
        "smallest model alone (every candidate is trained all the same); add it: --objectives accuracy,latency,memory",
    ),
]


@pytest.mark.parametrize(("flags", "line"), [pytest.param(*c[1:], id=c[0]) for c in BAD_VALUES])
def test_a_bad_flag_value_is_one_clean_line(tmp_path, capsys, flags, line):
    storage = tmp_path / "s.journal"
    assert main(["search", "--space", str(write_space(tmp_path)), "--storage", str(storage), *flags]) == 2
    assert capsys.readouterr().err.strip() == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def _bad_files(tmp: Path) -> dict[str, Path]:
    files = {}
    files["yaml_syntax"] = tmp / "syntax.yaml"
    files["yaml_syntax"].write_text("depth: [1, 2\nd_model: 8\n")
    base = write_space(tmp / "_", steps=5) if (tmp / "_").mkdir(exist_ok=True) is None else None
    text = base.read_text()
    for key, (old, new) in {
        "unknown_mixer": ("mixer: [attention,", "mixer: [mamba, attention,"),
        "empty_range": ("lr: {low: 1.0e-3, high: 1.0e-2, log: true}", "lr: {low: 1.0e-2, high: 1.0e-3}"),
        "heads": ("heads: [1, 2]", "heads: [3]"),
        "unknown_field": ("mlp_ratio: [0, 2]", "mlp_ratio: [0, 2]\n  dropout: [0.1]"),
        "empty_list": ("d_model: [16]", "d_model: []"),
        "space_bad_task": ("task: mqar:", "task: mqar:foo=1,"),
    }.items():
        files[key] = tmp / f"{key}.yaml"
        files[key].write_text(text.replace(old, new))
    np.savez(tmp / "flat.npz", x=np.arange(10), y=np.arange(10))
    files["npz_shape"] = tmp / "flat.npz"
    (tmp / "adir").mkdir(exist_ok=True)
    files["dir"] = tmp / "adir"
    (tmp / "full").mkdir(exist_ok=True)
    (tmp / "full" / "mine.txt").write_text("keep me")
    files["nonempty"] = tmp / "full"
    np.savez(tmp / "two_rows.npz", x=np.ones((2, 8), dtype=np.int64), y=np.ones(2, dtype=np.int64))
    files["two_rows"] = tmp / "two_rows.npz"
    rng = np.random.default_rng(0)  # one label per sequence: readout "last", a model that does not generate
    np.savez(tmp / "labels.npz", x=rng.integers(0, 8, (40, 8)), y=rng.integers(0, 3, 40))
    files["labels"] = tmp / "labels.npz"
    (tmp / "afile").write_text("a regular file")
    files["file"] = tmp / "afile"
    profile = yaml.safe_load((Path(__file__).parents[2] / "hardware_profiles" / "h200.yaml").read_text())
    profile["calibrated"]["kernel_model"]["coefficients"]["embed"] = [1.81162]  # a number short
    files["short_profile"] = tmp / "short.yaml"
    files["short_profile"].write_text(yaml.safe_dump(profile))
    return files


BAD = [
    # (id, argv builder, words the one line must contain)
    ("yaml-syntax", lambda f, s, st: ["search", "--space", str(f["yaml_syntax"])], "invalid YAML"),
    ("unknown-mixer", lambda f, s, st: ["search", "--space", str(f["unknown_mixer"])], "'mamba' is not one of"),
    ("empty-range", lambda f, s, st: ["search", "--space", str(f["empty_range"])], "empty range"),
    ("heads-not-dividing", lambda f, s, st: ["search", "--space", str(f["heads"])], "do not divide d_model=16"),
    ("unknown-space-field", lambda f, s, st: ["search", "--space", str(f["unknown_field"])], "layer.dropout"),
    ("empty-choices", lambda f, s, st: ["search", "--space", str(f["empty_list"])], "empty list"),
    ("unknown-space", lambda f, s, st: ["search", "--space", "nope"], "unknown search space 'nope'"),
    ("missing-space-file", lambda f, s, st: ["search", "--space", "missing.yaml"], "no such search-space file"),
    (
        "space-is-a-folder",
        lambda f, s, st: ["search", "--space", str(f["file"].parent)],
        "is a folder; give a search-space YAML file",
    ),
    ("unknown-profile", lambda f, s, st: ["search", "--space", s, "--target", "tpu9"], "tpu9"),
    (
        "malformed-profile",
        lambda f, s, st: ["search", "--space", s, "--target", str(f["short_profile"])],
        "short.yaml: field 'calibrated.kernel_model.coefficients.embed' must hold 2 numbers",
    ),
    (
        "malformed-profile-show",
        lambda f, s, st: ["profiles", "show", str(f["short_profile"])],
        "short.yaml: field 'calibrated.kernel_model.coefficients.embed' must hold 2 numbers",
    ),
    (
        "shape-too-long",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--latency-shape", "1x99999999999999"],
        "--latency-shape: sequence length 99,999,999,999,999 is above the maximum of 1,048,576 tokens",
    ),
    (
        "shape-too-wide",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--latency-shape", "99999x8"],
        "--latency-shape: batch 99,999 is above the maximum of 4,096 sequences",
    ),
    (
        "context-huge",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--context", "999999999999999999"],
        "--context: must be at most 1,048,576 tokens, got 999,999,999,999,999,999",
    ),
    (
        "decode-batch-huge",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--decode-batch", "99999999999999999"],
        "--decode-batch: must be at most 4,096 sequences",
    ),
    (
        "workers-huge",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--workers", "100000"],
        "--workers: must be at most 256 processes, got 100,000",
    ),
    (
        "trials-per-gpu-huge",
        lambda f, s, st: ["search", "--space", s, "--study", "keep", "--trials-per-gpu", "1000"],
        "--trials-per-gpu: must be at most 256 processes",
    ),
    ("malformed-shape", lambda f, s, st: ["search", "--space", s, "--latency-shape", "8by1024"], "--latency-shape"),
    ("zero-shape", lambda f, s, st: ["search", "--space", s, "--latency-shape", "0x128"], "--latency-shape"),
    ("missing-npz", lambda f, s, st: ["search", "--space", s, "--task", "missing.npz"], "missing.npz"),
    ("misshaped-npz", lambda f, s, st: ["search", "--space", s, "--task", str(f["npz_shape"])], "flat.npz"),
    ("unknown-task", lambda f, s, st: ["search", "--space", s, "--task", "sudoku"], "sudoku"),
    (
        "trials-per-gpu-without-gpus",
        lambda f, s, st: ["search", "--space", s, "--trials-per-gpu", "2"],
        "--trials-per-gpu needs --gpus",
    ),
    (
        "trials-per-gpu-auto-without-gpus",
        lambda f, s, st: ["search", "--space", s, "--trials-per-gpu", "auto"],
        "--trials-per-gpu needs --gpus",
    ),
    (
        "trials-per-gpu-neither-count-nor-auto",
        lambda f, s, st: ["search", "--space", s, "--trials-per-gpu", "aut"],
        "must be a count of processes or auto, got 'aut'",
    ),
    ("bad-storage-url", lambda f, s, st: ["search", "--space", s, "--storage", "foo://bar"], "unsupported scheme"),
    (
        "sqlite-in-memory",
        lambda f, s, st: ["search", "--space", s, "--storage", "sqlite:///:memory:"],
        "in-memory database, lost when this process exits",
    ),
    ("sqlite-bare", lambda f, s, st: ["report", "--study", "keep", "--storage", "sqlite://"], "in-memory database"),
    ("storage-is-dir", lambda f, s, st: ["search", "--space", s, "--storage", str(f["dir"])], "is a directory"),
    ("trials-zero", lambda f, s, st: ["search", "--space", s, "--trials", "0"], "--trials"),
    ("trials-negative", lambda f, s, st: ["search", "--space", s, "--trials", "-4"], "--trials"),
    ("trials-text", lambda f, s, st: ["search", "--space", s, "--trials", "many"], "'many' is not an integer"),
    ("negative-budget", lambda f, s, st: ["search", "--space", s, "--max-latency-ms", "-1"], "--max-latency-ms"),
    ("unknown-sampler", lambda f, s, st: ["search", "--space", s, "--sampler", "cmaes"], "--sampler"),
    ("cuda-missing", lambda f, s, st: ["search", "--space", s, "--device", "cuda"], "no CUDA device"),
    (
        "resume-other-space",
        lambda f, s, st: ["search", "--space", "hybrid_tiny", "--study", "keep"],
        "was created with",
    ),
    ("empty-study-name", lambda f, s, st: ["search", "--space", s, "--study", ""], "--study must be a non-empty name"),
    (
        "blank-study-name",
        lambda f, s, st: ["search", "--space", s, "--study", "  "],
        "--study must be a non-empty name",
    ),
    ("study-name-path", lambda f, s, st: ["search", "--space", s, "--study", "../../x"], "path separator"),
    ("study-name-control", lambda f, s, st: ["search", "--space", s, "--study", "a\nb"], "control characters"),
    ("seed-negative", lambda f, s, st: ["search", "--space", s, "--seed", "-1"], "--seed: must be in [0, 2**32 - 1]"),
    (
        "seed-too-large",
        lambda f, s, st: ["search", "--space", s, "--seed", "99999999999999999999999"],
        "--seed: must be in [0, 2**32 - 1]",
    ),
    ("seed-2-to-the-32", lambda f, s, st: ["search", "--space", s, "--seed", str(2**32)], "--seed: must be in"),
    ("search-empty-storage", lambda f, s, st: ["search", "--space", s, "--storage", ""], "--storage must be"),
    ("studies-empty-storage", lambda f, s, st: ["studies", "--storage", ""], "--storage must be"),
    ("report-blank-storage", lambda f, s, st: ["report", "--study", "keep", "--storage", " "], "--storage must be"),
    (
        "two-row-npz",
        lambda f, s, st: ["search", "--space", s, "--task", str(f["two_rows"])],
        "2 row(s); need at least 10",
    ),
    (
        "objectives-unknown",
        lambda f, s, st: ["search", "--space", s, "--objectives", "accuracy,speed"],
        "unknown objective(s) ['speed']",
    ),
    ("objectives-one", lambda f, s, st: ["search", "--space", s, "--objectives", "accuracy"], "choose 2-4 objectives"),
    (
        "objectives-five",
        lambda f, s, st: [
            "search",
            "--space",
            s,
            "--objectives",
            "accuracy,latency,memory,decode_latency,cache_memory",
            "--context",
            "64",
        ],
        "choose 2-4 objectives",
    ),
    (
        "objectives-repeated",
        lambda f, s, st: ["search", "--space", s, "--objectives", "accuracy,latency,accuracy"],
        "each objective once",
    ),
    ("context-zero", lambda f, s, st: ["search", "--space", s, "--context", "0"], "--context"),
    ("context-text", lambda f, s, st: ["search", "--space", s, "--context", "32k"], "--context"),
    ("decode-batch-zero", lambda f, s, st: ["search", "--space", s, "--decode-batch", "0"], "--decode-batch"),
    (
        "decode-without-context",
        lambda f, s, st: ["search", "--space", s, "--objectives", "accuracy,decode_latency"],
        "pass --context N",
    ),
    (  # the space's own task: the line names the space file and its field (it named neither)
        "space-task-unknown-parameter",
        lambda f, s, st: ["search", "--space", str(f["space_bad_task"]), "--study", "new"],
        "space_bad_task.yaml: task: mqar: unknown parameter(s) foo",
    ),
    (  # it only added a caption and a card row (found by a new-user audit)
        "context-without-a-generation-objective",
        lambda f, s, st: ["search", "--space", s, "--study", "new", "--context", "64"],
        "--context: only the generation objectives (prefill_latency, decode_latency, cache_memory) use it",
    ),
    (  # it was ignored without a word
        "decode-batch-without-a-generation-objective",
        lambda f, s, st: ["search", "--space", s, "--study", "new", "--decode-batch", "8"],
        "--decode-batch: only the generation objectives",
    ),
    (
        "context-of-a-classifier",
        lambda f, s, st: ["search", "--space", s, "--study", "new", "--task", str(f["labels"]), "--context", "64"],
        "--objectives accuracy,latency,memory has none: add one",
    ),
    (
        "decode-of-a-classifier",
        lambda f, s, st: [
            "search",
            "--space",
            s,
            "--task",
            str(f["labels"]),
            "--objectives",
            "accuracy,decode_latency,cache_memory",
            "--context",
            "64",
        ],
        "do not generate tokens",
    ),
    (
        "resume-other-objectives",
        lambda f, s, st: [
            "search",
            "--space",
            s,
            "--study",
            "keep",
            "--objectives",
            "accuracy,decode_latency",
            "--context",
            "64",
        ],
        "was created with objectives=",
    ),
    ("unknown-study", lambda f, s, st: ["studies", "--study", "ghost"], "no study named 'ghost'"),
    ("unknown-profile-show", lambda f, s, st: ["profiles", "show", "tpu9"], "tpu9"),
    ("unknown-command", lambda f, s, st: ["frobnicate"], "invalid choice"),
    ("measure-without-gpu", lambda f, s, st: ["search", "--space", s, "--measure"], "--measure times"),
    (
        "measure-and-predict",
        lambda f, s, st: ["search", "--space", s, "--measure", "--predict"],
        "not allowed with argument --measure",
    ),
    ("gpus-missing", lambda f, s, st: ["search", "--space", s, "--gpus", "0"], "no CUDA device 0"),
    ("gpus-malformed", lambda f, s, st: ["search", "--space", s, "--gpus", "0,zero"], "distinct device indices"),
    ("workers-zero", lambda f, s, st: ["search", "--space", s, "--workers", "0"], "--workers"),
    ("trial-timeout-negative", lambda f, s, st: ["search", "--space", s, "--trial-timeout", "-5"], "--trial-timeout"),
    ("worker-unknown-study", lambda f, s, st: ["worker", "--study", "ghost"], "no study named 'ghost'"),
    ("worker-foreign-study", lambda f, s, st: ["worker", "--study", "foreign"], "not created by nas search"),
    ("worker-trials-zero", lambda f, s, st: ["worker", "--study", "keep", "--trials", "0"], "--trials"),
    (
        "worker-index-negative",
        lambda f, s, st: ["worker", "--study", "keep", "--worker-index", "-1"],
        "--worker-index: must be >= 0, got -1",
    ),
    (
        "report-out-in-missing-folder",
        lambda f, s, st: ["report", "--study", "keep", "--out", str(f["file"].parent / "typo" / "r.html")],
        "does not exist; create it first",
    ),
    ("worker-bad-storage", lambda f, s, st: ["worker", "--study", "keep", "--storage", "mongodb://x"], "unsupported"),
    ("report-unknown-study", lambda f, s, st: ["report", "--study", "ghost"], "no study named 'ghost'"),
    ("report-no-study-flag", lambda f, s, st: ["report"], "--study"),
    (
        "export-unknown-trial",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "999", "--out", str(f["dir"] / "x")],
        "has no trial 999",
    ),
    (
        "export-nonempty-out",
        lambda f, s, st: ["export", "--study", "keep", "--out", str(f["nonempty"])],
        "exists and is not empty",
    ),
    ("export-bad-pick", lambda f, s, st: ["export", "--study", "keep", "--pick", "cheapest", "--out", "x"], "--pick"),
    (
        "export-infeasible",
        lambda f, s, st: ["export", "--study", "keep", "--max-latency-ms", "1e-9", "--out", str(f["dir"] / "x")],
        "no front trial meets the budget",
    ),
    (
        "export-retrain-zero",
        lambda f, s, st: ["export", "--study", "keep", "--retrain-steps", "0", "--out", "x"],
        "--retrain-steps",
    ),
    ("export-no-out", lambda f, s, st: ["export", "--study", "keep"], "--out"),
    (
        "report-out-is-the-journal",
        lambda f, s, st: ["report", "--study", "keep", "--out", st],
        "is the study's journal",
    ),
    (
        "report-out-in-the-artifacts",
        lambda f, s, st: ["report", "--study", "keep", "--out", str(Path(st).with_suffix(".artifacts") / "r.html")],
        "lies inside the study's artifacts directory",
    ),
    (
        "report-png-in-the-artifacts",
        lambda f, s, st: [
            "report",
            "--study",
            "keep",
            "--out",
            str(f["dir"] / "x"),
            "--png",
            st[: -len(".journal")] + ".artifacts",
        ],
        "lies inside the study's artifacts directory",
    ),
    ("report-out-is-a-dir", lambda f, s, st: ["report", "--study", "keep", "--out", str(f["dir"])], "is a directory"),
    (
        "report-out-below-a-file",
        lambda f, s, st: ["report", "--study", "keep", "--out", str(f["file"] / "r.html")],
        "afile is a file, not a directory",
    ),
    (
        "report-png-is-a-file",
        lambda f, s, st: ["report", "--study", "keep", "--out", str(f["dir"] / "x"), "--png", str(f["file"])],
        "--png",
    ),
    (
        "export-out-is-the-journal",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "0", "--out", st, "--force"],
        "is the study's journal",
    ),
    (
        "export-out-holds-the-study",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "0", "--out", str(Path(st).parent), "--force"],
        "holds the study's journal",
    ),
    (
        "export-out-is-the-artifacts",
        lambda f, s, st: [
            "export",
            "--study",
            "keep",
            "--trial",
            "0",
            "--out",
            str(Path(st).with_suffix(".artifacts")),
            "--force",
        ],
        "is the study's artifacts directory",
    ),
    (
        "export-force-not-a-bundle",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "0", "--out", str(f["nonempty"]), "--force"],
        "is not an export bundle",
    ),
    (
        "export-out-is-a-file",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "0", "--out", str(f["file"]), "--force"],
        "exists and is not a directory",
    ),
    (
        "export-out-below-a-file",
        lambda f, s, st: ["export", "--study", "keep", "--trial", "0", "--out", str(f["file"] / "sub")],
        "afile is a file, not a directory",
    ),
]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the cuda-missing case needs a CPU-only box")
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_one_line_exit_2_study_untouched(existing, capsys, case):
    _, build_argv, words = case
    tmp, space, storage = existing
    files = _bad_files(tmp)
    argv = build_argv(files, str(space), storage)
    if argv[0] in ("search", "studies", "worker", "report", "export") and "--storage" not in argv:
        argv += ["--storage", storage]
    before_sum, before_bytes = study_checksum(storage, "keep"), hashlib.sha256(Path(storage).read_bytes()).hexdigest()
    weights = _digests(Path(storage).with_suffix(".artifacts"))
    assert weights  # the trained trials' weights, which a bad --out must not touch either
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nas") and words in err, err
    assert study_checksum(storage, "keep") == before_sum
    assert hashlib.sha256(Path(storage).read_bytes()).hexdigest() == before_bytes
    assert _digests(Path(storage).with_suffix(".artifacts")) == weights
    assert (tmp / "full" / "mine.txt").read_text() == "keep me" and not (tmp / "adir" / "x").exists()
    assert files["file"].read_text() == "a regular file"


def test_a_database_password_never_reaches_the_message(capsys):
    """A server URL that cannot be opened is named with its password masked, in the message and
    in the driver's own words (nothing listens on port 1)."""
    assert main(["studies", "--storage", "postgresql://nas:S3CRET@127.0.0.1:1/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nas:***@127.0.0.1:1" in err and "S3CRET" not in err, err


def test_a_driver_error_that_echoes_the_url_is_masked_too(monkeypatch):
    import nas.search.storage as storage_mod

    def echoing(url, **_):
        raise ValueError(f"could not connect with {url}")

    monkeypatch.setattr(storage_mod, "RDBStorage", echoing)
    with pytest.raises(storage_mod.StorageError) as err:
        storage_mod.open_storage("postgresql://nas:S3CRET@db:5432/x")
    assert "S3CRET" not in str(err.value) and "could not connect with" in str(err.value)


def _digests(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` by relative path, with its content's digest."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _one_line_exit_2(argv: list[str], capsys, words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nas: error: ") and words in err, err


def _journal_copy(storage: str, where: Path, cut: bool) -> Path:
    """A copy of the study's journal, ``cut`` in the middle of its last record (a full disk, a
    killed copy), with the study's weights beside it."""
    import shutil

    data = Path(storage).read_bytes()
    copy = where / ("cut.journal" if cut else "whole.journal")
    copy.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 40] if cut else data)
    shutil.copytree(Path(storage).with_suffix(".artifacts"), copy.with_suffix(".artifacts"))
    return copy


WRITERS = [
    ("search-resume", lambda s, st: ["search", "--space", s, "--study", "keep", "--trials", "3", "--storage", st]),
    ("search-new", lambda s, st: ["search", "--space", s, "--study", "fresh", "--trials", "1", "--storage", st]),
    ("worker", lambda s, st: ["worker", "--study", "keep", "--trials", "3", "--storage", st]),
]
READERS = [
    ("studies", lambda s, st: ["studies", "--storage", st]),
    ("report", lambda s, st: ["report", "--study", "keep", "--storage", st, "--out", str(Path(st).parent / "r.html")]),
    (
        "export",
        lambda s, st: [
            "export",
            "--study",
            "keep",
            "--trial",
            "0",
            "--storage",
            st,
            "--out",
            str(Path(st).parent / "b"),
        ],
    ),
]


@pytest.mark.parametrize("case", WRITERS, ids=[c[0] for c in WRITERS])
def test_a_journal_cut_off_mid_record_is_refused_by_writers(existing, tmp_path, capsys, case):
    """Optuna appends right after a partial last line, gluing two records into one the journal
    cannot parse: every command that writes refuses it, and the file stays as it was."""
    _, space, storage = existing
    cut = _journal_copy(storage, tmp_path, cut=True)
    before = cut.read_bytes()
    assert not before.endswith(b"\n")
    _one_line_exit_2(case[1](str(space), str(cut)) + ["--device", "cpu"], capsys, "ends in a partial record")
    assert cut.read_bytes() == before


@pytest.mark.parametrize("case", READERS, ids=[c[0] for c in READERS])
def test_a_journal_cut_off_mid_record_is_still_read(existing, tmp_path, capsys, case):
    """Reading skips the partial last record, as Optuna does: the read-only commands still work."""
    _, space, storage = existing
    cut = _journal_copy(storage, tmp_path, cut=True)
    before = cut.read_bytes()
    assert main(case[1](str(space), str(cut))) == 0, capsys.readouterr().err
    assert cut.read_bytes() == before


@pytest.mark.parametrize(
    "content", [b"garbage not json\n", b"name: ci_tiny\ndepth: 2\n", b"[1, 2]\n"], ids=["text", "yaml", "json-list"]
)
@pytest.mark.parametrize("case", WRITERS + READERS, ids=[c[0] for c in WRITERS + READERS])
def test_a_file_that_is_not_a_journal_is_refused_by_every_command(existing, tmp_path, capsys, case, content):
    """Optuna skips a last line it cannot parse, so such a file read as an empty journal (nas
    studies printed an empty table) and a search appended a study to it."""
    _, space, _ = existing
    bad = tmp_path / "g.journal"
    bad.write_bytes(content)
    _one_line_exit_2(case[1](str(space), str(bad)), capsys, "is not an Optuna journal file")
    assert bad.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.journal"]


@pytest.mark.parametrize("storage", ["missing.journal", "sqlite:///TMP/missing.db"], ids=["journal", "sqlite"])
@pytest.mark.parametrize("case", READERS + WRITERS[2:], ids=[c[0] for c in READERS + WRITERS[2:]])
def test_commands_that_only_read_never_create_a_storage(tmp_path, capsys, case, storage):
    """nas studies used to print an empty table for a mistyped path, and leave an empty journal there."""
    where = storage.replace("TMP", str(tmp_path)) if "://" in storage else str(tmp_path / storage)
    _one_line_exit_2(case[1]("unused", where), capsys, "no such")
    assert list(tmp_path.iterdir()) == []


def test_a_journal_in_a_missing_folder_is_refused_not_created(tmp_path, capsys):
    """--storage /nonexistent_dir/x.journal created the folder without a word (a mistyped path
    hid the study there), where sqlite:////nonexistent_dir/x.db was refused."""
    storage = tmp_path / "nodir" / "x.journal"
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--storage", str(storage)]
    _one_line_exit_2([*argv, "--device", "cpu"], capsys, f"storage '{storage}': no folder '{storage.parent}'; ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


@pytest.mark.parametrize("case", WRITERS + READERS, ids=[c[0] for c in WRITERS + READERS])
def test_a_corrupt_record_inside_a_journal_is_named_by_its_line(existing, tmp_path, capsys, case):
    """The message gave the decoder's place inside the record ("line 1 column 13"), which names
    no place in the file: it names the file's line."""
    _, space, storage = existing
    copy = _journal_copy(storage, tmp_path, cut=False)
    lines = copy.read_bytes().splitlines(keepends=True)
    middle = len(lines) // 2
    lines[middle] = b'{"op_code": oops}\n'
    copy.write_bytes(b"".join(lines))
    before = copy.read_bytes()
    words = f"storage '{copy}': line {middle + 1} is not a journal record (Expecting value at column 13); "
    _one_line_exit_2(case[1](str(space), str(copy)) + ["--device", "cpu"] * (case in WRITERS), capsys, words)
    assert copy.read_bytes() == before


def test_an_artifacts_path_that_is_a_file_is_refused_before_the_study_is_written(
    existing, tmp_path, monkeypatch, capsys
):
    _, space, storage = existing
    copy = _journal_copy(storage, tmp_path, cut=False)
    before = copy.read_bytes()
    (tmp_path / "afile").write_text("mine")
    for artifacts, words in (
        (tmp_path / "afile", "is a file; give a directory"),
        (tmp_path / "afile" / "sub", "afile' is a file"),
    ):
        monkeypatch.setenv("NAS_ARTIFACTS", str(artifacts))
        for study in ("keep", "fresh"):  # a resume would record its budgets; a new study its setup
            argv = ["search", "--space", str(space), "--study", study, "--trials", "3", "--storage", str(copy)]
            _one_line_exit_2(argv + ["--device", "cpu"], capsys, words)
            assert copy.read_bytes() == before
    assert (tmp_path / "afile").read_text() == "mine"


def test_export_force_never_removes_the_folder_of_the_study(existing, tmp_path, capsys):
    """--out DIR --force where DIR holds the journal and the weights: it used to delete both."""
    _, _, storage = existing
    folder = tmp_path / "sdir"
    folder.mkdir()
    copy = _journal_copy(storage, folder, cut=False)
    before = _digests(folder)
    argv = ["export", "--study", "keep", "--trial", "0", "--storage", str(copy), "--out", str(folder), "--force"]
    _one_line_exit_2(argv, capsys, "holds the study's journal")
    assert _digests(folder) == before and len(before) > 1


# one change to the space the study 'keep' was created with (same name, so a run would resume it)
BAD_SPACE_EDITS = [
    ("mlp-ratio-nan", "mlp_ratio: [0, 2]", "mlp_ratio: [.nan]", "layer.mlp_ratio"),
    ("lr-nan", "lr: {low: 1.0e-3, high: 1.0e-2, log: true}", "lr: [.nan]", "train.lr"),
    ("lr-range-inf", "high: 1.0e-2, log: true}", "high: .inf, log: true}", "train.lr"),
    ("d-model-huge", "d_model: [16]", "d_model: [1048576]", "d_model"),
    ("depth-huge", "depth: {low: 1, high: 2}", "depth: {low: 1, high: 1000000}", "depth"),
    ("duplicate-key", "d_model: [16]", "d_model: [16]\ndepth: [1]", "depth"),
    ("nesterov-no-momentum", "batch_size: [8]", "batch_size: [8]\n  momentum: [0.0]\n  nesterov: [true]", "nesterov"),
]


@pytest.mark.parametrize(("old", "new", "key"), [pytest.param(*c[1:], id=c[0]) for c in BAD_SPACE_EDITS])
def test_bad_space_on_an_existing_study_is_refused_before_it_is_opened(existing, capsys, old, new, key):
    """Refused while the study is still closed: before, a NaN or a combination SGD refuses got as far
    as the first trial, which stayed RUNNING in the user's study."""
    from nas.search.storage import open_storage

    tmp, space, storage = existing
    bad = tmp / f"bad_{key}.yaml"
    bad.write_text(space.read_text().replace(old, new))
    assert bad.read_text() != space.read_text()

    def trials() -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name="keep", storage=open_storage(storage)).trials

    n_before, before_sum = len(trials()), study_checksum(storage, "keep")
    before_bytes = hashlib.sha256(Path(storage).read_bytes()).hexdigest()
    argv = ["search", "--space", str(bad), "--study", "keep", "--trials", "5", "--storage", storage]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"nas: error: {bad}: ") and key in err, err
    after = trials()
    assert len(after) == n_before and not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]
    assert study_checksum(storage, "keep") == before_sum
    assert hashlib.sha256(Path(storage).read_bytes()).hexdigest() == before_bytes


def test_bad_fault_env_is_one_line_exit_2_study_untouched(existing, capsys, monkeypatch):
    """NAS_FAULT is checked before the study is opened: one line, and the study (resumed here with
    a larger --trials, which would otherwise record new budgets and start a trial) is unchanged."""
    tmp, space, storage = existing
    before = hashlib.sha256(Path(storage).read_bytes()).hexdigest()
    monkeypatch.setenv("NAS_FAULT", "explode")
    argv = ["search", "--space", str(space), "--trials", "3", "--storage", storage, "--study", "keep"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "nas: error: NAS_FAULT='explode': kind 'explode' is not one of "
        "['oom', 'nan', 'compile', 'mismatch', 'timeout', 'slow']"
    ], err
    assert hashlib.sha256(Path(storage).read_bytes()).hexdigest() == before


def test_sizes_at_their_bounds_parse():
    """The bounds are inclusive, and the API (SearchConfig) is held to them as the flags are."""
    from nas.cli import _build_parser
    from nas.search.setup import MAX_BATCH, MAX_CONTEXT, MAX_TRIALS, MAX_WORKERS
    from nas.search.study import SearchConfig, SearchError, prepare

    args = _build_parser().parse_args(
        ["search", "--latency-shape", f"{MAX_BATCH}x{MAX_CONTEXT}", "--context", str(MAX_CONTEXT)]
        + ["--decode-batch", str(MAX_BATCH), "--workers", str(MAX_WORKERS), "--trials-per-gpu", str(MAX_WORKERS)]
        + ["--trials", str(MAX_TRIALS)]
    )
    assert (args.context, args.decode_batch, args.workers) == (MAX_CONTEXT, MAX_BATCH, MAX_WORKERS)
    assert args.trials == MAX_TRIALS
    for config, needle in (
        (SearchConfig(trials=MAX_TRIALS + 1), "--trials must be between 1 and 1,000,000, got 1,000,001"),
        (SearchConfig(latency_shape=f"1x{MAX_CONTEXT + 1}"), "--latency-shape 1x1048577: at most 4,096 sequences"),
        (SearchConfig(latency_shape=f"{MAX_BATCH + 1}x8"), "--latency-shape 4097x8"),
        (SearchConfig(context=MAX_CONTEXT + 1), "--context must be at most 1,048,576, got 1,048,577"),
        (SearchConfig(decode_batch=MAX_BATCH + 1), "--decode-batch must be at most 4,096, got 4,097"),
    ):
        with pytest.raises(SearchError, match=re.escape(needle)):
            prepare(config)


def test_malformed_target_profile_leaves_an_existing_study_unchanged(tmp_path, capsys):
    """A study created with --target FILE, whose file is then broken (a coefficient list a number
    short): resuming it is one line, exit 2, and no trial is started (before, the predictor raised
    in the first trial and left it RUNNING)."""
    from optuna.trial import TrialState

    from nas.search.storage import open_storage

    storage, profile = str(tmp_path / "s.journal"), tmp_path / "gpu.yaml"
    data = yaml.safe_load((Path(__file__).parents[2] / "hardware_profiles" / "h200.yaml").read_text())
    profile.write_text(yaml.safe_dump(data))
    argv = ["search", "--space", str(write_space(tmp_path)), "--storage", storage, "--study", "t", "--target"]
    argv += [str(profile), "--no-baselines", "--device", "cpu", "--trials"]
    assert main([*argv, "1"]) == 0
    capsys.readouterr()
    before = study_checksum(storage, "t")
    data["calibrated"]["kernel_model"]["coefficients"]["embed"] = [1.81162]
    profile.write_text(yaml.safe_dump(data))
    assert main([*argv, "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        f"nas: error: {profile}: field 'calibrated.kernel_model.coefficients.embed' must hold 2 numbers "
        "(launch, mbytes), got 1"
    ], err
    assert study_checksum(storage, "t") == before
    states = [t.state for t in optuna.load_study(study_name="t", storage=open_storage(storage)).trials]
    assert states == [TrialState.COMPLETE]


def test_nas_storage_env_is_the_default_storage(existing, capsys, monkeypatch):
    _, _, storage = existing
    monkeypatch.setenv("NAS_STORAGE", storage)
    assert main(["studies", "--study", "keep"]) == 0
    assert "keep" in capsys.readouterr().out


def test_wrapped_ctrl_c_exits_130_and_other_errors_propagate(monkeypatch, capsys):
    """A KeyboardInterrupt that reaches main wrapped in another exception (Python wraps one raised
    inside a class body's __set_name__) still ends the run as interrupted: exit 130."""
    import signal

    from tests.nas.test_study import _wrapped_interrupt

    handler = signal.getsignal(signal.SIGINT)
    try:
        monkeypatch.setattr("nas.cli._main", _wrapped_interrupt)
        assert main(["spaces"]) == 130
        assert "interrupted" in capsys.readouterr().err

        def bug(_argv):
            raise ValueError("a bug")

        monkeypatch.setattr("nas.cli._main", bug)
        with pytest.raises(ValueError, match="a bug"):
            main(["spaces"])
    finally:
        signal.signal(signal.SIGINT, handler)


def _nas(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``nas ARGV`` in a fresh process with stdout and stderr piped (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "nas", *argv],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def _params(storage: str, study: str) -> list[dict]:
    from nas.search.storage import open_storage

    trials = optuna.load_study(study_name=study, storage=open_storage(storage)).get_trials()
    return [t.params for t in trials if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.mark.slow
def test_resume_through_the_cli_continues_the_sequence(tmp_path):
    """3 trials, then the same command with --trials 6: 6 distinct configurations (trials 3-5 used
    to replay 0-2); the same 3-trial command from scratch proposes the same first 3."""
    storage, again = str(tmp_path / "d.journal"), str(tmp_path / "again.journal")
    for trials, where in (("3", storage), ("6", storage), ("3", again)):
        run = _nas(
            "search",
            "--space",
            "hybrid_tiny",
            "--trials",
            trials,
            "--storage",
            where,
            "--study",
            "r",
            "--device",
            "cpu",
        )
        assert run.returncode == 0, run.stderr
    configs = _params(storage, "r")
    assert len(configs) == 6 and all(c not in configs[:i] for i, c in enumerate(configs))
    assert _params(again, "r") == configs[:3]


@pytest.mark.slow
def test_two_processes_on_one_study_propose_distinct_configurations(tmp_path):
    """Two nas search processes started together on one study: 12 trials, 12 configurations (they
    used to run in lock-step, proposing the same candidate pairwise)."""
    storage = str(tmp_path / "p.journal")
    cmd = [
        sys.executable,
        "-m",
        "nas",
        "search",
        "--space",
        "hybrid_tiny",
        "--trials",
        "12",
        "--storage",
        storage,
        "--study",
        "p",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read().decode()
    configs = _params(storage, "p")
    assert len(configs) == 12 and all(c not in configs[:i] for i, c in enumerate(configs))
    from nas.search.storage import open_storage

    trials = optuna.load_study(study_name="p", storage=open_storage(storage)).get_trials()
    assert len({t.user_attrs["pid"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE}) == 2


@pytest.mark.slow
def test_workers_accept_a_user_space_without_name(tmp_path):
    """A space without ``name:`` (named after its file); --workers 2 and a later nas worker both run it (they
    used to refuse: "created with space='my_space', not 'my_space (as recorded in the study)'")."""
    space = tmp_path / "my_space.yaml"
    space.write_text(write_space(tmp_path, steps=2).read_text().replace("name: ci_tiny\n", ""))
    storage = str(tmp_path / "w.journal")
    run = _nas(
        "search",
        "--space",
        str(space),
        "--trials",
        "4",
        "--workers",
        "2",
        "--device",
        "cpu",
        "--study",
        "w2",
        "--storage",
        storage,
    )
    assert run.returncode == 0, run.stderr
    assert len(_params(storage, "w2")) == 4
    run = _nas(
        "worker", "--study", "w2", "--storage", storage, "--trials", "6", "--device", "cpu", "--worker-index", "7"
    )
    assert run.returncode == 0, run.stderr
    assert len(_params(storage, "w2")) == 6
    assert "worker 7: trial" in run.stdout and "worker 7: study w2 has 6 trained trials" in run.stdout


def test_workers_that_fail_leave_no_empty_study(tmp_path, monkeypatch, capsys):
    storage = str(tmp_path / "w.journal")
    monkeypatch.setattr("nas.search.workers.run_workers", lambda *a, **k: [1, 1])
    assert (
        main(
            [
                "search",
                "--space",
                str(write_space(tmp_path)),
                "--workers",
                "2",
                "--device",
                "cpu",
                "--study",
                "w",
                "--storage",
                storage,
            ]
        )
        == 2
    )
    assert "workers exited with codes [1, 1]; study 'w' had no trials and was removed" in capsys.readouterr().err
    from nas.search.storage import open_storage

    assert optuna.get_all_study_names(open_storage(storage)) == []


def test_profiles_show_prints_the_profile_file(capsys):
    from hardware_profiles import load_profile

    assert main(["profiles", "show", "h200"]) == 0
    assert capsys.readouterr().out == Path(load_profile("h200").path).read_text()


def test_spaces_lists_every_shipped_space_with_its_task_on_one_line(capsys, monkeypatch):
    """Piped (capsys is no terminal), each space is one line with its whole task spec: rich wrapped
    piped output at 80 columns and broke ``mqar_long:...,cu / rriculum_len=64`` mid-string."""
    from nas.space import list_spaces, load_space

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["spaces"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "hybrid_long" in list_spaces() and len(load_space("hybrid_long").task) > 80  # the case that broke
    assert len(lines) == len(list_spaces()), lines
    for name, line in zip(list_spaces(), lines, strict=True):
        assert line.startswith(f"{name}: ") and line.endswith(f"(default task {load_space(name).task})"), line


def test_a_piped_front_table_keeps_each_row_on_one_line(tmp_path, capsys, monkeypatch):
    """CI logs and nohup are no terminal: the front table wrapped at 80 columns, an architecture
    "(all-attenti / on)" and a recipe over 3 lines. Each row, the header too, is one line."""
    monkeypatch.delenv("COLUMNS", raising=False)
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "2", "--device", "cpu"]
    assert main([*argv, "--storage", str(tmp_path / "s.journal"), "--study", "piped"]) == 0
    out = capsys.readouterr().out
    assert "(all-attention" in out, out
    header = [line for line in out.splitlines() if line.startswith("┃")]
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(header) == 1 and "recipe" in header[0], out
    assert rows and all(line.split("│")[1].strip() for line in rows), out  # a wrapped row: an empty trial cell
    assert max(len(line) for line in out.splitlines()) > 80  # the width it used to be cut at


@pytest.mark.slow
def test_spaces_piped_to_a_file_is_that_space_file(name="hybrid_small"):
    """``nas spaces NAME > mine.yaml`` is how a user starts their own space: the piped output is
    the shipped file itself (long comment lines used to be wrapped at 80 columns: invalid YAML)."""
    from nas.space import load_space

    run = _nas("spaces", name, timeout=120)
    assert run.returncode == 0, run.stderr
    text = Path(load_space(name).source).read_text()
    assert max(len(line) for line in text.splitlines()) > 80  # the case that used to break
    assert yaml.safe_load(run.stdout) == yaml.safe_load(text) and run.stdout == text


def test_studies_piped_lists_whole_names(tmp_path, monkeypatch, capsys):
    from nas.search.study import open_study

    storage = str(tmp_path / "s.journal")
    long_name = "my_space-delay_copy_with_a_rather_long_task_name-h100_sxm-" + unique_name("x")
    open_study(long_name, storage)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["studies", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert long_name in out  # whole, not "my_space-delay_cop…"
    lines = out.splitlines()
    assert lines[0].split("\t") == [
        "study",
        "trained",
        "truncated",
        "over_budget",
        "pruned",
        "failed",
        "running",
        "total",
        "started",
        "proxy_rho",
    ]
    assert lines[1].split("\t")[:7] == [long_name, "0", "0", "0", "0", "0", "0"]


def test_studies_counts_the_truncated_trials_apart(tmp_path, capsys):
    """``trained`` counts the trials the wall-clock guard cut short (what --trials counts), and
    nothing said how many were: a ``truncated`` column does."""
    space = write_space(tmp_path)
    space.write_text(space.read_text().replace("max_train_seconds: 600", "max_train_seconds: 1.0e-9"))
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(space), "--trials", "2", "--no-baselines", "--device", "cpu"]
    assert main([*argv, "--storage", storage, "--study", "cut"]) == 0
    capsys.readouterr()
    assert main(["studies", "--storage", storage]) == 0
    header, row = (line.split("\t") for line in capsys.readouterr().out.splitlines())
    counts = dict(zip(header, row, strict=True))
    assert counts["study"] == "cut" and counts["trained"] == "2" and counts["truncated"] == "2", counts


def test_every_flag_has_help_text():
    from nas.cli import _build_parser

    def walk(parser, where):
        for action in parser._actions:  # argparse exposes no public list of actions
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{where} {name}")
            elif not action.help:
                yield f"{where} {'/'.join(action.option_strings) or action.dest}"

    assert list(walk(_build_parser(), "nas")) == []


def test_a_log_gets_one_line_per_trial_and_the_steps_trained(tmp_path, monkeypatch, capsys):
    """Not a terminal (CI, nohup): one line per finished trial; a training stopped by the time
    budget shows the steps it took (1 of 5: any step takes longer than the 1 ns budget)."""
    space = write_space(tmp_path, steps=5)
    space.write_text(space.read_text().replace("max_train_seconds: 600", "max_train_seconds: 1.0e-9"))
    monkeypatch.setenv("COLUMNS", "200")
    assert (
        main(
            [
                "search",
                "--space",
                str(space),
                "--trials",
                "2",
                "--storage",
                str(tmp_path / "s.journal"),
                "--study",
                "log",
                "--device",
                "cpu",
                "--no-baselines",  # a baseline trains without the guard
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("trial ")]
    assert [line.split(":")[0] for line in lines] == ["trial 0 (1/2 trained)", "trial 1 (2/2 trained)"]
    assert all(line.endswith(", 1/5 steps — truncated (time budget: 1/5 steps), kept off the front") for line in lines)
    assert "Pareto front of log: 0 trials" in out  # a truncated trial never reaches the front
    assert "2 trial(s) stopped early by the time budget" in out


def test_verbose_logs_each_trial(tmp_path, caplog):
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path)), "--storage", storage, "--device", "cpu"]
    assert main([*argv, "--trials", "1", "--study", "quiet"]) == 0
    assert not [r for r in caplog.records if r.name == "nas.search.objective"]
    assert main(["-v", *argv, "--trials", "1", "--study", "loud"]) == 0
    story = [r.getMessage() for r in caplog.records if r.name == "nas.search.objective"]
    assert story[0].startswith("trial 0: training ") and story[1].startswith("trial 0: accuracy ")


@pytest.mark.slow
def test_prune_is_recorded_with_the_study_and_a_resume_asking_otherwise_is_refused(tmp_path, capsys):
    from nas.search.record import study_setup
    from nas.search.study import open_study

    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path, steps=16)), "--storage", storage, "--device", "cpu"]
    assert main([*argv, "--trials", "1", "--study", "p", "--prune"]) == 0
    assert study_setup(open_study("p", storage, create=False)).prune
    before = study_checksum(storage, "p")
    assert main([*argv, "--trials", "2", "--study", "p", "--no-prune"]) == 2
    assert "created with early stopping on; drop --no-prune" in capsys.readouterr().err
    assert study_checksum(storage, "p") == before
    assert main([*argv, "--trials", "1", "--study", "q"]) == 0  # default: off
    assert not study_setup(open_study("q", storage, create=False)).prune


def test_trials_that_finish_between_two_polls_each_show_their_own_count(tmp_path):
    """Worker processes finish several trials between two polls of the search's progress: each line
    gives the trained count as of that trial's end, in the order they ended, not the count at the poll."""
    import datetime

    from optuna.trial import TrialState, create_trial

    from nas.commands._lines import TrialLines as _TrialLines
    from nas.search.record import TrialRecord
    from nas.search.study import open_study
    from nas.spec import ArchSpec, LayerSpec, TrainSpec

    study = open_study("lines", str(tmp_path / "s.journal"))
    arch = ArchSpec(16, [LayerSpec("attention", 1)], 16, 16)
    lines = _TrialLines(study, 5, show_all=True)
    start = datetime.datetime(2026, 12, 4, 12, 0, 0)
    for number, ended_s in ((0, 30), (1, 10), (2, 20)):  # trial 1 ended first, then 2, then 0
        r = TrialRecord(
            number,
            TrialState.COMPLETE,
            arch=arch,
            train=TrainSpec("adamw", 1e-3, 0.0, 0.0, 10, 8),
            arch_summary=f"A{number}",
            steps_done=10,
        )
        frozen = create_trial(values=[0.5, 1.0, 1.0], user_attrs={**r.to_dict(), "memory": {"total_mb": 1.0}})
        frozen.datetime_start, frozen.datetime_complete = start, start + datetime.timedelta(seconds=ended_s)
        study.add_trial(frozen)
    got = lines.new(study)
    assert [line.split(":")[0] for line in got] == [
        "trial 1 (1/5 trained)",
        "trial 2 (2/5 trained)",
        "trial 0 (3/5 trained)",
    ]
    assert lines.new(study) == []


def test_a_pruned_trial_gets_a_line_with_its_rung_and_reason():
    from optuna.trial import TrialState

    from nas.commands._lines import trial_line as _trial_line
    from nas.search.record import TrialRecord

    r = TrialRecord(4, TrialState.PRUNED, arch_summary="A", pruned_at=2, prune_reason="rung at step 2/16: …")
    assert _trial_line(r, 1, 3) == "trial 4: A stopped early — rung at step 2/16: …; not counted"


def test_an_over_budget_baseline_is_named_in_its_line():
    """Trained baselines were named in their line, ones over a budget were not (a new-user audit)."""
    from optuna.trial import TrialState

    from nas.commands._lines import trial_line as _trial_line
    from nas.search.record import TrialRecord

    why = "breaks the hard budget on params (1.2e+05 > 2e+03)"
    r = TrialRecord(0, TrialState.COMPLETE, arch_summary="A A | d=32", skipped_training=why, baseline="all-attention")
    assert (
        _trial_line(r, 0, 3)
        == f"trial 0: baseline all-attention: A A | d=32 {why}; not trained, not counted (0/3 trained)"
    )


@pytest.mark.parametrize(("width", "heads", "head_dim"), [(256, "[1, 2, 4]", 256), (120, "[2, 8]", 15)])
def test_a_predicted_search_refuses_head_dims_no_kernel_runs(tmp_path, capsys, width, heads, head_dim):
    """Predicted latency is of the library's kernels too. A layer whose head dim none of them runs
    (above 128, or odd) got a roofline guess about 2x below the calibrated model, so it led the
    front and ``--pick latency`` exported it (found by a new-user audit: d_model 256, heads 1)."""
    space = tmp_path / "hd.yaml"
    space.write_text(
        "name: hd\ntask: mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=256,n_test=64\n"
        f"depth: 2\nd_model: [{width}]\nlayer: {{mixer: [attention], heads: {heads}, mlp_ratio: [2]}}\n"
        "train: {optimizer: [adamw], lr: 0.003, steps: [20], batch_size: [16]}\n"
    )
    storage = tmp_path / "s.journal"
    assert main(["search", "--space", str(space), "--storage", str(storage), "--predict", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"give head dim {head_dim};" in err and "layer.heads" in err, err
    assert not storage.exists()


def test_a_stale_calibration_is_reported_once(tmp_path):
    """It was printed twice: as a Python warning (with a source line) and as a log line."""
    profile = yaml.safe_load((Path(__file__).parents[2] / "hardware_profiles" / "h200.yaml").read_text())
    profile["calibrated"]["kernels_fingerprint"] = "0123456789ab"
    path = tmp_path / "stale.yaml"
    path.write_text(yaml.safe_dump(profile))
    argv = ["search", "--space", str(write_space(tmp_path)), "--storage", str(tmp_path / "s.journal")]
    out = _nas(*argv, "--trials", "1", "--target", str(path), "--device", "cpu", "--no-baselines")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("latency calibration was fitted on kernels 0123456789ab") == 1, out.stderr


@pytest.mark.slow
def test_the_readme_decode_example_after_the_quickstart_is_its_own_study(tmp_path, capsys, monkeypatch):
    """The README's decode example right after the Quickstart's nas search exited 2: both took the
    default name <space>-<task>-<target>, so the second resumed the first with other objectives.
    A default name now carries the settings that differ from the defaults; the default study keeps
    its name, and the default storage is created with its folder runs/."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NAS_STORAGE", raising=False)
    monkeypatch.delenv("NAS_ARTIFACTS", raising=False)
    monkeypatch.setenv("COLUMNS", "300")  # the next: line unwrapped
    quickstart = ["search", "--space", str(write_space(tmp_path)), "--trials", "1", "--no-baselines", "--device", "cpu"]
    decode = ["--objectives", "accuracy,prefill_latency,decode_latency,cache_memory", "--context", "8192"]
    assert main(quickstart) == 0
    assert main([*quickstart, *decode, "--decode-batch", "8"]) == 0, capsys.readouterr().err
    name = "ci_tiny-mqar-auto-accuracy+prefill_latency+decode_latency+cache_memory-ctx8192-b8"
    assert f"next: nas report --study {name}\n" in capsys.readouterr().out  # no quotes needed in a shell
    assert main([*quickstart, *decode, "--decode-batch", "8"]) == 0  # a resume finds it by its name
    assert f"study {name} in runs/studies.journal: " in capsys.readouterr().out
    from nas.search.storage import open_storage

    names = {s.study_name for s in optuna.get_all_study_summaries(open_storage("runs/studies.journal"))}
    assert names == {"ci_tiny-mqar-auto", name}


PRECISION_BLOCK = "precision:\n  kv_dtype: [bf16, fp8]\n  state_dtype: [fp32, bf16]\n  weight_dtype: [fp8]\n"


def _precision_space(tmp_path: Path, block: str = PRECISION_BLOCK) -> Path:
    """hybrid_tiny as `nas spaces hybrid_tiny` prints it, renamed, with a precision: block."""
    from nas.space import load_space

    path = tmp_path / "tiny_precision.yaml"
    path.write_text(load_space("hybrid_tiny").text.replace("name: hybrid_tiny", "name: tiny_precision") + block)
    return path


@pytest.mark.slow
def test_a_tiny_study_with_precision_records_both_accuracies(tmp_path, capsys, monkeypatch):
    """hybrid_tiny plus a precision: block, end to end: every trial stores its weights in fp8 (a
    fixed choice), draws its KV cache and state dtypes; its accuracy (the objective) is at that
    precision and the full-precision accuracy of the same models is recorded beside it and shown in
    the final table; memory counts the fp8 weights. A resume without the block is refused."""
    from nas.latency import weight_bytes
    from nas.search.record import records
    from nas.search.storage import open_storage

    monkeypatch.setenv("COLUMNS", "300")
    space, storage = _precision_space(tmp_path), str(tmp_path / "p.journal")
    argv = ["search", "--space", str(space), "--trials", "4", "--storage", storage, "--study", "p", "--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(full precision " in out and "weights fp8" in out
    study = optuna.load_study(study_name="p", storage=open_storage(storage))
    trained = [r for r in records(study) if r.trained]
    assert len(trained) == 4
    narrow = [r for r in trained if not r.arch.full_precision]
    assert len(narrow) >= 3  # the baselines, at least: their blocks all hold weights
    for r in narrow:
        assert 0.0 <= r.accuracy <= 1.0 and 0.0 <= r.full_precision_accuracy <= 1.0
        assert r.values["accuracy"] == r.trained_accuracy  # the objective is the stored precision's
        assert all(la.weight_dtype == "fp8" for la in r.arch.layers if la.stores("weight_dtype"))
        assert r.memory["weight_bytes"] == weight_bytes(r.arch, 2) < r.params * 2
        assert "weights fp8" in r.arch_summary
    for t in study.get_trials():
        attention = any(la.mixer == "attention" for la in records(study)[t.number].arch.layers)
        assert ("precision.kv_dtype" in t.params) == attention and "precision.weight_dtype" not in t.params
    from nas.results.pareto import front
    from nas.results.report import figures

    fronts = [t for t in figures(study)["front2d"].data if t.name.startswith("Pareto front")]
    on_front = {r.number: r for r in front(study)}
    drawn = [(t, n) for t in fronts for n in t.hovertext]
    assert len(drawn) == len(on_front)  # every front trial once, in the trace of its precision setting
    for t in fronts:
        setting = t.name.split(": ", 1)[1]
        members = [r for r in on_front.values() if (r.arch.precision_text() or "full precision") == setting]
        assert sorted(t.y) == sorted(r.accuracy for r in members)
    assert len({t.marker.symbol for t in fronts}) == len(fronts)  # one marker per setting
    axes = {d.label: list(d.values) for d in figures(study)["parallel"].data[0].dimensions}
    assert min(axes["# weight fp8"]) >= 1  # every trained trial stores its block weights in fp8
    assert {"# kv fp8", "# state bf16"} <= set(axes)
    unchanged = tmp_path / "without.yaml"
    unchanged.write_text(space.read_text().replace(PRECISION_BLOCK, ""))
    assert main(["search", "--space", str(unchanged), "--trials", "5", "--storage", storage, "--study", "p"]) == 2
    assert "precision.kv_dtype: [bf16, fp8] -> (absent)" in capsys.readouterr().err


def test_fp8_on_a_gpu_older_than_ada_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """check_fp8 takes the device's compute capability, so the refusal is tested on a CPU: below
    8.9 a space offering fp8 is one line and exit 2 before any study is written; a CPU (None), an
    H100 (9.0) and a space without fp8 go on."""
    from nas.search import start
    from nas.search.config import SearchError
    from nas.space import load_space

    space = load_space(_precision_space(tmp_path))
    with pytest.raises(
        SearchError, match=r"fp8 needs a GPU of compute capability 8\.9 or newer .* this device is 8\.0"
    ):
        start.check_fp8(space, (8, 0))
    for capability in (None, (8, 9), (9, 0)):
        start.check_fp8(space, capability)
    start.check_fp8(load_space(_precision_space(tmp_path, "precision:\n  state_dtype: [bf16]\n")), (7, 5))
    start.check_fp8(load_space("hybrid_tiny"), (7, 5))

    monkeypatch.setattr(start, "device_capability", lambda device: (8, 6))  # an A10's, say
    storage = tmp_path / "s.journal"
    argv = ["search", "--space", str(_precision_space(tmp_path)), "--trials", "1", "--storage", str(storage)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "this device is 8.6" in err, err
    assert not storage.exists()


def test_fp8_predicted_for_a_gpu_older_than_ada_is_refused_in_one_line(tmp_path, capsys):
    """Predicting latency for a profile whose GPU has no fp8 (an A100, compute capability 8.0)
    refuses a space offering fp8; an Ada or Hopper target, and a space without fp8, go on."""
    storage = tmp_path / "s.journal"
    argv = ["search", "--space", str(_precision_space(tmp_path)), "--trials", "1", "--storage", str(storage)]
    assert main([*argv, "--target", "a100_80gb"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the latency target a100_80gb is 8.0" in err, err
    assert not storage.exists()
    from hardware_profiles import load_profile

    assert load_profile("l4").compute_capability == (8, 9) and load_profile("h100_sxm").compute_capability == (9, 0)
    assert not storage.exists()


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["search", "--space", "hybrid_tiny"], "nas: interrupted; finished trials are kept in the study"),
        (["verify", "--study", "s"], "nas: interrupted; trials retrained so far are kept in the study (rerun to"),
        (["report", "--study", "s"], "nas: interrupted"),
    ],
    ids=["search", "verify", "report"],
)
def test_an_interrupt_says_what_the_command_kept(monkeypatch, capsys, command, said):
    """Ctrl-C: exit 130 and one line saying what is stored, in the command's own words (verify
    keeps retrained trials, not 'finished trials'; a report keeps nothing)."""
    import types

    import nas.cli as cli

    def interrupted(_args):
        raise KeyboardInterrupt

    module = cli._COMMANDS[command[0]]
    monkeypatch.setitem(cli._COMMANDS, command[0], types.SimpleNamespace(add_parser=module.add_parser, run=interrupted))
    assert main(command) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith(said) and err.count("\n") == 0
    if command[0] == "report":
        assert err == "nas: interrupted"
