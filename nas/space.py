"""Search-space YAML → a validated ``SearchSpace`` whose ``sample(trial, task)`` yields a Candidate.

A space is data: the shipped YAML files live in the ``search_spaces`` package (see
``search_spaces/hybrid_small.yaml``); ``load_space("hybrid_small")`` or
``load_space("my_space.yaml")`` returns a validated ``SearchSpace``, ``list_spaces()`` names
the shipped ones. Each searched field is either a list of choices
(a categorical) or a range mapping ``{low, high[, log][, step]}``; a scalar fixes the value.
Conditional choices are explicit: ``heads`` and ``short_conv`` are drawn only for layers with a
mixer, ``feature_map`` only for linear attention, ``momentum``/``nesterov`` only for SGD, and the
precision fields (``kv_dtype``, ``state_dtype``, ``weight_dtype``: study-wide under ``precision:``
or per layer under ``layer:``) only where a layer holds what they store.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from importlib import resources
from pathlib import Path
from typing import Any

import optuna
import yaml

from hardware_profiles.yaml_files import DuplicateKey, YamlFileError, load_unique, read_text
from nas.spec import (
    ACTIVATIONS,
    FEATURE_MAPS,
    MIXERS,
    NORMS,
    OPTIMIZERS,
    PRECISION_FIELDS,
    ArchSpec,
    Candidate,
    LayerSpec,
    TrainSpec,
    training_seed,
)
from nas.tasks.base import Task

__all__ = [
    "LIMITS",
    "Choice",
    "SearchSpace",
    "SpaceError",
    "list_spaces",
    "load_space",
    "parse_space",
    "parse_space_text",
    "read_space_file",
]


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

    def count(self) -> int | None:
        """How many values it can take: the choices, an integer range's or a stepped range's
        grid points; None for a continuous range."""
        if self.choices is not None:
            return len(self.choices)
        if self.is_int or self.step is not None:
            step = self.step or 1
            return int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        return None

    def __str__(self) -> str:
        """As a space file would write it: ``[16, 32]`` or ``{low: 0.001, high: 0.01, log: true}``."""
        if self.choices is not None:
            return f"[{', '.join(str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices)}]"
        extra = (", log: true" if self.log else "") + (f", step: {self.step:g}" if self.step is not None else "")
        return f"{{low: {self.low:g}, high: {self.high:g}{extra}}}"


# field -> (allowed values or expected python type, required)
_LAYER_FIELDS: dict[str, tuple[Any, bool]] = {
    "mixer": (MIXERS, True),
    "heads": (int, False),
    "feature_map": (FEATURE_MAPS, False),
    "short_conv": (int, False),
    "mlp_ratio": (float, True),
    "activation": (ACTIVATIONS, False),
    "norm": (NORMS, False),
    **{name: (allowed, False) for name, allowed in PRECISION_FIELDS.items()},
}
# how a deployment stores the KV cache, state and weights: study-wide choices (one draw per candidate)
_PRECISION_FIELDS: dict[str, tuple[Any, bool]] = {name: (allowed, False) for name, allowed in PRECISION_FIELDS.items()}
# the mixer a precision field needs (weights: every block with a mixer or an MLP)
_HOLDER = {"kv_dtype": "attention", "state_dtype": "linear_attention"}
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
# The population a candidate trains as when a space does not say (train.seeds x train.lr_multipliers):
# two seeds give the accuracy its spread, three learning rates around the sampled one keep a poor
# draw of lr from deciding whether an architecture learns at all
DEFAULT_SEEDS = 2
DEFAULT_LR_MULTIPLIERS = (0.5, 1.0, 2.0)
MAX_SEEDS = 16
MAX_LR_MULTIPLIERS = 8
_POPULATION_FIELDS = ("seeds", "lr_multipliers")  # train fields that are fixed settings, never searched
_TOP_FIELDS = {"name", "description", "task", "depth", "d_model", "layer", "precision", "train", "max_train_seconds"}


@dataclass(frozen=True)
class _Bound:
    """The values a numeric field may take: ``low..high``, either end open; always finite."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def holds(self, v: float) -> bool:
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below  # NaN fails both

    def __str__(self) -> str:
        low, high = (f"{int(v)}" if float(v).is_integer() else f"{v:g}" for v in (self.low, self.high))
        if math.isinf(self.high):
            return f"a finite number {'>' if self.low_open else '>='} {low}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


