"""Export bundle: ``arch.json``, ``model.safetensors``, ``model.onnx``, ``card.md``; and ``load``.

``export(study, trial, out)`` writes the bundle of one trial (its stored weights, or weights
retrained for longer); ``load(path)`` rebuilds the torch model from a bundle with one call.
A model whose ONNX weights are too large for one protobuf file also gets ``model.onnx.data``
(the graph's external data, which torch's exporter writes beside ``model.onnx``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from optuna.artifacts import download_artifact
from safetensors.torch import load_file, save_file

from nas.latency import Latency
from nas.models import HybridModel, TritonModel, build, to_triton
from nas.results.fidelity import Fidelity, fidelity
from nas.results.onnx_model import ONNX_OPSET, check_onnx, write_onnx
from nas.search.objectives import BY_METRIC
from nas.search.record import TrialRecord, population_text, study_objectives, study_profile, study_setup, verified
from nas.search.setup import SearchSetup
from nas.search.storage import artifact_dir, file_in_the_way, open_artifact_store, output_clash
from nas.space import LIMITS
from nas.spec import PRECISION_FIELDS, ArchSpec, LayerSpec, TrainSpec, arch_hash
from nas.tasks import MAX_VOCAB, Task, TaskError, task_moved

__all__ = ["ONNX_OPSET", "ExportError", "check_out", "export", "load", "study_task", "trial_model"]

logger = logging.getLogger(__name__)

BUNDLE_FILES = ("arch.json", "model.safetensors", "model.onnx", "card.md")
# torch's ONNX exporter moves the weights of a large graph (over 1.5 GiB of initializers; protobuf
# cannot hold 2 GiB) into this file beside model.onnx, whatever external_data says: part of the bundle
ONNX_DATA = "model.onnx.data"
BUNDLE_FORMAT = "hybrid-nas-bundle/1"  # every version so far has written this one


class ExportError(ValueError):
    """The export cannot be written as asked; the message says why."""


def _versions() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "hybrid-nas": version("hybrid-nas"),
        "torch": torch.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
    }


def trial_model(trial: TrialRecord, storage: str) -> HybridModel:
    """The trained model of a completed trial, rebuilt from its arch and stored weights (CPU)."""
    artifact = trial.weights_artifact
    if artifact is None:
        raise ExportError(
            f"trial {trial.number} has no stored weights (it was not trained: "
            f"{trial.skipped_training or 'no weights artifact'}); use --retrain-steps"
        )
    what = f"the stored weights of trial {trial.number}"
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "w.safetensors")
        try:
            download_artifact(
                artifact_store=open_artifact_store(storage, create=False), file_path=path, artifact_id=artifact
            )
        except Exception as e:  # the store raises its own not-found types per backend
            raise ExportError(f"weights of trial {trial.number} are missing from the artifact store ({e})") from None
        # named by where the artifact lives: the temporary copy is gone by the time the user reads it
        model = _load_weights(
            trial.arch,
            path,
            what,
            where=str(artifact_dir(storage) / artifact),
            hashes={arch_hash(trial.arch)},
            ours=f"the trial's {arch_hash(trial.arch)!r}",
            fix="use --retrain-steps to train the trial's architecture afresh",
        )
    return model.eval()


def _load_weights(
    arch: ArchSpec, path: str | Path, what: str, *, where: str, hashes: set[str], ours: str, fix: str
) -> HybridModel:
    """``arch``'s model holding the weights of the safetensors file ``path`` (shown as ``where``),
    or ExportError naming ``what`` when the file is not one (truncated, overwritten), was written
    for another architecture (its ``arch_hash`` metadata is none of ``hashes``, the arch's, shown
    as ``ours``; a file without one predates it), or holds other tensors than the arch's. The
    header is read first and the model allocated only once its tensors fit: a size edited into
    arch.json (d_model 64 → 16384) cannot fill the memory."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            stored_hash = (f.metadata() or {}).get("arch_hash")
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ExportError(f"{what} cannot be read ({'' if where == what else f'{where}: '}{e})") from None
    if stored_hash is not None and stored_hash not in hashes:
        # an edit of the arch that keeps every weight's shape (a feature map, an activation, a
        # norm), or another export's weights copied in, would load into a model they were not trained in
        raise ExportError(
            f"{what} were trained for another architecture (their arch_hash {stored_hash!r}, {ours}); {fix}"
        )
    with torch.device("meta"):  # shapes only: nothing is allocated
        expected = {k: list(v.shape) for k, v in HybridModel(arch).state_dict().items()}
    if shapes != expected:
        missing, unexpected = sorted(expected.keys() - shapes.keys()), sorted(shapes.keys() - expected.keys())
        misshaped = [
            f"{k} is {shapes[k]}, the architecture's {v}" for k, v in expected.items() if shapes.get(k, v) != v
        ]
        found = [f"missing {', '.join(missing)}"] if missing else []
        found += [f"unexpected {', '.join(unexpected)}"] if unexpected else []
        raise ExportError(f"{what} do not fit the architecture ({'; '.join(found + misshaped)[:300]})")
    model = build(arch)
    try:
        model.load_state_dict(load_file(str(path)))
    except (SafetensorError, OSError, RuntimeError) as e:  # the data past a sound header is cut off
        first = str(e).strip().splitlines()
        at = "" if where == what else f"{where}: "
        raise ExportError(f"{what} cannot be read ({at}{' '.join(first[:2])[:300]})") from None
    return model


