"""Export bundle: ``arch.json``, ``model.safetensors``, ``model.onnx``, ``card.md``; and ``load``.

``export(study, trial, out)`` writes the bundle of one trial (its stored weights, or weights
retrained for longer); ``load(path)`` rebuilds the torch model from a bundle with one call.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
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
from nas.results.onnx_model import ONNX_OPSET, check_onnx, write_onnx
from nas.search.objectives import BY_METRIC
from nas.search.record import TrialRecord, study_objectives, study_setup
from nas.search.setup import SearchSetup
from nas.search.storage import file_in_the_way, open_artifact_store, output_clash
from nas.spec import ArchSpec, TrainSpec, arch_hash
from nas.tasks import Task, TaskError, task_moved

__all__ = ["ONNX_OPSET", "ExportError", "check_out", "export", "load", "trial_model"]

logger = logging.getLogger(__name__)

BUNDLE_FILES = ("arch.json", "model.safetensors", "model.onnx", "card.md")


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
    model = build(trial.arch)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "w.safetensors")
        try:
            download_artifact(
                artifact_store=open_artifact_store(storage, create=False), file_path=path, artifact_id=artifact
            )
        except Exception as e:  # the store raises its own not-found types per backend
            raise ExportError(f"weights of trial {trial.number} are missing from the artifact store ({e})") from None
        _load_weights(model, path, f"the stored weights of trial {trial.number}")
    return model.eval()


def _load_weights(model: torch.nn.Module, path: str | Path, what: str) -> None:
    """``model``'s weights from the safetensors file ``path``, or ExportError naming ``what`` when
    the file is not one (truncated, overwritten) or holds other tensors than the arch's."""
    from safetensors import SafetensorError

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ExportError(f"{what} cannot be read ({path}: {e})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # missing, unexpected or misshaped tensors
        first = str(e).strip().splitlines()
        raise ExportError(f"{what} do not fit the architecture ({' '.join(first[:2])[:300]})") from None


def _retrain(trial: TrialRecord, task: Task, steps: int, device: str) -> tuple[HybridModel, float, dict[str, Any]]:
    """(model, accuracy, what training did) for ``trial``'s candidate trained ``steps`` steps afresh."""
    from nas.train import train

    spec = dataclasses.replace(trial.train, steps=steps)
    model = build(trial.arch, task, seed=spec.seed)
    result = train(model, task, spec, device=device)
    return model.to("cpu").eval(), result.accuracy, {"steps": result.steps, "stopped": result.stopped}


def _is_bundle(out: Path) -> bool:
    """Whether directory ``out`` holds what an earlier export wrote and nothing else: bundle files
    only, and an ``arch.json`` of the bundle format. Only such a directory may be replaced."""
    entries = list(out.iterdir())
    if not entries or any(e.name not in BUNDLE_FILES or e.is_symlink() or not e.is_file() for e in entries):
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
            f"--out {out} is not an export bundle (it holds files other than {', '.join(BUNDLE_FILES)}); "
            f"--force replaces only a bundle nas export wrote"
        )


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
    out = Path(out)
    check_out(out, storage, force=force)
    if retrain_steps is not None and retrain_steps <= 0:
        raise ExportError(f"--retrain-steps must be >= 1, got {retrain_steps}")
    setup = study_setup(study)
    task_config = dict(setup.task_config) if setup is not None and setup.task_config else None
    if retrain_steps is None:
        model, accuracy = trial_model(trial, storage), trial.accuracy
        # the steps the search actually trained: a time budget may have stopped it before train.steps
        trained = {"steps": trial.steps_done, "stopped": trial.stopped}
    else:
        if task_config is None:
            raise ExportError(f"study {study.study_name!r} does not record its task; cannot retrain")
        try:
            task, _ = task_moved(task_config, data)
        except TaskError as e:
            raise ExportError(
                f"study {study.study_name!r} retrains on the data it was created with: {e}; restore that file, "
                f"or name where it is now with --data PATH"
            ) from None
        model, accuracy, trained = _retrain(trial, task, retrain_steps, device)
    arch = model.arch
    train = trial.train
    if retrain_steps is not None:
        train = dataclasses.replace(train, steps=retrain_steps)

    try:  # staged beside out, so the final rename stays on one file system
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out.parent))
    except OSError as e:
        raise ExportError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    try:
        record = {
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
            "metrics": {**_known_metrics(trial), **trial.values, "accuracy": accuracy},
            "latency": trial.latency.to_dict() if trial.latency is not None else None,
            "generation": _generation(trial, setup),
            "latency_label": trial.latency_label(),
            "memory": dict(trial.memory),
            "params": trial.params,
            "versions": _versions(),
            "exported": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "onnx": {
                "opset": ONNX_OPSET,
                "inputs": {"tokens": "int64 [batch, seq]"},
                "outputs": {
                    "logits": "float32 [batch, seq, n_out]" if arch.readout == "token" else "float32 [batch, n_out]"
                },
            },
        }
        (staging / "arch.json").write_text(json.dumps(record, indent=2) + "\n")
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()},
            str(staging / "model.safetensors"),
            metadata={"arch_hash": arch_hash(arch)},
        )
        # safetensors creates its file private (0600); the bundle is meant to be shared like its other files
        (staging / "model.safetensors").chmod((staging / "arch.json").stat().st_mode & 0o777)
        write_onnx(model, staging / "model.onnx")
        seq_len = (task_config or {}).get("seq_len")  # an .npz task's config has none
        if mismatch := check_onnx(model, staging / "model.onnx", None if seq_len is None else int(seq_len)):
            raise ExportError(f"the exported ONNX graph is wrong, so no bundle was written: {mismatch}")
        (staging / "card.md").write_text(_card(record))
        check_out(out, storage, force=force)  # again: a retraining may have run for minutes since
        if out.exists():  # empty, or an earlier bundle
            shutil.rmtree(out)
        staging.chmod(0o755)  # mkdtemp makes it private; a bundle is meant to be shared
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("exported trial %d of %s to %s", trial.number, study.study_name, out)
    return out


