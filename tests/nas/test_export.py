"""``nas export`` and ``nas.load``: exact weights, ONNX parity at several lengths, documented picks, errors."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import optuna
import pytest
import torch
import yaml

import nas
from nas.cli import main
from nas.results.export import trial_model
from nas.results.pareto import front, pick
from nas.search.record import records
from nas.search.storage import open_storage
from tests.conftest import write_space

pytestmark = pytest.mark.slow  # end-to-end: a nas search, then nas export and ONNX


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    storage = str(tmp / "s.journal")
    space = write_space(tmp, steps=30)
    assert main(["search", "--space", str(space), "--trials", "8", "--storage", storage, "--study", "e"]) == 0
    return optuna.load_study(study_name="e", storage=open_storage(storage)), storage, tmp


@pytest.fixture(scope="module")
def bundle(study):
    """The front's most accurate trial, exported once for the tests that read a bundle."""
    st, storage, tmp = study
    out = tmp / "bundle"
    assert (
        main(["export", "--study", "e", "--storage", storage, "--trial", str(front(st)[0].number), "--out", str(out)])
        == 0
    )
    return out


def _exported_trial(out) -> int:
    return json.loads((out / "arch.json").read_text())["trial"]


def test_export_load_bit_exact_and_onnx_matches(study, bundle):
    import onnxruntime as ort

    st, storage, _ = study
    out = bundle
    assert sorted(p.name for p in out.iterdir()) == ["arch.json", "card.md", "model.onnx", "model.safetensors"]
    record = json.loads((out / "arch.json").read_text())
    assert {"arch", "train", "task", "versions", "metrics", "latency"} <= set(record)
    assert "predicted" in (out / "card.md").read_text() and "nas.load" in (out / "card.md").read_text()

    stored = trial_model(records(st)[record["trial"]], storage)
    loaded = nas.load(out)
    session = ort.InferenceSession(str(out / "model.onnx"))
    gen = torch.Generator().manual_seed(0)
    for seq in (1, 16, 45, 65, 129):  # one token, the training length, longer, past one and two 64-token chunks
        tokens = torch.randint(0, loaded.arch.vocab_size, (3, seq), generator=gen)
        with torch.no_grad():
            expect, got = stored(tokens), loaded(tokens)
        assert torch.equal(expect, got)  # bit for bit
        onnx_logits = session.run(None, {"tokens": tokens.numpy()})[0]
        np.testing.assert_allclose(onnx_logits, expect.numpy(), rtol=0, atol=1e-4)