def _retrain(
    trial: TrialRecord, task: Task, steps: int, device: str
) -> tuple[HybridModel, float, float | None, dict[str, Any]]:
    """(model, accuracy, accuracy at full precision, what training did) for ``trial``'s candidate
    trained ``steps`` steps afresh (the accuracy at its stored precision, ``nas.train.train``)."""
    from nas.train import train

    spec = dataclasses.replace(trial.train, steps=steps)
    model = build(trial.arch, task, seed=spec.seed)
    result = train(model, task, spec, device=device)
    trained = {"steps": result.steps, "stopped": result.stopped}
    return model.to("cpu").eval(), result.accuracy, result.full_precision_accuracy, trained


def study_task(study: optuna.Study, data: str | None = None) -> Task:
    """The task ``study`` searched on, rebuilt from its record to train on again; ``data``: where
    its data file is now, when it moved (the same bytes only). ExportError when it cannot be."""
    setup = study_setup(study)
    task_config = dict(setup.task_config) if setup is not None and setup.task_config else None
    if task_config is None:
        raise ExportError(f"study {study.study_name!r} does not record its task; cannot retrain")
    if data is not None and "sha256" not in task_config:
        raise ExportError(
            f"--data names where the study's data file is now, but study {study.study_name!r} trains on the "
            f"generated task {task_config.get('name', '?')!r}, which has no data file; drop --data"
        )
    try:
        task, _ = task_moved(task_config, data)
    except TaskError as e:
        raise ExportError(
            f"study {study.study_name!r} retrains on the data it was created with: {e}; restore that file, "
            f"or name where it is now with --data PATH"
        ) from None
    return task