def _known_metrics(trial: TrialRecord) -> dict[str, float]:
    """Every cost the trial recorded, by metric name, whether or not the study optimised it."""
    found = {m: trial.value(m) for m in BY_METRIC}
    return {m: v for m, v in found.items() if v is not None}


def _generation(trial: TrialRecord, setup: SearchSetup | None) -> dict[str, Any] | None:
    """The generation costs at the study's context (None for a study without one)."""
    if setup is None or not setup.context:
        return None
    return {
        "context": setup.context,
        "decode_batch": setup.decode_batch,
        "prefill_latency": trial.prefill_latency.to_dict() if trial.prefill_latency is not None else None,
        "decode_latency": trial.decode_latency.to_dict() if trial.decode_latency is not None else None,
        "cache": trial.memory.get("cache"),
    }


def _latency_row(name: str, lat: dict[str, Any], what: str) -> str:
    """A card table row for a latency: median, interval or IQR, measured or predicted, and where."""
    if lat.get("interval"):
        low, high = lat["median_ms"] * (1 - lat["interval"]), lat["median_ms"] * (1 + lat["interval"])
        spread = f" (interval {low:.4g}–{high:.4g} ms)"
    elif lat.get("iqr_ms"):
        spread = f" ± {lat['iqr_ms']:.4g} (IQR)"
    else:
        spread = ""
    latency = Latency.from_dict(lat)
    label = f"measured on {latency.device}" if latency.source == "measured" else latency.label()
    return f"| {name} | {lat['median_ms']:.4g} ms{spread}, **{label}** ({lat.get('dtype', '?')}, {what}) |\n"


