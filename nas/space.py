"""Search-space YAML → a validated ``SearchSpace`` whose ``sample(trial, task)`` yields a Candidate.

A space is data: the shipped YAML files live in the ``search_spaces`` package (see
``search_spaces/hybrid_small.yaml``); ``load_space("hybrid_small")`` or
``load_space("my_space.yaml")`` returns a validated ``SearchSpace``, ``list_spaces()`` names
the shipped ones. Each searched field is either a list of choices
(a categorical) or a range mapping ``{low, high[, log][, step]}``; a scalar fixes the value.
Conditional choices are explicit: ``heads`` and ``short_conv`` are drawn only for layers with a
mixer, ``feature_map`` only for linear attention, ``momentum``/``nesterov`` only for SGD.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import optuna
import yaml

from nas.spec import ACTIVATIONS, FEATURE_MAPS, MIXERS, NORMS, OPTIMIZERS, ArchSpec, Candidate, LayerSpec, TrainSpec
from nas.tasks.base import Task

__all__ = ["Choice", "SearchSpace", "SpaceError", "list_spaces", "load_space", "parse_space", "read_space_file"]


class SpaceError(ValueError):
    """A search-space file is wrong; the message names the file, the field and what is allowed."""


@dataclass(frozen=True)
class Choice:
    """One searched field: categorical ``choices``, or a numeric range ``low..high``."""

    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    is_int: bool = False

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        if self.choices is not None:
            if len(self.choices) == 1:
                return self.choices[0]  # fixed: not a searched parameter
            return trial.suggest_categorical(name, list(self.choices))
        if self.is_int:
            return trial.suggest_int(name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)

    def values(self) -> tuple[Any, ...]:
        """Every value a categorical can take, or the range's ends."""
        return self.choices if self.choices is not None else (self.low, self.high)