def _is_bundle(out: Path) -> bool:
    """Whether directory ``out`` holds what an earlier export wrote and nothing else: bundle files
    only (``model.onnx.data`` too: a large model's), and an ``arch.json`` of the bundle format.
    Only such a directory may be replaced."""
    entries = list(out.iterdir())
    names = (*BUNDLE_FILES, ONNX_DATA)
    if not entries or any(e.name not in names or e.is_symlink() or not e.is_file() for e in entries):
        return False
    try:
        record = json.loads((out / "arch.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and str(record.get("format", "")).startswith("hybrid-nas-bundle/")


def check_out(out: Path, storage: str, *, force: bool) -> None:
    """ExportError unless the bundle may be written to ``out``: apart from the study's journal,
    database and artifacts (``storage``), below directories only, and absent, an empty directory,
    or (with ``force``) an earlier bundle. Checked before anything is written or removed."""
    try:
        _check_out(out, storage, force=force)
    except OSError as e:  # a name too long for the file system, a directory it may not read
        raise ExportError(f"--out {out}: cannot use it ({e.strerror or e})") from None


def _check_out(out: Path, storage: str, *, force: bool) -> None:
    if (clash := output_clash(out, storage)) is not None:
        raise ExportError(f"--out {out} {clash}; export to another directory")
    if (blocker := file_in_the_way(out)) is not None:
        raise ExportError(f"--out {out}: {blocker} is a file, not a directory")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"--out {out} exists and is not a directory; give a directory path for the bundle")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ExportError(f"--out {out} exists and is not empty; pass --force to replace an earlier export bundle")
    if not _is_bundle(out):
        raise ExportError(
            f"--out {out} is not an export bundle (it holds files other than {', '.join(BUNDLE_FILES)} and "
            f"{ONNX_DATA}); --force replaces only a bundle nas export wrote"
        )


def _move_in(staging: Path, out: Path) -> None:
    """Put the bundle written in ``staging`` at ``out``: absent, an empty directory or an earlier
    bundle (``check_out``). An existing directory is kept and filled, not replaced: it may be the
    folder the user's shell is in (``--out .``), and its owner and mode are theirs. Each new file
    replaces its old one in one rename; old files the new bundle lacks (``model.onnx.data`` of a
    larger model) are removed after."""
    if not out.exists():
        staging.chmod(0o755)  # mkdtemp makes it private; a bundle is meant to be shared
        staging.rename(out)
        return
    written = {p.name for p in staging.iterdir()}
    for name in sorted(written):
        os.replace(staging / name, out / name)
    for old in out.iterdir():
        if old.name not in written:  # check_out allowed bundle files only
            old.unlink()


def export(
    study: optuna.Study,
    trial: TrialRecord,
    out: str | Path,
    *,
    storage: str,
    retrain_steps: int | None = None,
    force: bool = False,
    device: str = "cpu",
    data: str | None = None,
) -> Path:
    """Write the bundle of ``trial`` into ``out``: absent or an empty directory, or with ``force``
    an earlier bundle, which is replaced (``check_out``). ``data``: where the study's data file is
    now, for a retraining when it is no longer at the recorded path (the same bytes only)."""
    if str(out) == "":  # Path("") is ".": an empty --out (an unset shell variable) is not the current folder
        raise ExportError("--out is empty; give a directory path for the bundle (--out . for this folder)")
    out = Path(out)
    check_out(out, storage, force=force)
    steps_limit = LIMITS["train.steps"]
    if retrain_steps is not None and not steps_limit.holds(retrain_steps):
        # the bound a space's train.steps has: past it a typo would only allocate or run for days
        raise ExportError(f"--retrain-steps must be {steps_limit}, got {retrain_steps:,}")
    setup = study_setup(study)
    task_config = dict(setup.task_config) if setup is not None and setup.task_config else None
    if retrain_steps is None:
        model, accuracy, full = trial_model(trial, storage), trial.accuracy, trial.full_precision_accuracy
        # the steps the search actually trained: a time budget may have stopped it before train.steps
        trained = {"steps": trial.steps_done, "stopped": trial.stopped}
    else:
        model, accuracy, full, trained = _retrain(trial, study_task(study, data), retrain_steps, device)
    arch = model.arch
    train = trial.train
    if retrain_steps is not None:
        train = dataclasses.replace(train, steps=retrain_steps)

    # staged beside out, so the final rename stays on one file system; beside it once resolved:
    # Path(".").parent is "." itself, and the staging folder would land inside the output folder
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=parent))
    except OSError as e:
        raise ExportError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    try:
        record = _arch_record(study, trial, arch, train, task_config, setup, retrain_steps, trained, accuracy, full)
        _write_bundle(model, record, staging, task_config)
        check_out(out, storage, force=force)  # again: a retraining may have run for minutes since
        _move_in(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("exported trial %d of %s to %s", trial.number, study.study_name, out)
    return out


def _arch_record(
    study: optuna.Study,
    trial: TrialRecord,
    arch: ArchSpec,
    train: TrainSpec,
    task_config: dict[str, Any] | None,
    setup: SearchSetup | None,
    retrain_steps: int | None,
    trained: dict[str, Any],
    accuracy: float | None,
    full_precision_accuracy: float | None = None,
) -> dict[str, Any]:
    """The bundle's ``arch.json``: what was exported, from which trial, and what it costs."""
    return {
        "format": "hybrid-nas-bundle/1",
        "arch": arch.to_dict(),
        "arch_hash": arch_hash(arch),
        "train": train.to_dict(),
        "task": task_config,
        "study": study.study_name,
        "trial": trial.number,
        "retrained_steps": retrain_steps,
        "trained": trained,
        "objectives": [o.name for o in study_objectives(study)],
        # by TrialRecord.value: a latency nas measure timed since the search, else the stored one
        "metrics": {**_known_metrics(trial), "accuracy": accuracy},
        # how the KV cache, state and weights are stored, and what that costs in accuracy
        "precision": _precision_record(arch, accuracy, full_precision_accuracy),
        # the search's accuracy is a mean over seeds: its spread and what was trained (a
        # retrained bundle's accuracy is of one run, so it has neither)
        "accuracy_interval": trial.accuracy_interval if retrain_steps is None else None,
        "population": dict(trial.population) if trial.population and retrain_steps is None else None,
        "latency": lat.to_dict() if (lat := trial.latency_of("latency_ms")) is not None else None,
        # the search's prediction of a latency nas measure timed since (None: not measured)
        "predicted_latency": lat.to_dict() if (lat := trial.prediction_of("latency_ms")) is not None else None,
        "generation": _generation(trial, setup),
        "latency_label": trial.latency_label(),
        "proxy_fidelity": _proxy_fidelity(study, trial),
        "memory": dict(trial.memory),
        # a memory objective over the target GPU's memory, in words (empty: it fits, or unknown)
        "over_device_memory": trial.over_device(study_objectives(study), study_profile(study)),
        "params": trial.params,
        "versions": _versions(),
        "exported": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "onnx": {
            "opset": ONNX_OPSET,
            "inputs": {"tokens": "int64 [batch, seq]"},
            "outputs": {
                "logits": "float32 [batch, seq, n_out]" if arch.readout == "token" else "float32 [batch, n_out]"
            },
            "external_data": None,
        },
    }


def _write_bundle(
    model: HybridModel, record: dict[str, Any], staging: Path, task_config: dict[str, Any] | None
) -> None:
    """Write the bundle's files into ``staging``: the ONNX graph (checked against ``model``), then
    ``arch.json``, the weights and the model card; ExportError when the graph is wrong."""
    write_onnx(model, staging / "model.onnx")
    seq_len = (task_config or {}).get("seq_len")  # an .npz task's config has none
    if mismatch := check_onnx(model, staging / "model.onnx", None if seq_len is None else int(seq_len)):
        raise ExportError(f"the exported ONNX graph is wrong, so no bundle was written: {mismatch}")
    written = {p.name for p in staging.iterdir()}
    if extra := written - {"model.onnx", ONNX_DATA}:  # a bundle --force could not replace later
        raise ExportError(f"the ONNX exporter wrote {', '.join(sorted(extra))} too, so no bundle was written")
    if ONNX_DATA in written:
        record["onnx"]["external_data"] = ONNX_DATA
    (staging / "arch.json").write_text(json.dumps(record, indent=2) + "\n")
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(staging / "model.safetensors"),
        metadata={"arch_hash": arch_hash(model.arch)},
    )
    # safetensors creates its file private (0600); the bundle is meant to be shared like its other files
    (staging / "model.safetensors").chmod((staging / "arch.json").stat().st_mode & 0o777)
    (staging / "card.md").write_text(_card(record))


