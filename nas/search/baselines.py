"""Reference architectures every study starts with, so a front shows what the search beat.

Three known designs, drawn from the study's own space at its middle width and one depth:

- ``all-attention``: every block softmax attention;
- ``all-linear``: every block causal linear attention;
- ``3:1 hybrid``: three linear-attention blocks per attention block, attention last in each group
  (the layout of Qwen3-Next and Kimi Linear; ablations put the best ratio at 3:1-6:1). At a depth
  below 4 it is ``(depth-1):1``, and it is left out at depth 1.

The depth is 4 where the space allows it, else the allowed depth nearest to 4; the width is the
middle of the space's ``d_model`` values. Every other field takes a fixed, documented pick from
the space (``_PREFERRED`` where the value exists, else the middle of the choices, the upper of
two; numeric ranges their middle, geometric for log ranges), so the three differ only in their mixers.
The precision fields take their widest choice: a reference is scored as the library's kernels
store it today, so a candidate's narrower dtypes are measured against it. A baseline
whose mixer the space does not offer, or that has no head count dividing the width, is left out.

They are enqueued once, by the process that creates the study (``nas.search.study.prepare``), so
several workers never queue them twice; they count toward ``--trials`` like any trained trial,
are never stopped early (a reference is trained in full) and are labelled in the table and the
report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nas.space import Choice, SearchSpace
from nas.spec import PRECISION_FIELDS, LayerSpec

__all__ = ["Baseline", "baselines"]

# the conventional pick for a field where the space offers it: Katharopoulos et al.'s feature map,
# the transformer's activation and norm, AdamW
_PREFERRED: dict[str, Any] = {
    "feature_map": "elu+1",
    "activation": "gelu",
    "norm": "layernorm",
    "optimizer": "adamw",
    **{name: allowed[0] for name, allowed in PRECISION_FIELDS.items()},  # the widest: full precision
}
_HYBRID_DEPTH = 4


@dataclass(frozen=True)
class Baseline:
    """A reference candidate: its label and the Optuna parameters that draw it from the space."""

    label: str
    params: dict[str, Any]


def _middle(choice: Choice) -> Any:
    """The middle value of a field: the middle choice (the upper of two middles: 300 of [150, 300]
    steps, a reference trains at the space's full budget), or the range's middle (geometric for
    a log range) on its step grid."""
    if choice.choices is not None:
        return choice.choices[len(choice.choices) // 2]
    lo, hi = float(choice.low), float(choice.high)
    mid = math.sqrt(lo * hi) if choice.log else (lo + hi) / 2
    if choice.step:
        mid = lo + round((mid - lo) / choice.step) * choice.step
    return int(round(mid)) if choice.is_int else mid


def _pick(field: str, choice: Choice) -> Any:
    preferred = _PREFERRED.get(field)
    if choice.choices is not None and preferred in choice.choices:
        return preferred
    return _middle(choice)


def _searched(choice: Choice) -> bool:
    """Whether the field is an Optuna parameter (a fixed single choice is not)."""
    return choice.choices is None or len(choice.choices) > 1


def _holds(mixer: str, field: str) -> bool:
    """Whether a block with ``mixer`` holds what precision ``field`` stores (``LayerSpec.stores``)."""
    return LayerSpec(mixer, heads=1, feature_map="elu+1" if mixer == "linear_attention" else None).stores(field)


def _depth(choice: Choice) -> int:
    allowed = choice.choices or range(int(choice.low), int(choice.high) + 1, int(choice.step or 1))
    return min(allowed, key=lambda d: (abs(d - _HYBRID_DEPTH), -d))


def _width(choice: Choice) -> int:
    if choice.choices is not None:
        ordered = sorted(choice.choices)
        return ordered[len(ordered) // 2]
    return _middle(choice)


def baselines(space: SearchSpace) -> list[Baseline]:
    """The reference candidates ``space`` can express (see the module docstring), in queue order."""
    depth, width = _depth(space.depth), _width(space.d_model)
    mixers = set(space.layer["mixer"].values())
    heads = [h for h in space.layer["heads"].values() if width % h == 0] if "heads" in space.layer else []
    designs = [
        ("all-attention", ["attention"] * depth),
        ("all-linear", ["linear_attention"] * depth),
    ]
    if depth >= 2:
        designs.append((f"{depth - 1}:1 hybrid", ["linear_attention"] * (depth - 1) + ["attention"]))
    common: dict[str, Any] = {}
    for name, value, choice in (("depth", depth, space.depth), ("d_model", width, space.d_model)):
        if _searched(choice):
            common[name] = value
    train = {}
    optimizer = _pick("optimizer", space.train["optimizer"])
    for field, choice in space.train.items():
        if field in ("momentum", "nesterov") and optimizer != "sgd":
            continue
        if _searched(choice):
            train[f"train.{field}"] = optimizer if field == "optimizer" else _pick(field, choice)
    out = []
    for label, layers in designs:
        if not set(layers) <= mixers or not heads:
            continue
        params = dict(common)
        for i, mixer in enumerate(layers):
            fields: dict[str, Any] = {"mixer": mixer, "heads": heads[len(heads) // 2]}
            for field in ("mlp_ratio", "activation", "norm", "short_conv"):
                if field in space.layer:
                    fields[field] = _pick(field, space.layer[field])
            if mixer == "linear_attention":
                fields["feature_map"] = _pick("feature_map", space.layer["feature_map"])
            for name in PRECISION_FIELDS:
                if name in space.layer and _holds(mixer, name):
                    fields[name] = _pick(name, space.layer[name])
            for field, value in fields.items():
                if _searched(space.layer[field]):
                    params[f"layer{i}.{field}"] = value
        for name, choice in space.precision.items():  # study-wide: drawn when some block holds it
            if _searched(choice) and any(_holds(mixer, name) for mixer in layers):
                params[f"precision.{name}"] = _pick(name, choice)
        out.append(Baseline(label, {**params, **train}))
    return out