# field -> (allowed values or expected python type, required)
_LAYER_FIELDS: dict[str, tuple[Any, bool]] = {
    "mixer": (MIXERS, True),
    "heads": (int, False),
    "feature_map": (FEATURE_MAPS, False),
    "short_conv": (int, False),
    "mlp_ratio": (float, True),
    "activation": (ACTIVATIONS, False),
    "norm": (NORMS, False),
}
_TRAIN_FIELDS: dict[str, tuple[Any, bool]] = {
    "optimizer": (OPTIMIZERS, True),
    "lr": (float, True),
    "weight_decay": (float, False),
    "warmup_frac": (float, False),
    "steps": (int, True),
    "batch_size": (int, True),
    "momentum": (float, False),
    "nesterov": (bool, False),
    "grad_clip": (float, False),
    "grad_noise": (float, False),
}
_TOP_FIELDS = {"name", "description", "task", "depth", "d_model", "layer", "train", "max_train_seconds"}


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, msg: str) -> SpaceError:
        return SpaceError(f"{self.source}: {field}: {msg}")

    def choice(self, field: str, raw: Any, kind: Any) -> Choice:
        """Parse ``raw`` as a Choice whose values are of ``kind`` (a type, or a tuple of allowed strings)."""
        if isinstance(raw, dict):
            if isinstance(kind, tuple) or kind is bool:
                raise self.fail(field, f"must be a list of choices, not a range; allowed {self._allowed(kind)}")
            unknown = set(raw) - {"low", "high", "log", "step"}
            if unknown or not {"low", "high"} <= set(raw):
                raise self.fail(field, "a range needs exactly 'low' and 'high' (optional 'log', 'step')")
            low, high = (self.value(field, raw[k], kind) for k in ("low", "high"))
            if low > high:
                raise self.fail(field, f"empty range: low={low} > high={high}")
            log = bool(raw.get("log", False))
            if log and low <= 0:
                raise self.fail(field, f"a log range needs low > 0, got {low}")
            step = raw.get("step")
            if step is not None and (log or self.value(field, step, kind) <= 0):
                raise self.fail(field, "step must be > 0 and cannot be combined with log")
            return Choice(low=low, high=high, log=log, step=step, is_int=kind is int)
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise self.fail(field, f"empty list of choices; allowed {self._allowed(kind)}")
        values = tuple(self.value(field, item, kind) for item in items)
        if len(set(values)) != len(values):
            raise self.fail(field, f"duplicate choices in {list(values)}")
        return Choice(choices=values)

    def value(self, field: str, item: Any, kind: Any) -> Any:
        if isinstance(kind, tuple):
            if item not in kind:
                raise self.fail(field, f"{item!r} is not one of {list(kind)}")
            return item
        if kind is bool:
            if not isinstance(item, bool):
                raise self.fail(field, f"{item!r} is not true/false")
            return item
        if isinstance(item, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; take it as the number it means
            try:
                item = float(item)
            except ValueError:
                raise self.fail(field, f"{item!r} is not a number") from None
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise self.fail(field, f"{item!r} is not a number")
        if kind is int and float(item) != int(item):
            raise self.fail(field, f"{item!r} is not an integer")
        value = kind(item)
        if value < 0:
            raise self.fail(field, f"{item!r} must be >= 0")
        return value

    @staticmethod
    def _allowed(kind: Any) -> str:
        return str(list(kind)) if isinstance(kind, tuple) else kind.__name__

    def section(self, name: str, raw: Any, fields: dict[str, tuple[Any, bool]]) -> dict[str, Choice]:
        if not isinstance(raw, dict):
            raise self.fail(name, "must be a mapping of field: choices")
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise self.fail(f"{name}.{unknown[0]}", f"unknown field; allowed {sorted(fields)}")
        out = {}
        for field, (kind, required) in fields.items():
            if field in raw:
                out[field] = self.choice(f"{name}.{field}", raw[field], kind)
            elif required:
                raise self.fail(f"{name}.{field}", "is required")
        return out


@dataclass(frozen=True)
class SearchSpace:
    """A validated space. ``layer`` and ``train`` map field names to their Choice."""

    name: str
    description: str
    task: str
    depth: Choice
    d_model: Choice
    layer: dict[str, Choice]
    train: dict[str, Choice]
    max_train_seconds: float | None
    source: str

    def sample(self, trial: optuna.Trial, task: Task) -> Candidate:
        """Draw one candidate through ``trial`` (parameter names ``depth``, ``d_model``,
        ``layer{i}.<field>``, ``train.<field>``) sized for ``task``."""
        depth = self.depth.suggest(trial, "depth")
        d_model = self.d_model.suggest(trial, "d_model")
        layers = tuple(self._sample_layer(trial, i) for i in range(depth))
        arch = ArchSpec(d_model, layers, task.vocab_size, task.n_out, task.readout)
        fields = {"optimizer": self.train["optimizer"].suggest(trial, "train.optimizer")}
        for field, choice in self.train.items():
            if field == "optimizer" or (field in ("momentum", "nesterov") and fields["optimizer"] != "sgd"):
                continue
            fields[field] = choice.suggest(trial, f"train.{field}")
        return Candidate(arch, TrainSpec(**fields, seed=trial.number))

    def check_measurable(self) -> None:
        """SpaceError unless every (d_model, heads) gives a head dim the GPU kernels run (the
        kernels' rule, ``padded_head_dim``): asked only where latency is measured, so a space (or a
        study recorded with one) that predicts latency stays usable on any machine."""
        from kernels.attention import SUPPORTED_HEAD_DIMS, padded_head_dim  # loads torch: only when measuring

        if set(self.layer["mixer"].values()) == {"none"}:
            return
        for heads in self.layer["heads"].values():
            for d in self.d_model.values():
                head_dim = d // heads
                if padded_head_dim(head_dim) is None:
                    raise SpaceError(
                        f"{self.source}: layer.heads: {heads} heads on d_model={d} give head dim "
                        f"{head_dim}; the Triton kernels that measure latency on a GPU run even head "
                        f"dims up to {max(SUPPORTED_HEAD_DIMS)}: use more heads or narrower widths, "
                        f"or --predict"
                    )

    def _sample_layer(self, trial: optuna.Trial, i: int) -> LayerSpec:
        def pick(field: str) -> Any:
            return self.layer[field].suggest(trial, f"layer{i}.{field}")

        mixer = pick("mixer")
        fields: dict[str, Any] = {"mixer": mixer, "mlp_ratio": pick("mlp_ratio")}
        for field in ("activation", "norm"):
            if field in self.layer:
                fields[field] = pick(field)
        if mixer != "none":
            fields["heads"] = pick("heads")
            if "short_conv" in self.layer:
                fields["short_conv"] = pick("short_conv")
        if mixer == "linear_attention":
            fields["feature_map"] = pick("feature_map")
        return LayerSpec(**fields)


def parse_space(raw: Any, source: str) -> SearchSpace:
    """Validate the parsed YAML ``raw`` read from ``source`` (a file name used in messages)."""
    r = _Reader(source)
    if not isinstance(raw, dict):
        raise SpaceError(f"{source}: the file must hold a mapping with fields {sorted(_TOP_FIELDS)}")
    unknown = sorted(set(raw) - _TOP_FIELDS)
    if unknown:
        raise r.fail(unknown[0], f"unknown field; allowed {sorted(_TOP_FIELDS)}")
    for field in ("depth", "d_model", "layer", "train"):
        if field not in raw:
            raise r.fail(field, "is required")
    depth, d_model = r.choice("depth", raw["depth"], int), r.choice("d_model", raw["d_model"], int)
    if min(depth.values()) < 1 or min(d_model.values()) < 1:
        raise r.fail("depth" if min(depth.values()) < 1 else "d_model", "values must be >= 1")
    if d_model.choices is None:
        raise r.fail("d_model", "must be a list of widths (heads must divide each of them)")
    layer, train = r.section("layer", raw["layer"], _LAYER_FIELDS), r.section("train", raw["train"], _TRAIN_FIELDS)
    mixers = set(layer["mixer"].values())
    if mixers - {"none"}:
        if "heads" not in layer or layer["heads"].choices is None:
            raise r.fail("layer.heads", "a list of head counts is required when a mixer can be attention")
        for heads in layer["heads"].values():
            bad = [d for d in d_model.values() if heads < 1 or d % heads]
            if bad:
                raise r.fail(
                    "layer.heads",
                    f"{heads} heads do not divide d_model={bad[0]}; every choice must "
                    f"divide every width in {list(d_model.values())}",
                )

    if "linear_attention" in mixers and "feature_map" not in layer:
        raise r.fail(
            "layer.feature_map", f"is required when linear_attention is a choice; allowed {list(FEATURE_MAPS)}"
        )
    if "short_conv" in layer and max(layer["short_conv"].values()) > 16:
        raise r.fail("layer.short_conv", "kernel sizes must be in [0, 16]")
    if min(train["lr"].values()) <= 0:
        raise r.fail("train.lr", "must be > 0")
    if min(train["steps"].values()) < 1 or min(train["batch_size"].values()) < 1:
        raise r.fail("train.steps" if min(train["steps"].values()) < 1 else "train.batch_size", "must be >= 1")
    if "warmup_frac" in train and max(train["warmup_frac"].values()) >= 1:
        raise r.fail("train.warmup_frac", "must be in [0, 1)")
    task = raw.get("task", "mqar")
    if not isinstance(task, str) or not task:
        raise r.fail("task", "must be a task spec string such as 'mqar:seq_len=64'")
    seconds = raw.get("max_train_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise r.fail("max_train_seconds", f"{seconds!r} must be a positive number of seconds")
    return SearchSpace(
        str(raw.get("name", Path(source).stem)),
        str(raw.get("description", "")),
        task,
        depth,
        d_model,
        layer,
        train,
        seconds,
        source,
    )


def read_space_file(path: Path) -> SearchSpace:
    """Load and validate one YAML file (``yaml.safe_load``: no Python objects from user files)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SpaceError(f"{path}: cannot read the file ({e.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpaceError(f"{path}: invalid YAML{where}: {getattr(e, 'problem', e)}") from None
    return parse_space(raw, str(path))


def _shipped() -> Path:
    return Path(str(resources.files("search_spaces")))


def list_spaces() -> list[str]:
    """Names of the spaces shipped with the package (``search_spaces/*.yaml``)."""
    return sorted(p.stem for p in _shipped().glob("*.yaml"))


def load_space(name_or_path: str | Path) -> SearchSpace:
    """A shipped space by name, or a YAML file by path. Raises SpaceError naming the problem."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.exists():
        if not path.is_file():
            raise SpaceError(f"{path}: no such search-space file")
        return read_space_file(path)
    shipped = _shipped() / f"{text}.yaml"
    if not shipped.is_file():
        raise SpaceError(f"unknown search space {text!r}; shipped spaces are {list_spaces()} (or pass a .yaml path)")
    return read_space_file(shipped)