def _precision_record(arch: ArchSpec, accuracy: float | None, full: float | None) -> dict[str, Any] | None:
    """``arch.json``'s ``precision``: each layer's dtypes (those that apply to it), the accuracy at
    them (``metrics.accuracy``) against the same weights' at full precision, and how the values
    are rounded; None for an architecture at full precision."""
    if arch.full_precision:
        return None
    layers = [{name: getattr(la, name) for name in PRECISION_FIELDS if la.stores(name)} for la in arch.layers]
    return {
        "summary": arch.precision_text(),
        "layers": layers,
        "accuracy": accuracy,
        "full_precision_accuracy": full,
        "accuracy_cost": None if accuracy is None or full is None else full - accuracy,
        "rounding": (
            "fp8 e4m3 with fp32 scales (amax / 448): per sequence and head for the KV cache, per output "
            "channel for linear weights; a bf16 state rounded after each token's update"
        ),
    }


def _known_metrics(trial: TrialRecord) -> dict[str, float]:
    """Every cost the trial recorded, by metric name, whether or not the study optimised it."""
    found = {m: trial.value(m) for m in BY_METRIC}
    return {m: v for m, v in found.items() if v is not None}


def _proxy_fidelity(study: optuna.Study, trial: TrialRecord) -> dict[str, Any] | None:
    """The study's proxy fidelity (``nas verify``) and this trial's long-run accuracy when it was
    one of the verified trials; None for a study never verified."""
    found = fidelity(study)
    if found is None:
        return None
    row = verified(study).get(trial.number)
    return {**found.to_dict(), "trial_accuracy": None if row is None else row.accuracy}


def _fidelity_text(r: dict[str, Any]) -> str:
    """The card's paragraph on how far the search's short-run accuracy can be trusted to rank."""
    data = r.get("proxy_fidelity")
    if not data:
        return ""
    found = Fidelity.from_dict(data)
    own = data.get("trial_accuracy")
    this = f" This trial after {found.steps_factor:g}× its steps: accuracy {own:.4f}." if own is not None else ""
    return "\n`nas verify`: " + "; ".join(found.lines()) + f".{this}\n"


def _generation(trial: TrialRecord, setup: SearchSetup | None) -> dict[str, Any] | None:
    """The generation costs at the study's context (None for a study without one)."""
    if setup is None or not setup.context:
        return None
    return {
        "context": setup.context,
        "decode_batch": setup.decode_batch,
        "prefill_latency": lat.to_dict() if (lat := trial.latency_of("prefill_latency_ms")) is not None else None,
        "decode_latency": lat.to_dict() if (lat := trial.latency_of("decode_latency_ms")) is not None else None,
        "cache": trial.memory.get("cache"),
    }


