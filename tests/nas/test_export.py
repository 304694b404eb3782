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


@pytest.fixture(scope="module")
def linear_bundle(study):
    """A trained trial with a linear-attention layer (the all-linear baseline at least), exported:
    for edits that need a feature map and heads (the front's pick may be an empty block)."""
    st, storage, tmp = study
    trial = next(r for r in records(st) if r.trained and any(la.mixer == "linear_attention" for la in r.arch.layers))
    out = tmp / "linear-bundle"
    assert main(["export", "--study", "e", "--storage", storage, "--trial", str(trial.number), "--out", str(out)]) == 0
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
    """The guide's rule: closest to (best accuracy, lowest latency) after min-max scaling both."""
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
        f"accuracy {record['metrics']['accuracy']:.3f} after 60 retraining steps (study: {chosen.accuracy_text()})"
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
    # named by the artifact's path: the temporary copy it was read from is deleted by then
    whole = (artifact_dir(storage) / artifact).read_bytes()
    (artifact_dir(str(copy)) / artifact).write_bytes(whole[: len(whole) - 100])  # truncated: header sound
    assert main(["export", "--study", "e", "--storage", str(copy), "--trial", str(chosen), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"stored weights of trial {chosen} cannot be read" in err, err
    assert str(artifact_dir(str(copy)) / artifact) in err and "w.safetensors" not in err, err
    broken = tmp_path / "b"
    shutil.copytree(bundle, broken)
    (broken / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ExportError, match="model.safetensors cannot be read"):
        nas.load(broken)
    save_file({"w": torch.zeros(2)}, str(broken / "model.safetensors"))
    with pytest.raises(ExportError, match="do not fit the architecture"):
        nas.load(broken)
    (broken / "arch.json").write_text(json.dumps({"format": "hybrid-nas-bundle/1", "trial": 1}))
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
                "--no-baselines",  # a baseline has no time guard: it trains in full
            ]
        )
        == 0
    )
    assert main(["export", "--study", "cut", "--storage", storage, "--trial", "0", "--out", str(tmp_path / "b")]) == 0
    record = json.loads((tmp_path / "b" / "arch.json").read_text())
    assert record["trained"] == {"steps": 1, "stopped": "time budget"} and record["train"]["steps"] == 5
    assert "1 of 5 planned steps" in (tmp_path / "b" / "card.md").read_text()


def test_the_guide_states_the_onnx_output_shape_of_both_readouts():
    """The bundle writes ``[batch, seq, n_out]`` logits for per-token targets and ``[batch, n_out]``
    for class labels (readout "last"); the README used to claim the first for every model."""
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    assert "`[batch, seq, n_out]` for per-token targets, `[batch, n_out]` for class labels" in " ".join(guide.split())


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
    # re-hashed to match the edit: the weights' own arch_hash still names the exported architecture
    record["arch_hash"] = arch_hash(ArchSpec.from_dict(record["arch"]))
    (edited / "arch.json").write_text(json.dumps(record))
    with pytest.raises(ExportError, match=r"model.safetensors were trained for another architecture"):
        nas.load(edited)
    # a bundle of a version whose arch dict lacked a field now defaulted: its hash is of that dict
    older = json.loads((bundle / "arch.json").read_text())
    del older["arch"]["layers"][0]["norm"]
    blob = json.dumps(older["arch"], sort_keys=True, separators=(",", ":"))
    older["arch_hash"] = hashlib.sha256(blob.encode()).hexdigest()[:16]
    shutil.rmtree(edited)
    shutil.copytree(bundle, edited)
    (edited / "arch.json").write_text(json.dumps(older))
    assert nas.load(edited).arch == ArchSpec.from_dict(older["arch"])


def _rewrite(bundle, tmp_path, edit, *, rehash: bool = True):
    """A copy of ``bundle`` whose arch.json ``edit`` changed (in place), re-hashed as asked."""
    import shutil

    from nas.spec import ArchSpec, arch_hash

    copy = tmp_path / "edited"
    shutil.copytree(bundle, copy)
    record = json.loads((copy / "arch.json").read_text())
    edit(record)
    if rehash:
        record["arch_hash"] = arch_hash(ArchSpec.from_dict(record["arch"]))
    (copy / "arch.json").write_text(json.dumps(record))
    return copy


def _relu(record) -> None:
    """An edit of the architecture that keeps every weight's shape: a linear layer's feature map."""
    layer = _linear_layer(record)
    layer["feature_map"] = "relu" if layer["feature_map"] != "relu" else "elu+1"


def _linear_layer(record) -> dict:
    return next(la for la in record["arch"]["layers"] if la["mixer"] == "linear_attention")


