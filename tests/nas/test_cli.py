"""The ``nas`` command line: a real run, and bad input → one clear line, exit 2, study untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import optuna
import pytest

from nas.cli import main
from tests.conftest import study_checksum, write_space


@pytest.fixture(scope="module")
def existing(tmp_path_factory) -> tuple[Path, Path, str]:
    """A journal holding one finished study, shared by the bad-input cases."""
    tmp = tmp_path_factory.mktemp("cli")
    space = write_space(tmp)
    storage = tmp / "studies.journal"
    assert main(["search", "--space", str(space), "--trials", "2", "--storage", str(storage), "--study", "keep",
                 "--device", "cpu"]) == 0
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
    ("unknown-profile", lambda f, s, st: ["search", "--space", s, "--target", "tpu9"], "tpu9"),
    ("malformed-shape", lambda f, s, st: ["search", "--space", s, "--latency-shape", "8by1024"], "--latency-shape"),
    ("zero-shape", lambda f, s, st: ["search", "--space", s, "--latency-shape", "0x128"], "--latency-shape"),
    ("missing-npz", lambda f, s, st: ["search", "--space", s, "--task", "missing.npz"], "missing.npz"),
    ("misshaped-npz", lambda f, s, st: ["search", "--space", s, "--task", str(f["npz_shape"])], "flat.npz"),
    ("unknown-task", lambda f, s, st: ["search", "--space", s, "--task", "sudoku"], "sudoku"),
    ("bad-storage-url", lambda f, s, st: ["search", "--space", s, "--storage", "foo://bar"], "unsupported scheme"),
    ("storage-is-dir", lambda f, s, st: ["search", "--space", s, "--storage", str(f["dir"])], "is a directory"),
    ("trials-zero", lambda f, s, st: ["search", "--space", s, "--trials", "0"], "--trials"),
    ("trials-negative", lambda f, s, st: ["search", "--space", s, "--trials", "-4"], "--trials"),
    ("trials-text", lambda f, s, st: ["search", "--space", s, "--trials", "many"], "'many' is not an integer"),
    ("negative-budget", lambda f, s, st: ["search", "--space", s, "--max-latency-ms", "-1"], "--max-latency-ms"),
    ("unknown-sampler", lambda f, s, st: ["search", "--space", s, "--sampler", "cmaes"], "--sampler"),
    ("cuda-missing", lambda f, s, st: ["search", "--space", s, "--device", "cuda"], "no CUDA device"),
    ("resume-other-space", lambda f, s, st: ["search", "--space", "hybrid_tiny", "--study", "keep"], "was created with"),
    ("unknown-study", lambda f, s, st: ["studies", "--study", "ghost"], "no study named 'ghost'"),
    ("unknown-profile-show", lambda f, s, st: ["profiles", "show", "tpu9"], "tpu9"),
    ("unknown-command", lambda f, s, st: ["frobnicate"], "invalid choice"),
    ("measure-without-gpu", lambda f, s, st: ["search", "--space", s, "--measure"], "--measure times"),
    ("measure-and-predict", lambda f, s, st: ["search", "--space", s, "--measure", "--predict"],
     "not allowed with argument --measure"),
    ("gpus-missing", lambda f, s, st: ["search", "--space", s, "--gpus", "0"], "no CUDA device 0"),
    ("gpus-malformed", lambda f, s, st: ["search", "--space", s, "--gpus", "0,zero"], "distinct device indices"),
    ("workers-zero", lambda f, s, st: ["search", "--space", s, "--workers", "0"], "--workers"),
    ("trial-timeout-negative", lambda f, s, st: ["search", "--space", s, "--trial-timeout", "-5"], "--trial-timeout"),
    ("worker-unknown-study", lambda f, s, st: ["worker", "--study", "ghost"], "no study named 'ghost'"),
    ("worker-foreign-study", lambda f, s, st: ["worker", "--study", "foreign"], "not created by nas search"),
    ("worker-trials-zero", lambda f, s, st: ["worker", "--study", "keep", "--trials", "0"], "--trials"),
    ("worker-bad-storage", lambda f, s, st: ["worker", "--study", "keep", "--storage", "mongodb://x"], "unsupported"),
    ("report-unknown-study", lambda f, s, st: ["report", "--study", "ghost"], "no study named 'ghost'"),
    ("report-no-study-flag", lambda f, s, st: ["report"], "--study"),
    ("export-unknown-trial", lambda f, s, st: ["export", "--study", "keep", "--trial", "999", "--out",
                                               str(f["dir"] / "x")], "has no trial 999"),
    ("export-nonempty-out", lambda f, s, st: ["export", "--study", "keep", "--out", str(f["nonempty"])],
     "exists and is not empty"),
    ("export-bad-pick", lambda f, s, st: ["export", "--study", "keep", "--pick", "cheapest", "--out", "x"], "--pick"),
    ("export-infeasible", lambda f, s, st: ["export", "--study", "keep", "--max-latency-ms", "1e-9", "--out",
                                            str(f["dir"] / "x")], "no front trial meets the budget"),
    ("export-retrain-zero", lambda f, s, st: ["export", "--study", "keep", "--retrain-steps", "0", "--out", "x"],
     "--retrain-steps"),
    ("export-no-out", lambda f, s, st: ["export", "--study", "keep"], "--out"),
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
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nas") and words in err, err
    assert study_checksum(storage, "keep") == before_sum
    assert hashlib.sha256(Path(storage).read_bytes()).hexdigest() == before_bytes
    assert (tmp / "full" / "mine.txt").read_text() == "keep me" and not (tmp / "adir" / "x").exists()


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
    monkeypatch.setattr("nas.search.interrupt._requested", False)
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