def _generation_rows(r: dict[str, Any]) -> str:
    """Card rows for decoding at the study's context: per-token latency, prefill, cache bytes."""
    g = r.get("generation")
    if not g:
        return ""
    at = f"{g['context']:,} tokens × {g['decode_batch']}"
    rows = ""
    if g.get("decode_latency"):
        rows += _latency_row("decode latency (per token)", g["decode_latency"], f"one step at context {at}")
    if g.get("prefill_latency"):
        rows += _latency_row("prefill latency", g["prefill_latency"], f"forward over {at}")
    if c := g.get("cache"):
        rows += (
            f"| cache memory | {c['total_mb']:.4g} MiB at context {at}: KV cache {c['kv_cache_bytes']:,} B + "
            f"recurrent state {c['state_bytes']:,} B + conv windows {c['conv_bytes']:,} B + weights "
            f"{c['weight_bytes']:,} B |\n"
        )
    return rows


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
| accuracy{retrained} | {m["accuracy"]:.4f} |
| latency | {m["latency_ms"]:.4g} ms{spread}, **{label}** ({lat.get("dtype", "?")}, shape {lat.get("shape", "?")}) |
| memory | {m["memory_mb"]:.4g} MiB (weights + peak activations + KV cache / state) |
{_generation_rows(r)}| parameters | {r["params"]:,} |

Searched for: {", ".join(r.get("objectives") or ["accuracy", "latency", "memory"])}.

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
logits = model(tokens)                        # tokens: int64 [batch, seq]
```

ONNX (opset {r["onnx"]["opset"]}): input `tokens` int64 `[batch, seq]`, output `logits`
{r["onnx"]["outputs"]["logits"]}; `batch` and `seq` are dynamic axes.

Versions: {", ".join(f"{k} {v}" for k, v in r["versions"].items())}. Exported {r["exported"]}.
"""
    )


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


def _layer_text(layer: Any) -> str:
    mlp = f"MLP×{layer.mlp_ratio:g} {layer.activation}" if layer.mlp_ratio else ""
    if layer.mixer == "none":
        return mlp or "empty block"
    mixer = "attention" if layer.mixer == "attention" else f"linear attention ({layer.feature_map})"
    conv = f" + conv{layer.short_conv}" if layer.short_conv else ""
    heads = f"{layer.heads} head" + ("s" if layer.heads != 1 else "")
    return f"{mixer}, {heads}{conv}" + (f" + {mlp}" if mlp else "")


def load(path: str | Path, *, backend: str = "torch") -> HybridModel | TritonModel:
    """Rebuild the model of an export bundle: ``backend="torch"`` → ``HybridModel`` (eval, CPU);
    ``backend="triton"`` → its ``TritonModel`` (bf16 kernels on the current CUDA device; capture
    it with ``.capture(tokens)`` for graph replay)."""
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend {backend!r} is not one of ['torch', 'triton']")
    if backend == "triton" and not torch.cuda.is_available():
        raise ValueError("backend 'triton' needs a CUDA device; use backend='torch' here")
    path = Path(path)
    try:
        record = json.loads((path / "arch.json").read_text())
        arch = ArchSpec.from_dict(record["arch"])
    except (OSError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not an export bundle ({e})") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{path}/arch.json: no valid architecture in it ({type(e).__name__}: {e})") from None
    as_written = json.dumps(record["arch"], sort_keys=True, separators=(",", ":"))  # an older version's form too
    if "arch_hash" in record and record["arch_hash"] not in (
        arch_hash(arch),
        hashlib.sha256(as_written.encode()).hexdigest()[:16],
    ):
        # an edit that keeps every weight's shape (a feature map, an activation, a norm) loads the
        # weights into another model without a word: its outputs are not the exported model's
        raise ExportError(
            f"{path}/arch.json: its architecture does not match its arch_hash {record['arch_hash']!r} (edited "
            f"since export?); re-export the trial, or set arch_hash to {arch_hash(arch)!r} to load the edit"
        )
    model = build(arch)
    _load_weights(model, path / "model.safetensors", f"{path}/model.safetensors")
    model.eval()
    return to_triton(model.cuda()) if backend == "triton" else model