def _decode_example(r: dict[str, Any]) -> str:
    """The card's lines on generating with the model (a ``token`` readout only)."""
    if r["arch"].get("readout", "token") != "token":
        return ""
    return (
        "\nlogits, cache = model.prefill(prompt, capacity=n)  # prompt: int64 [batch, t]; room for n tokens in all"
        "\nnext_logits = model.step(next_tokens, cache)     # next_tokens: int64 [batch]; cache advances in place"
    )


def _latency_row(name: str, lat: dict[str, Any], what: str, stored: str = "") -> str:
    """A card table row for a latency: median, interval or IQR, measured or predicted, and where
    (``stored``: the precision a decode step was priced at, beside the activations' dtype)."""
    if lat.get("interval"):
        low, high = lat["median_ms"] * (1 - lat["interval"]), lat["median_ms"] * (1 + lat["interval"])
        spread = f" (interval {low:.4g}–{high:.4g} ms)"
    elif lat.get("iqr_ms"):
        spread = f" ± {lat['iqr_ms']:.4g} (IQR)"
    else:
        spread = ""
    latency = Latency.from_dict(lat)
    label = f"measured on {latency.device}" if latency.source == "measured" else latency.label()
    dtype = f"{lat.get('dtype', '?')} activations, {stored}" if stored else lat.get("dtype", "?")
    return f"| {name} | {lat['median_ms']:.4g} ms{spread}, **{label}** ({dtype}, {what}) |\n"


def _generation_rows(r: dict[str, Any]) -> str:
    """Card rows for decoding at the study's context: per-token latency, prefill, cache bytes."""
    g = r.get("generation")
    if not g:
        return ""
    at = f"{g['context']:,} tokens × {g['decode_batch']}"
    rows = ""
    if g.get("decode_latency"):
        stored = (r.get("precision") or {}).get("summary", "")
        rows += _latency_row("decode latency (per token)", g["decode_latency"], f"one step at context {at}", stored)
    if g.get("prefill_latency"):
        rows += _latency_row("prefill latency", g["prefill_latency"], f"forward over {at}")
    if c := g.get("cache"):
        rows += (
            f"| cache memory | {c['total_mb']:.4g} MiB at context {at}: KV cache {c['kv_cache_bytes']:,} B + "
            f"recurrent state {c['state_bytes']:,} B + conv windows {c['conv_bytes']:,} B + weights "
            f"{c['weight_bytes']:,} B |\n"
        )
    return rows


def _over_memory_text(r: dict[str, Any]) -> str:
    """The card's warning when a memory objective is over the target GPU's memory (a bundle
    exported before the check has none)."""
    notes = r.get("over_device_memory") or []
    return "".join(f"\n**Does not fit the target GPU:** {note}; it cannot run on one as costed.\n" for note in notes)


def _card(r: dict[str, Any]) -> str:
    arch, lat, m = ArchSpec.from_dict(r["arch"]), r["latency"] or {}, r["metrics"]
    train = TrainSpec.from_dict(r["train"])
    label = r.get("latency_label") or lat.get("source", "?")
    if lat.get("interval"):
        low, high = lat["median_ms"] * (1 - lat["interval"]), lat["median_ms"] * (1 + lat["interval"])
        spread = f" (interval {low:.4g}–{high:.4g} ms)"
    elif lat.get("iqr_ms"):
        spread = f" ± {lat['iqr_ms']:.4g} (IQR)"
    else:
        spread = ""
    task = r["task"] or {}
    task_line = ", ".join(f"{k}={v}" for k, v in task.items() if k != "name")
    retrained = f" (retrained for {r['retrained_steps']} steps)" if r["retrained_steps"] else ""
    done = (r.get("trained") or {}).get("steps")
    steps = (
        f"{train.steps} steps"
        if done is None or done == train.steps
        else f"{done} of {train.steps} planned steps (stopped early: {r['trained'].get('stopped') or 'time budget'})"
    )
    blocks = f"{arch.depth} block{'' if arch.depth == 1 else 's'}"
    return (
        _card_metadata(r)
        + f"""# {arch.summary()} — trial {r["trial"]} of `{r["study"]}`

| metric | value |
| --- | --- |
| accuracy{retrained} | {m["accuracy"]:.4f}{_accuracy_spread(r)} |
| latency | {m["latency_ms"]:.4g} ms{spread}, **{label}** ({lat.get("dtype", "?")}, shape {lat.get("shape", "?")}) |
| memory | {m["memory_mb"]:.4g} MiB (weights + peak activations + KV cache / state) |
{_generation_rows(r)}{_precision_row(r)}| parameters | {r["params"]:,} |
{_over_memory_text(r)}
Searched for: {", ".join(r.get("objectives") or ["accuracy", "latency", "memory"])}.
{_fidelity_text(r)}
Architecture: width {arch.d_model}, {blocks} — {", ".join(_layer_text(la) for la in arch.layers)};
vocab {arch.vocab_size}, {arch.n_out} outputs, readout `{arch.readout}`. `arch_hash` {r["arch_hash"]}.

Task: `{task.get("name", "?")}` ({task_line}).

Recipe: {train.optimizer}, lr {train.lr:.3g} (warmup {train.warmup_frac:.0%}, cosine), weight decay
{train.weight_decay:g}, {steps} of batch {train.batch_size}, grad clip {train.grad_clip:g},
grad noise {train.grad_noise:g}, seed {train.seed}.

## Load

```python
import nas
model = nas.load("path/to/this/folder")       # HybridModel with these weights, eval mode
logits = model(tokens)                        # tokens: int64 [batch, seq]{_decode_example(r)}
```

ONNX (opset {r["onnx"]["opset"]}): input `tokens` int64 `[batch, seq]`, output `logits`
{r["onnx"]["outputs"]["logits"]}; `batch` and `seq` are dynamic axes.{_external_data_text(r)}{_precision_text(r)}

Versions: {", ".join(f"{k} {v}" for k, v in r["versions"].items())}. Exported {r["exported"]}.
"""
    )