def test_weights_of_another_architecture_are_refused_by_their_own_hash(study, linear_bundle, tmp_path):
    """model.safetensors carries the arch_hash it was trained for: a feature map (or activation)
    edited in arch.json with the arch_hash dropped (or re-hashed), or weights of another trial of the same
    shapes copied in, loaded silently into another model; weights without one (older) still load."""
    import shutil

    from safetensors.torch import load_file, save_file

    from nas.results.export import ExportError
    from nas.search.storage import artifact_dir

    dropped = _rewrite(linear_bundle, tmp_path, lambda r: (_relu(r), r.pop("arch_hash")), rehash=False)
    with pytest.raises(ExportError, match=r"model.safetensors were trained for another architecture \(their arch_hash"):
        nas.load(dropped)
    shutil.rmtree(dropped)
    with pytest.raises(ExportError, match="trained for another architecture"):
        nas.load(_rewrite(linear_bundle, tmp_path, _relu))
    # the weights without metadata (no version wrote them so, but a hand-made bundle may): load
    shutil.rmtree(tmp_path / "edited")
    plain = _rewrite(linear_bundle, tmp_path, lambda r: None, rehash=False)
    save_file(load_file(str(plain / "model.safetensors")), str(plain / "model.safetensors"))
    assert nas.load(plain).arch == nas.load(linear_bundle).arch
    # the search's stored weights: an artifact holding another architecture's is refused, naming the trial
    st, storage, _ = study
    copy = tmp_path / "s.journal"
    shutil.copy(storage, copy)
    shutil.copytree(artifact_dir(storage), artifact_dir(str(copy)))
    chosen = next(r for r in records(st) if r.number == _exported_trial(linear_bundle))
    stored = artifact_dir(str(copy)) / chosen.weights_artifact
    save_file(load_file(str(stored)), str(stored), metadata={"arch_hash": "0123456789abcdef"})
    with pytest.raises(ExportError, match=rf"stored weights of trial {chosen.number} were trained for another"):
        trial_model(chosen, str(copy))