def test_an_onnx_graph_that_is_not_the_model_fails_the_export(study, capsys, monkeypatch):
    """The graph is run in onnxruntime before the bundle is kept: one that computes something
    other than the torch model (here the model moves once its graph is written) fails the export
    with one line and exit 2, and leaves neither the bundle nor its staging directory behind."""
    st, storage, tmp = study
    write = torch.onnx.export

    def write_then_move(model, *args, **kwargs):
        written = write(model, *args, **kwargs)
        with torch.no_grad():
            model.head.bias += 0.5
        return written

    monkeypatch.setattr(torch.onnx, "export", write_then_move)
    before = sorted(tmp.iterdir())
    argv = ["export", "--study", "e", "--storage", storage, "--trial", str(front(st)[0].number)]
    assert main([*argv, "--out", str(tmp / "wrong-graph")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no bundle was written" in err, err
    assert "model.onnx at tokens [1, 1] differs from the torch model by up to 0.5" in err, err
    assert sorted(tmp.iterdir()) == before


def _knee_by_hand(trials):
    """The README's rule: closest to (best accuracy, lowest latency) after min-max scaling both."""
    acc, lat = [t.accuracy for t in trials], [t.latency_ms for t in trials]

    def s(v, lo, hi):
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    return min(
        trials,
        key=lambda t: (
            math.hypot(1 - s(t.accuracy, min(acc), max(acc)), s(t.latency_ms, min(lat), max(lat))),
            -t.accuracy,
        ),
    )


def test_picks_choose_the_documented_trial(study):
    st, _, _ = study
    best = front(st)
    assert pick(st, "knee").number == _knee_by_hand(best).number
    assert pick(st, "accuracy").number == max(best, key=lambda t: (t.accuracy, -t.latency_ms)).number
    assert pick(st, "latency").number == min(best, key=lambda t: (t.latency_ms, -t.accuracy)).number
    budget = sorted(t.latency_ms for t in best)[len(best) // 2]
    within = [t for t in best if t.latency_ms <= budget]
    assert pick(st, "knee", max_latency_ms=budget).number == _knee_by_hand(within).number
    assert pick(st, "accuracy", max_latency_ms=budget).latency_ms <= budget


def test_cli_knee_with_budget_exports_that_trial(study):
    st, storage, tmp = study
    best = front(st)
    budget = sorted(t.latency_ms for t in best)[len(best) // 2]
    out = tmp / "knee"
    assert (
        main(
            [
                "export",
                "--study",
                "e",
                "--storage",
                storage,
                "--pick",
                "knee",
                "--max-latency-ms",
                str(budget),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert _exported_trial(out) == _knee_by_hand([t for t in best if t.latency_ms <= budget]).number


def test_retrain_steps_retrains(study, capsys):
    st, storage, tmp = study
    out = tmp / "retrained"
    chosen = front(st)[0]
    assert (
        main(
            [
                "export",
                "--study",
                "e",
                "--storage",
                storage,
                "--trial",
                str(chosen.number),
                "--retrain-steps",
                "60",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    record = json.loads((out / "arch.json").read_text())
    assert record["retrained_steps"] == 60 and record["train"]["steps"] == 60
    assert record["trained"] == {"steps": 60, "stopped": "completed"}
    # the console states the accuracy the bundle holds, not the study's
    printed = capsys.readouterr().out
    assert (
        f"accuracy {record['metrics']['accuracy']:.3f} after 60 retraining steps (study: {chosen.accuracy:.3f})"
        in printed
    )
    retrained = nas.load(out)
    original = trial_model(chosen, storage)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(retrained.state_dict().values(), original.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--study", "none-done", "--out", "X"], "no completed trial"),
        (["--study", "e", "--trial", "999", "--out", "X"], "has no trial 999"),
        (  # only the budget asked for is named (it said "max memory None MB")
            ["--study", "e", "--max-latency-ms", "0.000001", "--out", "X"],
            "no front trial meets the budget (max latency 1e-06 ms); the fastest",
        ),
        (  # a named trial was exported over the budget without a word
            ["--study", "e", "--trial", "1", "--max-latency-ms", "0.01", "--out", "X"],
            "--trial 1 exports that trial; --max-latency-ms chooses among the front's trials: drop it, or --trial",
        ),
        (
            ["--study", "e", "--trial", "1", "--max-memory-mb", "9", "--accuracy-epsilon", "0", "--out", "X"],
            "--max-memory-mb, --accuracy-epsilon choose among",
        ),
        (["--study", "e", "--out", "NONEMPTY"], "exists and is not empty"),
        (["--study", "ghost", "--out", "X"], "no study named 'ghost'"),
        (["--study", "e", "--trial", "1", "--pick", "latency", "--out", "X"], "not allowed with argument"),
    ],
    ids=[
        "no-completed-trial",
        "unknown-trial",
        "infeasible-budget",
        "trial-and-a-budget",
        "trial-and-epsilon",
        "non-empty-out",
        "unknown-study",
        "trial-and-pick",
    ],
)
def test_export_errors_one_line_exit_2(study, capsys, argv, words):
    st, storage, tmp = study
    from nas.search.study import open_study

    open_study("none-done", storage)
    (tmp / "nonempty").mkdir(exist_ok=True)
    (tmp / "nonempty" / "keep.txt").write_text("mine")
    argv = [str(tmp / "nonempty") if a == "NONEMPTY" else str(tmp / "x-out") if a == "X" else a for a in argv]
    assert main(["export", "--storage", storage, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert (tmp / "nonempty" / "keep.txt").read_text() == "mine" and not (tmp / "x-out").exists()


def test_force_replaces_an_earlier_bundle_only(study, bundle, capsys):
    """--force replaces what nas export wrote; a bundle folder the user put a file into is not one
    any more, so it is refused with one line and left as it was."""
    import shutil

    st, storage, tmp = study
    out = tmp / "again"
    shutil.copytree(bundle, out)
    other = next(r.number for r in records(st) if r.trained and r.number != _exported_trial(bundle))
    argv = ["export", "--study", "e", "--storage", storage, "--trial", str(other), "--out", str(out), "--force"]
    assert main(argv) == 0
    assert _exported_trial(out) == other
    assert sorted(p.name for p in out.iterdir()) == ["arch.json", "card.md", "model.onnx", "model.safetensors"]
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv[argv.index(str(other))] = str(_exported_trial(bundle))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not an export bundle" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_unreadable_weights_are_one_line_not_a_traceback(study, bundle, tmp_path, capsys):
    """Stored weights overwritten with garbage (export: exit 2, one line naming the trial), a bundle
    whose safetensors is garbage, holds another architecture's tensors, or whose arch.json has no
    architecture (nas.load: ExportError naming the file)."""
    import shutil

    from safetensors.torch import save_file

    from nas.results.export import ExportError
    from nas.search.storage import artifact_dir

    st, storage, tmp = study
    copy = tmp_path / "s.journal"
    shutil.copy(storage, copy)
    shutil.copytree(artifact_dir(storage), artifact_dir(str(copy)))
    chosen = _exported_trial(bundle)
    artifact = next(r.weights_artifact for r in records(st) if r.number == chosen)
    (artifact_dir(str(copy)) / artifact).write_bytes(b"\xff" * 64)
    out = tmp_path / "x"
    assert main(["export", "--study", "e", "--storage", str(copy), "--trial", str(chosen), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"stored weights of trial {chosen} cannot be read" in err, err
    assert not out.exists()
    broken = tmp_path / "b"
    shutil.copytree(bundle, broken)
    (broken / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ExportError, match="model.safetensors cannot be read"):
        nas.load(broken)
    save_file({"w": torch.zeros(2)}, str(broken / "model.safetensors"))
    with pytest.raises(ExportError, match="do not fit the architecture"):
        nas.load(broken)
    (broken / "arch.json").write_text(json.dumps({"trial": 1}))
    with pytest.raises(ExportError, match="no valid architecture"):
        nas.load(broken)


def test_load_backends(bundle):
    with pytest.raises(ValueError, match="backend 'onnx' is not one of"):
        nas.load(bundle, backend="onnx")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            nas.load(bundle, backend="triton")
    else:
        tm = nas.load(bundle, backend="triton")
        tokens = torch.randint(0, tm.arch.vocab_size, (2, 16), device="cuda")
        ref = nas.load(bundle).cuda()(tokens)
        assert ((tm(tokens).float() - ref).norm() / ref.norm()).item() < 3e-2


def test_bundle_files_are_shared_alike_and_the_card_has_a_metadata_header(bundle):
    modes = {p.name: p.stat().st_mode & 0o777 for p in bundle.iterdir()}
    assert modes["model.safetensors"] == modes["arch.json"] == modes["card.md"], modes  # it was written 0600
    card = (bundle / "card.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    record = json.loads((bundle / "arch.json").read_text())
    assert meta["library_name"] == "hybrid-nas" and "hybrid-nas" in meta["tags"] and "mqar" in meta["tags"]
    result = meta["model-index"][0]["results"][0]
    assert result["metrics"][0] == {"type": "accuracy", "value": round(record["metrics"]["accuracy"], 4)}


def test_card_counts_blocks_and_states_the_steps_trained(bundle):
    from nas.results.export import _card

    record = json.loads((bundle / "arch.json").read_text())
    one_block = {
        **record,
        "arch": {**record["arch"], "layers": record["arch"]["layers"][:1]},
        "trained": {"steps": 12, "stopped": "time budget"},
        "train": {**record["train"], "steps": 30},
    }
    card = _card(one_block)
    assert "1 block —" in card and "1 blocks" not in card
    assert "12 of 30 planned steps (stopped early: time budget) of batch" in card
    complete = {**record, "trained": {"steps": record["train"]["steps"], "stopped": "completed"}}
    assert f", {record['train']['steps']} steps of batch" in _card(complete)


def test_a_training_cut_short_is_exported_with_the_steps_it_took(tmp_path):
    """A 1 ns time budget stops every training after its first step (deterministically); the
    bundle records and shows 1 of 5 steps, not the recipe's 5."""
    space = write_space(tmp_path, steps=5)
    space.write_text(space.read_text().replace("max_train_seconds: 600", "max_train_seconds: 1.0e-9"))
    storage = str(tmp_path / "s.journal")
    assert (
        main(
            [
                "search",
                "--space",
                str(space),
                "--trials",
                "1",
                "--storage",
                storage,
                "--study",
                "cut",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert main(["export", "--study", "cut", "--storage", storage, "--trial", "0", "--out", str(tmp_path / "b")]) == 0
    record = json.loads((tmp_path / "b" / "arch.json").read_text())
    assert record["trained"] == {"steps": 1, "stopped": "time budget"} and record["train"]["steps"] == 5
    assert "1 of 5 planned steps" in (tmp_path / "b" / "card.md").read_text()


def test_readme_states_the_onnx_output_shape_of_both_readouts():
    """The bundle writes ``[batch, seq, n_out]`` logits for per-token targets and ``[batch, n_out]``
    for class labels (readout "last"); the README used to claim the first for every model."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "`[batch, seq, n_out]` for per-token targets, `[batch, n_out]` for class labels" in " ".join(readme.split())


def test_a_hand_edited_architecture_is_refused_by_its_hash(bundle, tmp_path):
    """An edit keeping every weight's shape (here the norm kind, or an activation) loaded the
    weights into another model silently: outputs differed by up to 0.035 (a new-user audit)."""
    import shutil

    from nas.results.export import ExportError
    from nas.spec import ArchSpec, arch_hash

    edited = tmp_path / "e"
    shutil.copytree(bundle, edited)
    record = json.loads((edited / "arch.json").read_text())
    layer = record["arch"]["layers"][0]
    layer["activation"] = "relu" if layer.get("activation") != "relu" else "silu"
    (edited / "arch.json").write_text(json.dumps(record))
    with pytest.raises(ExportError, match=r"arch.json: its architecture does not match its arch_hash '[0-9a-f]+'"):
        nas.load(edited)
    record["arch_hash"] = arch_hash(ArchSpec.from_dict(record["arch"]))  # what the message says to do
    (edited / "arch.json").write_text(json.dumps(record))
    assert nas.load(edited).arch == ArchSpec.from_dict(record["arch"])
    # a bundle of a version whose arch dict lacked a field now defaulted: its hash is of that dict
    older = json.loads((bundle / "arch.json").read_text())
    del older["arch"]["layers"][0]["norm"]
    blob = json.dumps(older["arch"], sort_keys=True, separators=(",", ":"))
    older["arch_hash"] = hashlib.sha256(blob.encode()).hexdigest()[:16]
    shutil.rmtree(edited)
    shutil.copytree(bundle, edited)
    (edited / "arch.json").write_text(json.dumps(older))
    assert nas.load(edited).arch == ArchSpec.from_dict(older["arch"])