def _precision_row(r: dict[str, Any]) -> str:
    """The card's row for an architecture stored below full precision (empty at full precision)."""
    p = r.get("precision")
    if not p:
        return ""
    full, cost = p.get("full_precision_accuracy"), p.get("accuracy_cost")
    if full is None:
        against = ""
    elif cost >= 0:
        against = f"; at full precision {full:.4f} (cost {cost:.4f})"
    else:  # the rounding happened to score higher on this test set
        against = f"; at full precision {full:.4f} ({-cost:.4f} higher at the stored precision)"
    return f"| precision | {p['summary']}: accuracy {r['metrics']['accuracy']:.4f} at it{against} |\n"


def _precision_text(r: dict[str, Any]) -> str:
    """The card's note on what a load computes for an architecture stored below full precision."""
    p = r.get("precision")
    if not p:
        return ""
    return (
        f"\n\nPrecision ({p['summary']}): `nas.load` gives a model whose forward rounds as stored "
        f"({p['rounding']}), as the search scored it, and whose `prefill` / `step` decode so (an fp8 KV "
        f"cache keeps the prompt's per-head scales, where the search scored whole sequences with their own: "
        f"from a short prompt, decoding can score lower); `model.stored_precision(False)` computes at full "
        f"precision, as `model.onnx` does. `nas.models.StoredDecoder` runs that decode on the library's "
        f"fp8 and bf16-state kernels; a measured decode latency times it, a forward latency is of the "
        f"kernels' own dtypes (bf16 weights)."
    )


def _accuracy_spread(r: dict[str, Any]) -> str:
    """`` ± 0.0040 (mean of 3 seeds at lr 3e-03, the best of 3 learning rates; these weights:
    seed 1, lr 3e-03, accuracy 0.9900)``: the card's accuracy interval over seeds and what it is a
    mean of, for a trial trained as a population (empty for one run, or a bundle of an older version)."""
    spread = f" ± {r['accuracy_interval']:.4f}" if r.get("accuracy_interval") else ""
    what = population_text(population := r.get("population"))
    if what is None:
        return spread
    if w := population.get("weights"):
        what += f"; these weights: seed {w['seed']}, lr {w['lr']:.0e}, accuracy {w['accuracy']:.4f}"
    return f"{spread} ({what})"