def test_a_large_model_s_onnx_external_data_is_part_of_the_bundle(study, bundle, tmp_path, monkeypatch):
    """Past torch's size threshold (1.5 GiB of weights) the ONNX exporter writes model.onnx.data
    beside model.onnx whatever external_data says: a 5th file the card did not name and --force
    refused to replace. The threshold is lowered so a tiny model takes that path."""
    from torch.onnx._internal.exporter import _onnx_program

    st, storage, _ = study
    trial = str(_exported_trial(bundle))
    out = tmp_path / "big"
    argv = ["export", "--study", "e", "--storage", storage, "--trial", trial, "--out", str(out)]
    with monkeypatch.context() as m:
        m.setattr(_onnx_program, "_LARGE_MODEL_THRESHOLD", 0)
        assert main(argv) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["arch.json", "card.md", "model.onnx", "model.onnx.data", "model.safetensors"], names
    assert json.loads((out / "arch.json").read_text())["onnx"]["external_data"] == "model.onnx.data"
    assert "`model.onnx.data`" in (out / "card.md").read_text()
    assert nas.load(out).arch == nas.load(bundle).arch
    # --force replaces it with a small model's bundle, which has no model.onnx.data
    assert main([*argv, "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["arch.json", "card.md", "model.onnx", "model.safetensors"]
    assert json.loads((out / "arch.json").read_text())["onnx"]["external_data"] is None
    assert "model.onnx.data" not in (out / "card.md").read_text()


def test_out_dot_exports_into_the_current_folder(study, bundle, tmp_path, monkeypatch, capsys):
    """--out . staged inside itself (Path(".").parent is ".") and then failed after the whole
    export as "exists and is not empty"; the folder is filled in place, so a shell in it stays in it."""
    st, storage, _ = study
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    argv = ["export", "--study", "e", "--storage", storage, "--trial", str(_exported_trial(bundle)), "--out"]
    assert main([*argv, "."]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in here.iterdir()) == ["arch.json", "card.md", "model.onnx", "model.safetensors"]
    assert here.stat().st_ino == inode and nas.load(".").arch == nas.load(bundle).arch
    assert main([*argv, ".", "--force"]) == 0  # and replaced there
    assert sorted(p.name for p in here.iterdir()) == ["arch.json", "card.md", "model.onnx", "model.safetensors"]
    capsys.readouterr()
    assert main([*argv, ""]) == 2  # Path("") is "."; an empty --out is a mistake (an unset variable)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out is empty" in err, err


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--retrain-steps", "99999999999"], "--retrain-steps must be in [1, 1000000], got 99,999,999,999"),
        (["--retrain-steps", "2", "--data", "/nonexist"], "trains on the generated task 'mqar', which has no data"),
        (["--out", "x" * 300], "cannot use it (File name too long)"),
    ],
    ids=["retrain-steps-past-the-space-limit", "data-for-a-generated-task", "out-name-too-long"],
)
def test_more_export_errors_one_line_exit_2(study, bundle, tmp_path, monkeypatch, capsys, extra, words):
    st, storage, _ = study
    monkeypatch.chdir(tmp_path)
    argv = ["export", "--study", "e", "--storage", storage, "--trial", str(_exported_trial(bundle)), "--out", "o"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_success_line_names_the_trial_once_and_the_card_each_norm(study, linear_bundle, tmp_path, capsys):
    st, storage, _ = study
    trial = _exported_trial(linear_bundle)
    out = tmp_path / "o"
    assert main(["export", "--study", "e", "--storage", storage, "--trial", str(trial), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"exported trial {trial}: " in printed and f"(trial {trial})" not in printed, printed
    arch = json.loads((out / "arch.json").read_text())["arch"]
    architecture = " ".join((out / "card.md").read_text().split("Architecture:")[1].split("Task:")[0].split())
    assert architecture.count("norm)") == sum(1 for la in arch["layers"] if la["mixer"] != "none" or la["mlp_ratio"])
    assert f"({arch['layers'][0]['norm']})" in architecture


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda r: r.__setitem__("format", "hybrid-nas-bundle/99"), "written by a newer version of hybrid-nas"),
        (lambda r: r.pop("format"), "has no format field, which nas export always writes"),
        (lambda r: r.__setitem__("format", "something-else/1"), "unknown format 'something-else/1'"),
        (lambda r: r["arch"].__setitem__("tie_embeddings", True), "arch has fields this version does not know"),
        (lambda r: r["arch"]["layers"][0].__setitem__("qk_norm", True), "arch.layers[0] has fields this version"),
        (lambda r: r["arch"]["layers"][0].__setitem__("mlp_ratio", math.inf), "mlp_ratio inf is not finite"),
        (lambda r: r["arch"].__setitem__("d_model", float(r["arch"]["d_model"])), ".0 is not a whole number"),
        (lambda r: _linear_layer(r).__setitem__("heads", float(_linear_layer(r)["heads"])), "is not a whole number"),
        (lambda r: r["arch"].__setitem__("vocab_size", 10**15), "vocab_size 1000000000000000 is out of range"),
        (lambda r: r["arch"].__setitem__("layers", None), "arch.layers None is not a list of layers"),
        (lambda r: r.__setitem__("arch_hash", [1]), "does not match its arch_hash [1]"),
    ],
    ids=[
        "newer-format",
        "no-format",
        "unknown-format",
        "future-field",
        "future-layer-field",
        "infinite-mlp-ratio",
        "float-d-model",
        "float-heads",
        "huge-vocab",
        "null-layers",
        "hash-not-a-string",
    ],
)
def test_a_tampered_arch_json_is_one_export_error(linear_bundle, tmp_path, edit, words):
    """Hand-edited values (re-hashed, so only the value is wrong) gave OverflowError, TypeError,
    an allocator error, or loaded and failed in forward; a newer or missing format loaded."""
    from nas.results.export import ExportError

    def edit_and_rehash(record):
        before = record["arch_hash"]
        edit(record)
        if record.get("arch_hash") == before:  # re-hashed as the loader hashes it: only the edited value is wrong
            blob = json.dumps(record["arch"], sort_keys=True, separators=(",", ":"))
            record["arch_hash"] = hashlib.sha256(blob.encode()).hexdigest()[:16]

    edited = _rewrite(linear_bundle, tmp_path, edit_and_rehash, rehash=False)
    with pytest.raises(ExportError) as caught:
        nas.load(edited)
    assert words in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_an_edited_size_is_checked_against_the_weights_before_anything_is_built(bundle, tmp_path, monkeypatch):
    """A size edited within the bounds (vocab_size near the limit) is read against the weights'
    header first: the model is not allocated for tensors the file does not hold. The weights here
    carry no arch_hash (a hand-made file), so the shapes are what catches it."""
    from safetensors.torch import load_file, save_file

    import nas.results.export as export_module
    from nas.results.export import ExportError

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before its weights' shapes were checked")

    edited = _rewrite(bundle, tmp_path, lambda r: r["arch"].__setitem__("vocab_size", 1_000_000))
    save_file(load_file(str(edited / "model.safetensors")), str(edited / "model.safetensors"))
    monkeypatch.setattr(export_module, "build", no_build)
    with pytest.raises(ExportError, match=r"do not fit the architecture \(embed.weight is \[\d+, \d+\]"):
        nas.load(edited)


