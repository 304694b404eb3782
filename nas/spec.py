"""Frozen specifications: what a candidate *is*, independent of how it is trained or timed.

``ArchSpec`` describes the network, ``TrainSpec`` the recipe that trains it. Both round-trip
through plain JSON dicts (the format written into study user_attrs and export bundles), and
``arch_hash`` is a stable digest used as a cache key for measured latencies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIXERS",
    "FEATURE_MAPS",
    "ACTIVATIONS",
    "NORMS",
    "OPTIMIZERS",
    "READOUTS",
    "KV_DTYPES",
    "STATE_DTYPES",
    "WEIGHT_DTYPES",
    "PRECISION_FIELDS",
    "LayerSpec",
    "ArchSpec",
    "TrainSpec",
    "Candidate",
    "arch_hash",
    "training_seed",
]

MIXERS = ("attention", "linear_attention", "none")
FEATURE_MAPS = ("identity", "elu+1", "relu")
ACTIVATIONS = ("gelu", "relu", "silu")
NORMS = ("layernorm", "rmsnorm")
OPTIMIZERS = ("sgd", "adamw", "radam", "lion")
READOUTS = ("token", "last")  # per-position logits, or one prediction from the last position
# How a deployed model stores what a decode step reads, widest first: the first of each is what the
# library's kernels store today and the default (no rounding in the evaluation, nothing written to
# an ArchSpec's JSON); the others are narrower and evaluated rounded (nas.models.precision)
KV_DTYPES = ("bf16", "fp8")  # softmax attention's KV cache
STATE_DTYPES = ("fp32", "bf16")  # linear attention's recurrent state and normalizer
WEIGHT_DTYPES = ("bf16", "fp8")  # the blocks' linear layers' weights
# field -> (allowed, which layers it applies to)
PRECISION_FIELDS: dict[str, tuple[str, ...]] = {
    "kv_dtype": KV_DTYPES,
    "state_dtype": STATE_DTYPES,
    "weight_dtype": WEIGHT_DTYPES,
}


_APPLIES = {"kv_dtype": "attention", "state_dtype": "linear_attention", "weight_dtype": "blocks with a mixer or an MLP"}
_SHORT = {"kv_dtype": "kv", "state_dtype": "state", "weight_dtype": "weights"}


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class LayerSpec:
    """One pre-norm residual block: ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``.

    ``heads`` is 0 and ``feature_map`` is None when they do not apply to the mixer.
    ``short_conv`` is the kernel size of a depthwise causal convolution over the q, k, v
    projections (0 = none), as in fla / Based (Arora et al. 2024); it lets one layer see the
    previous tokens, which associative recall needs. ``mlp_ratio`` 0 means the block has no MLP.

    ``kv_dtype``, ``state_dtype`` and ``weight_dtype`` say how a deployment stores the block's KV
    cache (attention only), recurrent state (linear attention only) and linear-layer weights (a
    block with a mixer or an MLP): at their defaults, the widest, as the library's kernels store
    them today. They change the evaluation and the memory, never the training (``nas.models.precision``).
    """

    mixer: str
    heads: int = 0
    feature_map: str | None = None
    short_conv: int = 0
    mlp_ratio: float = 4.0
    activation: str = "gelu"
    norm: str = "layernorm"
    kv_dtype: str = KV_DTYPES[0]
    state_dtype: str = STATE_DTYPES[0]
    weight_dtype: str = WEIGHT_DTYPES[0]

    def __post_init__(self) -> None:
        _check(self.mixer in MIXERS, f"mixer {self.mixer!r} is not one of {list(MIXERS)}")
        if self.mixer == "none":
            _check(self.heads == 0, "heads must be 0 for mixer 'none'")
            _check(self.feature_map is None, "feature_map applies only to linear_attention")
            _check(self.short_conv == 0, "short_conv must be 0 for mixer 'none'")
        else:
            _check(self.heads >= 1, f"heads must be >= 1 for mixer {self.mixer!r}")
        if self.mixer == "linear_attention":
            _check(
                self.feature_map in FEATURE_MAPS,
                f"feature_map {self.feature_map!r} is not one of {list(FEATURE_MAPS)}",
            )
        elif self.mixer == "attention":
            _check(self.feature_map is None, "feature_map applies only to linear_attention")
        _check(0 <= self.short_conv <= 16, f"short_conv must be in [0, 16], got {self.short_conv}")
        _check(self.mlp_ratio >= 0, f"mlp_ratio must be >= 0, got {self.mlp_ratio}")
        _check(self.activation in ACTIVATIONS, f"activation {self.activation!r} is not one of {list(ACTIVATIONS)}")
        _check(self.norm in NORMS, f"norm {self.norm!r} is not one of {list(NORMS)}")
        for name, allowed in PRECISION_FIELDS.items():
            value = getattr(self, name)
            _check(value in allowed, f"{name} {value!r} is not one of {list(allowed)}")
            # a dtype of something the block does not hold stays at its default: one spelling per
            # architecture, so its arch_hash and training seed do not depend on a no-op field
            _check(
                value == allowed[0] or self.stores(name),
                f"{name} applies only to {_APPLIES[name]} (got {value!r} for mixer {self.mixer!r})",
            )

    def stores(self, field: str) -> bool:
        """Whether the block holds what precision ``field`` is about: a KV cache (attention), a
        recurrent state (linear attention), linear layers (a mixer or an MLP)."""
        if field == "kv_dtype":
            return self.mixer == "attention"
        if field == "state_dtype":
            return self.mixer == "linear_attention"
        return self.mixer != "none" or self.mlp_ratio > 0

    @property
    def full_precision(self) -> bool:
        """Every precision field at its default (the widest)."""
        return all(getattr(self, name) == allowed[0] for name, allowed in PRECISION_FIELDS.items())

    def to_dict(self) -> dict[str, Any]:
        """As JSON: the precision fields only where they differ from the default, so the dict and
        ``arch_hash`` of an architecture without them are what they were before the fields existed."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if k not in PRECISION_FIELDS or v != PRECISION_FIELDS[k][0]
        }

    def code(self) -> str:
        """One letter for the mixer: A(ttention), L(inear attention), M(LP-only)."""
        return {"attention": "A", "linear_attention": "L", "none": "M"}[self.mixer]