# Every numeric field's allowed values (docs/spaces.md, "Search spaces are data"). The size limits are
# generous but finite: a typo such as d_model: [1048576] (a 13 TB model) or depth: {high: 1000000}
# (a model that never finishes building) is refused here, before a study is opened, instead of
# failing or hanging inside a trial. The optimizer limits are where the hyperparameter has a meaning.
LIMITS: dict[str, _Bound] = {
    "depth": _Bound(1, 128),
    "d_model": _Bound(1, 16384),
    "layer.heads": _Bound(1, 1024),
    "layer.short_conv": _Bound(0, 16),  # the kernels' widest causal conv (LayerSpec's rule)
    "layer.mlp_ratio": _Bound(0, 16),  # 0 = no MLP
    # too high diverges: a failed trial, recorded. Past 1e6 (far past any lr that trains) the
    # optimizers' fp32 step scalars (lr over Adam's bias correction) overflow before they diverge.
    "train.lr": _Bound(0, 1e6, low_open=True),
    "train.weight_decay": _Bound(0, 10),
    "train.warmup_frac": _Bound(0, 1, high_open=True),  # a fraction of the steps; some must train
    "train.steps": _Bound(1, 1_000_000),
    "train.batch_size": _Bound(1, 1 << 20),  # clipped to the task's training rows
    "train.momentum": _Bound(0, 1, high_open=True),  # 1 never forgets a gradient: the velocity grows without bound
    "train.grad_clip": _Bound(0, math.inf),  # 0 = off
    "train.grad_noise": _Bound(0, math.inf),  # 0 = off
    "max_train_seconds": _Bound(0, math.inf, low_open=True),
}
# a space's name becomes part of the default study name, which is printed in shell commands
# (`nas report --study NAME`) and used in file names (runs/NAME-report.html)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def _as_yaml(item: Any) -> str:
    """A parsed YAML value as the file spells it, for a message: ``true``, ``null``, ``'fp16'``."""
    if isinstance(item, bool):
        return "true" if item else "false"
    return "null" if item is None else repr(item)


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, msg: str) -> SpaceError:
        return SpaceError(f"{self.source}: {field}: {msg}")

    def choice(self, field: str, raw: Any, kind: Any) -> Choice:
        """Parse ``raw`` as a Choice whose values are of ``kind`` (a type, or a tuple of allowed strings)."""
        if raw is None:
            raise self.fail(field, f"has no value; give a list of choices, allowed {self._allowed(kind)}")
        if isinstance(raw, dict):
            if isinstance(kind, tuple) or kind is bool:
                raise self.fail(field, f"must be a list of choices, not a range; allowed {self._allowed(kind)}")
            unknown = set(raw) - {"low", "high", "log", "step"}
            if unknown or not {"low", "high"} <= set(raw):
                raise self.fail(field, "a range needs exactly 'low' and 'high' (optional 'log', 'step')")
            low, high = (self.value(field, raw[k], kind) for k in ("low", "high"))
            if low > high:
                raise self.fail(field, f"empty range: low={low} > high={high}")
            log = raw.get("log", False)
            if not isinstance(log, bool):
                raise self.fail(field, f"log must be true or false, got {log!r}")
            if log and low <= 0:
                raise self.fail(field, f"a log range needs low > 0, got {low}")
            step = raw.get("step")
            if step is not None:
                step = self.number(f"{field}.step", step, kind)
                if log or step <= 0:
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
        """One allowed string, boolean, or number inside the field's ``LIMITS``."""
        if isinstance(kind, tuple):
            if item not in kind:
                raise self.fail(field, f"{_as_yaml(item)} is not one of {list(kind)}")
            return item
        if kind is bool:
            if not isinstance(item, bool):
                raise self.fail(field, f"{_as_yaml(item)} is not true/false")
            return item
        value = self.number(field, item, kind)
        bound = LIMITS[field]
        if not bound.holds(value):
            raise self.fail(field, f"{item!r} is out of range: must be {bound}")
        return value

    def number(self, field: str, item: Any, kind: type) -> int | float:
        """``item`` as a finite ``kind`` (int or float); an int field takes only integers."""
        if kind is int:
            if isinstance(item, bool) or not isinstance(item, int):
                raise self.fail(field, f"{item!r} is not an integer")
            return item
        if isinstance(item, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; take it as the number it means
            try:
                item = float(item)  # float() also takes 'nan' and 'inf': refused below
            except ValueError:
                raise self.fail(field, f"{item!r} is not a number") from None
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise self.fail(field, f"{item!r} is not a number")
        if not math.isfinite(item):
            raise self.fail(field, f"{item!r} is not a finite number")
        return float(item)

    def name(self, raw: Any, default: str) -> str:
        """An explicit ``name:`` becomes part of the default study name: a word, no spaces or slashes."""
        if raw is None:
            return default
        if not isinstance(raw, str) or not _NAME.fullmatch(raw):
            raise self.fail(
                "name",
                f"{raw!r} must be 1-100 letters, digits, '.', '_', '+' or '-', starting with a letter or digit",
            )
        return raw

    def string(self, field: str, raw: Any, what: str, required: bool = True) -> str:
        if raw is None and not required:
            return ""
        if not isinstance(raw, str) or (required and not raw.strip()):
            raise self.fail(field, f"{raw!r} must be {what}")
        return raw

    def population(self, train: Any) -> tuple[int, tuple[float, ...]]:
        """``train.seeds`` (an integer) and ``train.lr_multipliers`` (a list of distinct positive
        numbers): fixed settings of every candidate's training, not searched."""
        if not isinstance(train, dict):
            return DEFAULT_SEEDS, DEFAULT_LR_MULTIPLIERS
        seeds = train.get("seeds", DEFAULT_SEEDS)
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
            raise self.fail(
                "train.seeds", f"{seeds!r} must be an integer in [1, {MAX_SEEDS}] (one value, not a choice)"
            )
        raw = train.get("lr_multipliers", list(DEFAULT_LR_MULTIPLIERS))
        what = f"must be a list of 1-{MAX_LR_MULTIPLIERS} distinct numbers in [0.001, 1000], e.g. [0.5, 1, 2]"
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LR_MULTIPLIERS:
            raise self.fail("train.lr_multipliers", f"{raw!r} {what}")
        for m in raw:
            if isinstance(m, bool) or not isinstance(m, int | float) or not 1e-3 <= m <= 1e3:
                raise self.fail("train.lr_multipliers", f"{m!r} {what}")
        if len(set(raw)) != len(raw):
            raise self.fail("train.lr_multipliers", f"{raw!r} {what}")
        return seeds, tuple(float(m) for m in raw)

    def seconds(self, raw: Any) -> float | None:
        if raw is None:
            return None
        value = self.number("max_train_seconds", raw, float)
        if not LIMITS["max_train_seconds"].holds(value):
            raise self.fail("max_train_seconds", f"{raw!r} must be a positive number of seconds")
        return value

    @staticmethod
    def _allowed(kind: Any) -> str:
        return str(list(kind)) if isinstance(kind, tuple) else kind.__name__

    def section(self, name: str, raw: Any, fields: dict[str, tuple[Any, bool]]) -> dict[str, Choice]:
        if not isinstance(raw, dict):
            raise self.fail(name, "must be a mapping of field: choices")
        unknown = sorted(set(raw) - set(fields), key=str)  # keys may be any YAML scalar
        if unknown:
            allowed = sorted(fields) + (sorted(_POPULATION_FIELDS) if name == "train" else [])
            raise self.fail(f"{name}.{unknown[0]}", f"unknown field; allowed {allowed}")
        out = {}
        for field, (kind, required) in fields.items():
            if field in raw:
                out[field] = self.choice(f"{name}.{field}", raw[field], kind)
            elif required:
                raise self.fail(f"{name}.{field}", "is required")
        return out


@dataclass(frozen=True)
class SearchSpace:
    """A validated space. ``layer``, ``train`` and ``precision`` (the study-wide dtypes; empty: the
    space has no ``precision:``) map field names to their Choice."""

    name: str
    description: str
    task: str
    depth: Choice
    d_model: Choice
    layer: dict[str, Choice]
    train: dict[str, Choice]
    max_train_seconds: float | None
    source: str
    text: str = ""  # the file as read: what a study records (workers rebuild the space from it)
    # every candidate trains as a population of seeds x learning rates (train.seeds, train.lr_multipliers)
    seeds: int = DEFAULT_SEEDS
    lr_multipliers: tuple[float, ...] = DEFAULT_LR_MULTIPLIERS
    precision: dict[str, Choice] = dataclass_field(default_factory=dict)

    def sample(self, trial: optuna.Trial, task: Task, study_seed: int = 0) -> Candidate:
        """Draw one candidate through ``trial`` (parameter names ``depth``, ``d_model``,
        ``layer{i}.<field>``, ``precision.<field>``, ``train.<field>``) sized for ``task``. Its
        training seed derives from ``study_seed`` and the configuration (``nas.spec.training_seed``),
        not from the trial. A study-wide precision field is drawn once, when some layer holds what
        it stores, and applies to every such layer."""
        depth = self.depth.suggest(trial, "depth")
        d_model = self.d_model.suggest(trial, "d_model")
        layers = tuple(self._sample_layer(trial, i) for i in range(depth))
        shared = {
            name: choice.suggest(trial, f"precision.{name}")
            for name, choice in self.precision.items()
            if any(layer.stores(name) for layer in layers)
        }
        if shared:
            layers = tuple(replace(la, **{k: v for k, v in shared.items() if la.stores(k)}) for la in layers)
        arch = ArchSpec(d_model, layers, task.vocab_size, task.n_out, task.readout)
        fields = {"optimizer": self.train["optimizer"].suggest(trial, "train.optimizer")}
        for field, choice in self.train.items():
            if field == "optimizer" or (field in ("momentum", "nesterov") and fields["optimizer"] != "sgd"):
                continue
            fields[field] = choice.suggest(trial, f"train.{field}")
        recipe = TrainSpec(**fields, seeds=self.seeds, lr_multipliers=self.lr_multipliers)
        return Candidate(arch, replace(recipe, seed=training_seed(study_seed, arch, recipe)))

    def configurations(self) -> int | None:
        """How many distinct candidates (architecture and recipe) ``sample`` can draw, or None when
        a field is a continuous range. Fields a draw skips (heads and conv for MLP-only blocks, the
        feature map outside linear attention, SGD's momentum for the other optimizers, a precision
        field where no layer holds what it stores) count only where they are drawn."""

        def n(choice: Choice | None) -> int | None:
            return 1 if choice is None else choice.count()

        def product(*counts: int | None) -> int | None:
            return None if None in counts else math.prod(counts)

        layer = self.layer
        styles = product(n(layer.get("activation")), n(layer.get("norm")))
        ratio = layer["mlp_ratio"]
        ratios, empty = n(ratio), int(0 in ratio.values())  # 0: a choice, or a range's low end (its first grid point)
        # one block's configurations by what it holds: A(ttention), L(inear attention), M(LP only), E(mpty)
        kinds = {"A": 0, "L": 0, "M": 0, "E": 0}
        for mixer in layer["mixer"].values():
            if mixer == "none":
                if ratios is None or styles is None:
                    return None
                kinds["M"] += (ratios - empty) * styles * n(layer.get("weight_dtype"))
                kinds["E"] += empty * styles
                continue
            own = product(
                ratios, styles, n(layer.get("heads")), n(layer.get("short_conv")), n(layer.get("weight_dtype"))
            )
            if mixer == "linear_attention":
                own = product(own, n(layer.get("feature_map")), n(layer.get("state_dtype")))
            else:
                own = product(own, n(layer.get("kv_dtype")))
            if own is None:
                return None
            kinds["A" if mixer == "attention" else "L"] += own
        widths, depth = self.d_model.count(), self.depth
        if widths is None or depth.count() is None:
            return None
        # a study-wide precision field is drawn when some block of the stack holds what it stores
        wide = {name: n(self.precision.get(name)) for name in PRECISION_FIELDS}
        factor = {
            frozenset(present): (wide["kv_dtype"] if "A" in present else 1)
            * (wide["state_dtype"] if "L" in present else 1)
            * (wide["weight_dtype"] if present & {"A", "L", "M"} else 1)
            for present in _subsets(kinds)
        }
        depths = depth.choices or range(int(depth.low), int(depth.high) + 1, int(depth.step or 1))
        stacks = sum(
            _exactly(present, kinds, int(d)) * factor[frozenset(present)] for d in depths for present in _subsets(kinds)
        )
        recipes = 0
        for optimizer in self.train["optimizer"].values():
            skipped = ("optimizer",) if optimizer == "sgd" else ("optimizer", "momentum", "nesterov")
            count = product(*(n(c) for k, c in self.train.items() if k not in skipped))
            if count is None:
                return None
            recipes += count
        return widths * stacks * recipes

    def offers_fp8(self) -> bool:
        """Whether a candidate can store its KV cache or weights in fp8."""
        found = [*self.precision.items(), *self.layer.items()]
        return any(name in PRECISION_FIELDS and "fp8" in choice.values() for name, choice in found)

    def differences(self, other: SearchSpace) -> list[str]:
        """``field: ours -> theirs`` for each field on which ``other`` samples or trains candidates
        differently. The parsed fields are compared, not the text: comments, layout, key order,
        number spelling (``1e-3``, ``0.001``) and the description do not count."""
        ours, theirs = self._searched(), other._searched()
        return [
            f"{key}: {_shown(ours.get(key))} -> {_shown(theirs.get(key))}"
            for key in {**ours, **theirs}
            if ours.get(key) != theirs.get(key)
        ]

    def _searched(self) -> dict[str, Choice | float | None]:
        return {
            "depth": self.depth,
            "d_model": self.d_model,
            **{f"layer.{k}": v for k, v in self.layer.items()},
            **{f"precision.{k}": v for k, v in self.precision.items()},
            **{f"train.{k}": v for k, v in self.train.items()},
            "max_train_seconds": self.max_train_seconds,
        }

    def check_measurable(self) -> None:
        """SpaceError unless every (d_model, heads) gives a head dim the GPU kernels run (the
        kernels' rule, ``padded_head_dim``). A search asks it whether latency is measured or
        predicted: a prediction is of those kernels too, and a candidate none of them runs could
        only get a roofline guess, far below the calibrated model's predictions, which put it
        first on a front of calibrated predictions (and ``--pick latency`` exported it)."""
        from kernels.attention import SUPPORTED_HEAD_DIMS, padded_head_dim  # loads torch: only when measuring

        if set(self.layer["mixer"].values()) == {"none"}:
            return
        for heads in self.layer["heads"].values():
            for d in self.d_model.values():
                head_dim = d // heads
                if padded_head_dim(head_dim) is None:
                    raise SpaceError(
                        f"{self.source}: layer.heads: {heads} heads on d_model={d} give head dim "
                        f"{head_dim}; the Triton kernels whose latency is measured or predicted run even "
                        f"head dims up to {max(SUPPORTED_HEAD_DIMS)}: use more heads or other widths"
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
        spec = LayerSpec(**fields)
        dtypes = {name: pick(name) for name in PRECISION_FIELDS if name in self.layer and spec.stores(name)}
        return replace(spec, **dtypes) if dtypes else spec


def _subsets(kinds: dict[str, int]) -> list[set[str]]:
    """Every set of block kinds (``configurations``'s A, L, M, E), the empty one included."""
    names = sorted(kinds)
    return [{k for i, k in enumerate(names) if mask >> i & 1} for mask in range(1 << len(names))]


def _exactly(present: set[str], kinds: dict[str, int], depth: int) -> int:
    """Stacks of ``depth`` blocks drawn from ``kinds`` (configurations per kind) that hold every
    kind of ``present`` and no other (inclusion-exclusion over the kinds left out)."""
    return sum(
        (-1) ** (len(present) - len(sub)) * sum(kinds[k] for k in sub) ** depth
        for sub in _subsets({k: kinds[k] for k in present})
    )


def _shown(value: Choice | float | None) -> str:
    return "(absent)" if value is None else str(value) if isinstance(value, Choice) else f"{value:g}"


def parse_space(raw: Any, source: str, default_name: str | None = None) -> SearchSpace:
    """Validate the parsed YAML ``raw`` read from ``source`` (a file name used in messages). A
    space without ``name:`` is named ``default_name``, else after the file."""
    r = _Reader(source)
    if not isinstance(raw, dict):
        raise SpaceError(f"{source}: the file must hold a mapping with fields {sorted(_TOP_FIELDS)}")
    unknown = sorted(set(raw) - _TOP_FIELDS, key=str)  # keys may be any YAML scalar
    if unknown:
        raise r.fail(unknown[0], f"unknown field; allowed {sorted(_TOP_FIELDS)}")
    for field in ("depth", "d_model", "layer", "train"):
        if field not in raw:
            raise r.fail(field, "is required")
    depth, d_model = r.choice("depth", raw["depth"], int), r.choice("d_model", raw["d_model"], int)
    if d_model.choices is None:
        raise r.fail("d_model", "must be a list of widths (heads must divide each of them)")
    seeds, lr_multipliers = r.population(raw["train"])
    train_raw = (
        {k: v for k, v in raw["train"].items() if k not in _POPULATION_FIELDS}
        if isinstance(raw["train"], dict)
        else raw["train"]
    )
    layer, train = r.section("layer", raw["layer"], _LAYER_FIELDS), r.section("train", train_raw, _TRAIN_FIELDS)
    mixers = set(layer["mixer"].values())
    if mixers - {"none"}:
        if "heads" not in layer or layer["heads"].choices is None:
            raise r.fail("layer.heads", "a list of head counts is required when a mixer can be attention")
        for heads in layer["heads"].values():
            bad = [d for d in d_model.values() if d % heads]
            if bad:
                raise r.fail(
                    "layer.heads",
                    f"{heads} heads do not divide d_model={bad[0]}; every choice must "
                    f"divide every width in {list(d_model.values())}",
                )

    precision = _precision(r, raw, layer, mixers)
    if "linear_attention" in mixers and "feature_map" not in layer:
        raise r.fail(
            "layer.feature_map", f"is required when linear_attention is a choice; allowed {list(FEATURE_MAPS)}"
        )
    nesterov, momentum = train.get("nesterov"), train.get("momentum")  # momentum's default is 0.9
    if "sgd" in train["optimizer"].values() and nesterov is not None and True in nesterov.values():
        if momentum is not None and min(momentum.values()) == 0:  # SGD would refuse it inside a trial
            raise r.fail("train.nesterov", "true needs momentum > 0, but train.momentum can be 0")
    return SearchSpace(
        r.name(raw.get("name"), default_name or Path(source).stem),
        r.string("description", raw.get("description"), "a string", required=False),
        r.string("task", raw.get("task", "mqar"), "a task spec string such as 'mqar:seq_len=64'"),
        depth,
        d_model,
        layer,
        train,
        r.seconds(raw.get("max_train_seconds")),
        source,
        seeds=seeds,
        lr_multipliers=lr_multipliers,
        precision=precision,
    )


def _precision(r: _Reader, raw: dict, layer: dict[str, Choice], mixers: set[str]) -> dict[str, Choice]:
    """The study-wide ``precision:`` fields of the space ``raw`` (none when it has no such block; a
    block holds at least one, as ``layer:`` and ``train:`` do). A field is given in one place,
    study-wide or per layer; a narrower dtype is offered only where a mixer that holds it can be
    drawn (an fp8 KV cache with no attention in the space would change nothing, and so would fp8
    weights in a space whose blocks have neither a mixer nor an MLP)."""
    precision = r.section("precision", raw["precision"], _PRECISION_FIELDS) if "precision" in raw else {}
    if "precision" in raw and not precision:  # `precision: {}` was meant to hold choices, as a bare one was
        raise r.fail("precision", f"holds no field; give one of {list(PRECISION_FIELDS)}, or leave the block out")
    for name, allowed in PRECISION_FIELDS.items():
        if name in precision and name in layer:
            raise r.fail(
                f"layer.{name}",
                f"is also given under precision:; give it once, study-wide (precision.{name}) or per layer",
            )
        where, choice = (
            (f"precision.{name}", precision[name]) if name in precision else (f"layer.{name}", layer.get(name))
        )
        holder = _HOLDER.get(name)
        if choice is not None and holder is not None and holder not in mixers and set(choice.values()) - {allowed[0]}:
            what = name.removesuffix("_dtype")
            raise r.fail(where, f"stores the {what} of {holder} layers, and layer.mixer offers no {holder}")
        # linear weights are a mixer's (QKV, out) or an MLP's (up, down): an MLP-only block of
        # mlp_ratio 0 has none (a range can draw above 0 where its high end is)
        weighted = mixers - {"none"} or any(v > 0 for v in layer["mlp_ratio"].values())
        if name == "weight_dtype" and choice is not None and not weighted and set(choice.values()) - {allowed[0]}:
            raise r.fail(
                where,
                "stores the linear weights of blocks with a mixer or an MLP, and no block has either "
                "(layer.mixer offers only none, layer.mlp_ratio only 0)",
            )
    return precision


def parse_space_text(text: str, source: str, default_name: str | None = None) -> SearchSpace:
    """Validate a space file's ``text`` (``source`` names it in messages). Safe loading only (no
    Python objects from user files), and a key given twice is an error, not "the last one wins".
    ``default_name`` is the name of a space whose text has no ``name:``."""
    try:
        raw = load_unique(text)
    except DuplicateKey as e:
        raise SpaceError(f"{source}: {e.key}: given twice (lines {e.first} and {e.second}); write it once") from None
    except yaml.reader.ReaderError as e:  # a control character; its str() spans two lines
        line = text.count("\n", 0, e.position) + 1
        raise SpaceError(
            f"{source}: invalid YAML at line {line}: character #x{e.character:04x} is not allowed"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise SpaceError(f"{source}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise SpaceError(f"{source}: invalid YAML: nested too deeply") from None
    return replace(parse_space(raw, source, default_name), text=text)


def read_space_file(path: Path) -> SearchSpace:
    """Load and validate one YAML file: UTF-8 text of at most 1 MiB."""
    try:
        text = read_text(path, "a search-space file")
    except YamlFileError as e:
        raise SpaceError(f"{path}: {e}") from None
    return parse_space_text(text, str(path))


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
        if path.is_dir():
            raise SpaceError(f"{path}: is a folder; give a search-space YAML file or a shipped space's name")
        if not path.is_file():
            raise SpaceError(f"{path}: no such search-space file")
        return read_space_file(path)
    shipped = _shipped() / f"{text}.yaml"
    if not shipped.is_file():
        raise SpaceError(f"unknown search space {text!r}; shipped spaces are {list_spaces()} (or pass a .yaml path)")
    return read_space_file(shipped)