def _card_metadata(r: dict[str, Any]) -> str:
    """The Hugging Face model-card header: YAML between ``---`` lines (library, tags, the result)."""
    task = (r["task"] or {}).get("name", "unknown")
    meta = {
        "library_name": "hybrid-nas",
        "tags": ["hybrid-nas", "neural-architecture-search", "hybrid-attention", task],
        "metrics": ["accuracy"],
        "model-index": [
            {
                "name": f"{r['study']}-trial{r['trial']}",
                "results": [
                    {
                        "task": {"type": "sequence-modeling", "name": task},
                        "dataset": {"type": task, "name": task},
                        "metrics": [{"type": "accuracy", "value": round(float(r["metrics"]["accuracy"]), 4)}],
                    }
                ],
            }
        ],
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n"


def _external_data_text(r: dict[str, Any]) -> str:
    """The card's note on ``model.onnx.data``, for a bundle that has one."""
    name = (r["onnx"] or {}).get("external_data")
    if not name:
        return ""
    return (
        f"\nThe graph's weights are in `{name}` (ONNX external data: they are too large for one protobuf "
        f"file); keep it beside `model.onnx`, which loads it by that name."
    )


def _layer_text(layer: Any) -> str:
    """One block on the card: its mixer, heads, conv and MLP, then its norm (layernorm or rmsnorm)."""
    mlp = f"MLP×{layer.mlp_ratio:g} {layer.activation}" if layer.mlp_ratio else ""
    if layer.mixer == "none":
        return f"{mlp} ({layer.norm}{_dtypes_text(layer)})" if mlp else "empty block"
    mixer = "attention" if layer.mixer == "attention" else f"linear attention ({layer.feature_map})"
    conv = f" + conv{layer.short_conv}" if layer.short_conv else ""
    heads = f"{layer.heads} head" + ("s" if layer.heads != 1 else "")
    return f"{mixer}, {heads}{conv}" + (f" + {mlp}" if mlp else "") + f" ({layer.norm}{_dtypes_text(layer)})"


def _dtypes_text(layer: LayerSpec) -> str:
    """``, kv fp8, weights fp8``: a block's precision fields that differ from the default."""
    narrower = [
        (name, getattr(layer, name)) for name, allowed in PRECISION_FIELDS.items() if getattr(layer, name) != allowed[0]
    ]
    return "".join(f", {name.removesuffix('_dtype').replace('weight', 'weights')} {value}" for name, value in narrower)


# what a bundle's arch dict may hold (ArchSpec, LayerSpec), by field: (kind, low, high) for the
# numbers, checked before anything is built from them; the sizes are the search space's LIMITS
# (vocab_size and n_out the tasks' MAX_VOCAB), so an edited size is refused, not allocated
_ARCH_FIELDS: dict[str, tuple[str, float, float]] = {
    "d_model": ("int", LIMITS["d_model"].low, LIMITS["d_model"].high),
    "layers": ("layers", LIMITS["depth"].low, LIMITS["depth"].high),
    "vocab_size": ("int", 1, MAX_VOCAB),
    "n_out": ("int", 1, MAX_VOCAB),
    "readout": ("str", 0, 0),
}
_LAYER_FIELDS: dict[str, tuple[str, float, float]] = {
    "mixer": ("str", 0, 0),
    "heads": ("int", 0, LIMITS["layer.heads"].high),  # 0: mixer none (LayerSpec checks which)
    "feature_map": ("str?", 0, 0),
    "short_conv": ("int", LIMITS["layer.short_conv"].low, LIMITS["layer.short_conv"].high),
    "mlp_ratio": ("number", LIMITS["layer.mlp_ratio"].low, LIMITS["layer.mlp_ratio"].high),
    "activation": ("str", 0, 0),
    "norm": ("str", 0, 0),
    **{name: ("str", 0, 0) for name in PRECISION_FIELDS},
}
_REQUIRED = {f.name for f in dataclasses.fields(ArchSpec) if f.default is dataclasses.MISSING}
_LAYER_REQUIRED = {f.name for f in dataclasses.fields(LayerSpec) if f.default is dataclasses.MISSING}


def _field_error(field: str, value: Any, kind: str, low: float, high: float) -> str | None:
    """What is wrong with ``value`` for a field of ``kind`` within ``[low, high]``, or None."""
    if kind in ("str", "str?"):
        return None if isinstance(value, str) or (kind == "str?" and value is None) else "is not a string"
    if kind == "layers":
        if not isinstance(value, list) or not all(isinstance(la, dict) for la in value):
            return "is not a list of layers"
        value = len(value)
    elif isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
        # JSON's 72.0 is a float: torch sizes and head counts need whole numbers
        return "is not a whole number" if kind == "int" else "is not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "is not finite"
    if not low <= value <= high:
        what = "its length" if kind == "layers" else "it"
        return f"is out of range: {what} must be in [{low:,.0f}, {high:,.0f}]"  # whole-number bounds all
    return None


def _bundle_arch(raw: Any, where: str) -> ArchSpec:
    """The ArchSpec of a bundle's ``arch`` dict, or ExportError naming the field: every field
    known, of its type, finite and within its bounds (``_ARCH_FIELDS``), then ArchSpec's own rules."""
    if not isinstance(raw, dict):
        raise ExportError(f"{where}: its arch is not an architecture (a {type(raw).__name__}, not a mapping)")
    checks: list[tuple[str, dict[str, Any], dict[str, tuple[str, float, float]], set[str]]] = [
        ("arch", raw, _ARCH_FIELDS, _REQUIRED)
    ]
    if _field_error("layers", raw.get("layers"), *_ARCH_FIELDS["layers"]) is None:
        checks += [(f"arch.layers[{i}]", la, _LAYER_FIELDS, _LAYER_REQUIRED) for i, la in enumerate(raw["layers"])]
    for name, fields, allowed, required in checks:
        if unknown := sorted(set(fields) - set(allowed)):
            raise ExportError(
                f"{where}: {name} has fields this version does not know ({', '.join(map(str, unknown))}): "
                f"written by a newer version of hybrid-nas, or edited; upgrade hybrid-nas or re-export the trial"
            )
        if missing := sorted(required - set(fields)):
            raise ExportError(f"{where}: {name} lacks {', '.join(missing)}; re-export the trial")
        for field, value in fields.items():
            if (problem := _field_error(field, value, *allowed[field])) is not None:
                raise ExportError(f"{where}: {name}.{field} {value!r} {problem}")
    try:
        return ArchSpec.from_dict(raw)
    except (TypeError, ValueError) as e:  # a choice not in its list, heads that do not divide d_model
        raise ExportError(f"{where}: no valid architecture in it ({e})") from None


def _bundle_record(path: Path) -> dict[str, Any]:
    """The bundle's ``arch.json`` as a dict of a format this version reads, or ExportError."""
    try:
        record = json.loads((path / "arch.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not an export bundle ({e})") from None
    if not isinstance(record, dict):
        raise ExportError(f"{path}/arch.json: not an export bundle's (a JSON {type(record).__name__}, not an object)")
    fmt = record.get("format")
    if fmt == BUNDLE_FORMAT:
        return record
    if fmt is None:  # every version of nas export has written it (git log nas/results/export.py)
        raise ExportError(
            f"{path}/arch.json has no format field, which nas export always writes ({BUNDLE_FORMAT!r}): "
            f"not an export bundle, or edited; re-export the trial"
        )
    prefix, _, version = str(fmt).partition("/")
    if prefix == BUNDLE_FORMAT.partition("/")[0] and version.isdigit() and int(version) > 1:
        raise ExportError(
            f"{path}: written by a newer version of hybrid-nas (format {fmt!r}; this one reads {BUNDLE_FORMAT!r}); "
            f"upgrade hybrid-nas to load it"
        )
    raise ExportError(f"{path}/arch.json: unknown format {fmt!r} (nas export writes {BUNDLE_FORMAT!r})")


def load(path: str | Path, *, backend: str = "torch") -> HybridModel | TritonModel:
    """Rebuild the model of an export bundle: ``backend="torch"`` → ``HybridModel`` (eval, CPU),
    whose forward rounds its KV cache, state and weights as the architecture's precision fields
    store them, as the search scored it (``HybridModel.stored_precision``; off at full precision);
    ``backend="triton"`` → its ``TritonModel`` (bf16 kernels on the current CUDA device, at the
    kernels' own dtypes whatever the precision fields say; capture it with ``.capture(tokens)``
    for graph replay).

    ExportError (one line) for anything that is not a bundle this version can rebuild as exported:
    a newer or unknown ``format``; an arch dict with unknown fields, wrong types or sizes past the
    search space's limits; an architecture that does not match ``arch_hash``, or weights stored
    for another one (the safetensors' ``arch_hash``); tensors that do not fit the architecture."""
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend {backend!r} is not one of ['torch', 'triton']")
    if backend == "triton" and not torch.cuda.is_available():
        raise ValueError("backend 'triton' needs a CUDA device; use backend='torch' here")
    path = Path(path)
    record = _bundle_record(path)
    if "arch" not in record:
        raise ExportError(f"{path}/arch.json: no valid architecture in it (no arch field)")
    arch = _bundle_arch(record["arch"], f"{path}/arch.json")
    as_written = json.dumps(record["arch"], sort_keys=True, separators=(",", ":"))  # an older version's form too
    hashes = {arch_hash(arch), hashlib.sha256(as_written.encode()).hexdigest()[:16]}
    if "arch_hash" in record and (not isinstance(record["arch_hash"], str) or record["arch_hash"] not in hashes):
        # an edit that keeps every weight's shape (a feature map, an activation, a norm) loads the
        # weights into another model without a word: its outputs are not the exported model's
        raise ExportError(
            f"{path}/arch.json: its architecture does not match its arch_hash {record['arch_hash']!r} (edited "
            f"since export?); re-export the trial"
        )
    # the weights' own arch_hash (written by every version) is checked too: arch.json's can be
    # edited along with its arch, or dropped, and weights of another export can be copied in
    model = _load_weights(
        arch,
        path / "model.safetensors",
        f"{path}/model.safetensors",
        where=str(path / "model.safetensors"),
        hashes=hashes,
        ours=f"arch.json's {record.get('arch_hash', arch_hash(arch))!r}",
        fix="the files are of different exports (or arch.json was edited); re-export the trial",
    )
    model.eval()
    if backend == "triton":  # the forward kernels run at their own dtypes (decoding as stored: StoredDecoder)
        return to_triton(model.cuda())
    return model.stored_precision(not arch.full_precision)