@dataclass(frozen=True)
class ArchSpec:
    """A whole network. ``vocab_size`` and ``n_out`` come from the task it is built for.

    Positions enter through rotary embeddings in softmax attention (and the causal order of
    every mixer), computed from the sequence length at run time, so a model trained at one
    length runs at any other.
    """

    d_model: int
    layers: tuple[LayerSpec, ...]
    vocab_size: int
    n_out: int
    readout: str = "token"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        _check(self.d_model >= 1, f"d_model must be >= 1, got {self.d_model}")
        _check(len(self.layers) >= 1, "an architecture needs at least one layer")
        _check(self.vocab_size >= 1 and self.n_out >= 1, "vocab_size and n_out must be >= 1")
        _check(self.readout in READOUTS, f"readout {self.readout!r} is not one of {list(READOUTS)}")
        for i, layer in enumerate(self.layers):
            if layer.heads:
                _check(
                    self.d_model % layer.heads == 0,
                    f"layer {i}: heads={layer.heads} does not divide d_model={self.d_model}",
                )

    @property
    def depth(self) -> int:
        return len(self.layers)

    def summary(self) -> str:
        """Short human string, e.g. ``A L L M | d=128``, and ``A L | d=64 | kv fp8`` for an
        architecture stored below full precision (``precision_text``)."""
        text = f"{' '.join(layer.code() for layer in self.layers)} | d={self.d_model}"
        return f"{text} | {precision}" if (precision := self.precision_text()) else text

    @property
    def full_precision(self) -> bool:
        """Every layer stores KV cache, state and weights at the default (widest) dtypes."""
        return all(layer.full_precision for layer in self.layers)

    def at_full_precision(self) -> ArchSpec:
        """The same network with every precision field at its default: what is trained."""
        defaults = {name: allowed[0] for name, allowed in PRECISION_FIELDS.items()}
        return dataclasses.replace(self, layers=tuple(dataclasses.replace(la, **defaults) for la in self.layers))

    def precision_text(self) -> str:
        """``kv fp8, state bf16, weights fp8``: the dtypes that differ from the defaults, each as the
        value shared by the layers it applies to, or the per-layer values in layer order
        (``kv fp8/bf16``); empty at full precision."""
        parts = []
        for name, allowed in PRECISION_FIELDS.items():
            dtypes = [getattr(la, name) for la in self.layers if la.stores(name)]
            if any(v != allowed[0] for v in dtypes):
                shown = dtypes[0] if len(set(dtypes)) == 1 else "/".join(dtypes)
                parts.append(f"{_SHORT[name]} {shown}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"layers": [la.to_dict() for la in self.layers]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArchSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        _check(not unknown, f"unknown ArchSpec fields: {sorted(unknown)}")
        layers = tuple(LayerSpec(**layer) for layer in data["layers"])
        return cls(**{**data, "layers": layers})


@dataclass(frozen=True)
class TrainSpec:
    """The training recipe. ``beta1``/``beta2`` None take the optimizer's own defaults
    (AdamW/RAdam 0.9/0.999, Lion 0.9/0.99). ``grad_clip`` 0 and ``grad_noise`` 0 switch
    those features off; ``warmup_frac`` is the fraction of ``steps`` spent warming up."""

    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_frac: float = 0.1
    steps: int = 200
    batch_size: int = 32
    momentum: float = 0.9
    nesterov: bool = False
    beta1: float | None = None
    beta2: float | None = None
    eps: float = 1e-8
    grad_clip: float = 1.0
    grad_noise: float = 0.0
    grad_noise_gamma: float = 0.55
    seed: int = 0
    # the population each candidate trains as: ``seeds`` seeds (derived from ``seed``) times the
    # learning rates ``lr * m`` for each m of ``lr_multipliers``; 1 x (1.0,) is a single run
    seeds: int = 1
    lr_multipliers: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        _check(self.optimizer in OPTIMIZERS, f"optimizer {self.optimizer!r} is not one of {list(OPTIMIZERS)}")
        _check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(0 <= self.warmup_frac < 1, f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        _check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _check(self.grad_clip >= 0 and self.grad_noise >= 0, "grad_clip and grad_noise must be >= 0")
        object.__setattr__(self, "lr_multipliers", tuple(float(m) for m in self.lr_multipliers))
        _check(self.seeds >= 1, f"seeds must be >= 1, got {self.seeds}")
        _check(
            len(self.lr_multipliers) >= 1 and all(m > 0 for m in self.lr_multipliers),
            f"lr_multipliers must be one or more positive numbers, got {list(self.lr_multipliers)}",
        )
        _check(
            len(set(self.lr_multipliers)) == len(self.lr_multipliers),
            f"lr_multipliers must be distinct, got {list(self.lr_multipliers)}",
        )

    @property
    def population(self) -> int:
        """How many variants (seeds x learning rates) train together."""
        return self.seeds * len(self.lr_multipliers)

    def variant_seeds(self) -> tuple[int, ...]:
        """The ``seeds`` training seeds: ``seed`` itself first (a 1 x 1 population is the single
        run of ``seed``), then seeds derived from it."""
        return (self.seed,) + tuple(_digest_int(f"{self.seed}:variant:{i}") for i in range(1, self.seeds))

    def lrs(self) -> tuple[float, ...]:
        """The learning rates the population tries, in ``lr_multipliers`` order."""
        return tuple(self.lr * m for m in self.lr_multipliers)

    def summary(self) -> str:
        return f"{self.optimizer} lr={self.lr:.1e}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"lr_multipliers": list(self.lr_multipliers)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        _check(not unknown, f"unknown TrainSpec fields: {sorted(unknown)}")
        return cls(**{**data, "lr_multipliers": tuple(data.get("lr_multipliers", (1.0,)))})


@dataclass(frozen=True)
class Candidate:
    """What one trial evaluates: an architecture and the recipe that trains it."""

    arch: ArchSpec
    train: TrainSpec


def arch_hash(arch: ArchSpec) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of ``arch`` (key order independent)."""
    blob = json.dumps(arch.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _digest_int(text: str) -> int:
    """31 bits of SHA-256 over ``text``: a seed torch, numpy and Triton's Philox all accept."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def training_seed(study_seed: int, arch: ArchSpec, train: TrainSpec) -> int:
    """The training seed of a configuration in a study seeded with ``study_seed``: a digest of the
    seed, the architecture (at full precision: its dtypes are not trained) and every recipe field
    but ``seed`` itself. It does not depend on the trial number, so a re-queued, resumed or
    retrained trial, and the same configuration in another study with the same seed, train the
    same (and so do the same network's candidates at other precisions)."""
    recipe = {k: v for k, v in train.to_dict().items() if k != "seed"}
    # the precision fields change how a model is evaluated, not how it is trained: a network
    # trains the same whichever dtypes it is later stored at, so their accuracies compare
    trained = arch.at_full_precision()
    blob = json.dumps({"arch": trained.to_dict(), "train": recipe}, sort_keys=True, separators=(",", ":"))
    return _digest_int(f"{study_seed}:{blob}")