def test_a_trial_stored_below_full_precision_exports_and_loads_with_its_dtypes(tmp_path):
    """A study whose candidates store an fp8 KV cache and weights and a bf16 state: arch.json and
    the card state the dtypes and the accuracy against full precision; nas.load rebuilds the model
    with them, and its forward rounds as the search scored it (its accuracy on the study's task is
    the kept weights' recorded one); model.onnx is the full-precision model's."""
    from nas.results.export import study_task
    from nas.train import evaluate

    block = "precision:\n  kv_dtype: [fp8]\n  state_dtype: [bf16]\n  weight_dtype: [fp8]\n"
    storage = str(tmp_path / "s.journal")
    space = write_space(tmp_path, steps=10, extra=block)
    assert main(["search", "--space", str(space), "--trials", "3", "--storage", storage, "--study", "q"]) == 0
    st = optuna.load_study(study_name="q", storage=open_storage(storage))
    r = next(r for r in records(st) if r.trained and {la.mixer for la in r.arch.layers} >= {"attention"})
    assert r.arch.precision_text().startswith("kv fp8") and r.full_precision_accuracy is not None
    out = tmp_path / "bundle"
    assert main(["export", "--study", "q", "--storage", storage, "--trial", str(r.number), "--out", str(out)]) == 0
    record = json.loads((out / "arch.json").read_text())
    attention = next(i for i, la in enumerate(r.arch.layers) if la.mixer == "attention")
    assert record["arch"]["layers"][attention]["kv_dtype"] == "fp8"
    assert record["precision"]["layers"][attention] == {"kv_dtype": "fp8", "weight_dtype": "fp8"}
    assert record["precision"]["summary"] == r.arch.precision_text()
    assert record["metrics"]["accuracy"] == r.accuracy == record["precision"]["accuracy"]
    assert record["precision"]["full_precision_accuracy"] == r.full_precision_accuracy
    assert record["precision"]["accuracy_cost"] == pytest.approx(r.full_precision_accuracy - r.accuracy)
    card = (out / "card.md").read_text()
    assert f"| precision | {r.arch.precision_text()}: accuracy {r.accuracy:.4f} at it; at full precision" in card
    assert "not priced at kv fp8" in card and "stored_precision(False)" in card
    # a loaded model decodes as stored: the card says so, shows how, and names the decoder that times it
    assert "whose `prefill` / `step` decode so" in card and "StoredDecoder" in card
    assert "logits, cache = model.prefill(prompt, capacity=n)" in card and "model.step(next_tokens, cache)" in card

    loaded = nas.load(out)
    assert loaded.arch == r.arch and loaded.at_stored_precision
    logits, cache = loaded.prefill(torch.zeros(1, 4, dtype=torch.long), capacity=5)
    assert cache.layers[attention].k.dtype == torch.float8_e4m3fn and cache.layers[attention].k_scale is not None
    assert loaded.step(torch.zeros(1, dtype=torch.long), cache).isfinite().all()
    stored = trial_model(r, storage)
    tokens = torch.randint(0, r.arch.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = stored(tokens)
        assert torch.equal(loaded(tokens), stored.stored_precision()(tokens))
        assert not torch.equal(loaded(tokens), full)
    task = study_task(st)
    assert evaluate(loaded, task, torch.device("cpu"))[0] == r.population["weights"]["accuracy"]
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"))
    (onnx,) = session.run(None, {"tokens": tokens.numpy()})
    np.testing.assert_allclose(onnx, full.numpy(), rtol=1e-4, atol=1e-4)


def test_the_card_s_precision_rows_name_the_stored_dtypes_and_a_negative_cost_in_words():
    from nas.results.export import _latency_row, _precision_row

    lat = {"median_ms": 0.03, "iqr_ms": 0.0, "source": "predicted", "device": "h200", "dtype": "bf16"}
    lat |= {"shape": "1x32768", "interval": 0.48, "basis": "h200, calibrated 2026-12-03", "kind": "decode"}
    row = _latency_row("decode latency (per token)", lat, "one step at context 32,768", "kv fp8, weights fp8")
    assert "(bf16 activations, kv fp8, weights fp8, one step at context" in row
    assert "(bf16, one step" in _latency_row("decode latency (per token)", lat, "one step")
    r = {"metrics": {"accuracy": 0.15}, "precision": {"summary": "kv fp8", "full_precision_accuracy": 0.14}}
    r["precision"]["accuracy_cost"] = 0.14 - 0.15
    assert "at full precision 0.1400 (0.0100 higher at the stored precision)" in _precision_row(r)
    r["precision"] |= {"full_precision_accuracy": 0.17, "accuracy_cost": 0.17 - 0.15}
    assert "at full precision 0.1700 (cost 0.0200)" in _precision_row(r)
