"""Hardware profiles: what a GPU can do on paper, plus what it achieved when measured.

A profile is a YAML file (``h200.yaml``, ...). The shipped ones live next to this module; a
user passes the path of their own copy. Peaks are datasheet numbers with a ``source:`` note
each; the ``calibrated:`` section holds achieved fractions measured on a real device and is
read by the latency predictor (``nas.latency``), which falls back to documented defaults.

Units are in the field names: ``memory_bandwidth_gb_s`` is 1e9 bytes/s, ``peak_tflops`` is
1e12 FLOP/s, ``launch_overhead_us`` is microseconds, ``memory_gb`` (optional: the device memory,
which the search compares the candidates' predicted memory with) is 1e9 bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from hardware_profiles.yaml_files import DuplicateKey, YamlFileError, load_unique, read_text

__all__ = [
    "DTYPES",
    "KERNEL_FEATURES",
    "KERNEL_FEATURES_ADDED",
    "Calibration",
    "HardwareProfile",
    "PeakTflops",
    "ProfileError",
    "detect_profile",
    "list_profiles",
    "load_profile",
    "parse_profile",
]

DTYPES = ("fp32", "tf32", "bf16", "fp16")  # tf32: fp32 storage, TF32 tensor-core matmuls


class ProfileError(ValueError):
    """A profile name, file or field is wrong; the one-line message names which and why."""


@dataclass(frozen=True)
class PeakTflops:
    """Dense (no 2:4 sparsity) peak throughput per dtype, in TFLOP/s."""

    fp32: float
    tf32: float
    bf16: float
    fp16: float


@dataclass(frozen=True)
class Calibration:
    """Achieved fractions of peak measured on a real GPU; ``None``/absent means not measured.

    ``flops_fractions`` holds ``(dtype, fraction)`` pairs (a tuple keeps the profile hashable).
    """

    bandwidth_fraction: float | None = None
    flops_fractions: tuple[tuple[str, float], ...] = ()
    launch_overhead_us: float | None = None
    measured_with: str | None = None
    # Written by `nas profiles calibrate` (nas.latency.calibrate): where and from what the kernel
    # cost model was fitted, its interval (relative half-width: the 95th percentile of |error| on
    # architectures the fit never saw), the check behind it and the model itself. The nested
    # mappings are kept as canonical JSON text so the profile stays hashable; nas.latency reads them.
    provenance: tuple[tuple[str, str], ...] = ()  # gpu, driver, torch, triton, kernels_fingerprint, date
    sm_count: int | None = None
    interval: float | None = None
    check_json: str | None = None
    kernel_model_json: str | None = None
    decode_model_json: str | None = None  # the decode-step cost model, canonical JSON (see `decode_model`)

    def flops_fraction(self, dtype: str) -> float | None:
        return dict(self.flops_fractions).get(dtype)

    def get(self, key: str) -> str | None:
        """One provenance entry (``gpu``, ``driver``, ``torch``, ``triton``, ``kernels_fingerprint``, ``date``)."""
        return dict(self.provenance).get(key)

    @property
    def kernel_model(self) -> dict[str, Any] | None:
        """The fitted kernel model as a plain mapping, or None when never calibrated."""
        return None if self.kernel_model_json is None else json.loads(self.kernel_model_json)

    @property
    def decode_model(self) -> dict[str, Any] | None:
        """The fitted decode-step model as a plain mapping, or None when never calibrated."""
        return None if self.decode_model_json is None else json.loads(self.decode_model_json)

    @property
    def check(self) -> dict[str, Any]:
        return {} if self.check_json is None else json.loads(self.check_json)


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU. ``sources`` holds ``(field, note)`` pairs; ``path`` is the file it came from."""

    name: str
    description: str
    device_names: tuple[str, ...]
    sm_count: int
    l2_bytes: int
    smem_per_sm_bytes: int
    memory_bandwidth_gb_s: float
    peak_tflops: PeakTflops
    launch_overhead_us: float
    memory_gb: float | None = None  # device memory, 1e9 bytes (datasheet); None: not given, not checked
    compute_capability: tuple[int, int] | None = None  # CUDA (major, minor), e.g. (9, 0); None: not given
    sources: tuple[tuple[str, str], ...] = ()
    calibrated: Calibration = Calibration()
    path: str = dataclasses.field(default="", compare=False)
    text: str = dataclasses.field(default="", compare=False, repr=False)  # the YAML it was parsed from

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gb_s * 1e9

    @property
    def memory_mib(self) -> float | None:
        """The device memory in MiB (2**20 bytes, the unit of the memory objectives); None when
        the profile gives no ``memory_gb``."""
        return None if self.memory_gb is None else self.memory_gb * 1e9 / 2**20

    def over_memory(self, mb: float) -> str | None:
        """``more than h200's 141 GB (134,468 MiB)`` when ``mb`` MiB (2**20 bytes, the unit of the
        memory objectives) exceed this GPU's memory: a model that needs it cannot run on one such
        GPU. None when it fits, or the profile gives no ``memory_gb``."""
        capacity = self.memory_mib
        if capacity is None or not mb > capacity:
            return None
        return f"more than {self.name}'s {self.memory_gb:g} GB ({capacity:,.0f} MiB)"

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype`` (one of ``DTYPES``)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)}")
        return getattr(self.peak_tflops, dtype) * 1e12

    def lists(self, device_name: str) -> bool:
        """Whether ``device_name`` (as ``torch.cuda.get_device_name()`` gives it) is this GPU;
        case and spacing ignored."""
        return _normalize(device_name) in {_normalize(n) for n in self.device_names}

    def source(self, field: str) -> str | None:
        """The datasheet / whitepaper note for ``field``, if the file gave one."""
        return dict(self.sources).get(field)


_REQUIRED = (
    "name",
    "device_names",
    "sm_count",
    "l2_bytes",
    "smem_per_sm_bytes",
    "memory_bandwidth_gb_s",
    "peak_tflops",
    "launch_overhead_us",
)
_OPTIONAL = ("description", "memory_gb", "compute_capability", "source", "calibrated")
_NUMBERS = (
    "sm_count",
    "l2_bytes",
    "smem_per_sm_bytes",
    "memory_bandwidth_gb_s",
    "peak_tflops",
    "launch_overhead_us",
    "memory_gb",
    "compute_capability",
)  # the fields a `source:` note may describe
_PROVENANCE_KEYS = ("gpu", "driver", "torch", "triton", "kernels_fingerprint", "date")
_CALIBRATION_KEYS = (
    "bandwidth_fraction",
    "flops_fraction",
    "launch_overhead_us",
    "measured_with",
    *_PROVENANCE_KEYS,
    "sm_count",
    "interval",
    "check",
    "kernel_model",
    "decode_model",
)
_KERNEL_MODEL_KEYS = ("coefficients", "gap_us", "plain_gap_us", "intercept_us", "per_ktoken_us")
# the decode-step cost model (nas.latency._decode): µs per launch and per MiB of each byte class,
# its interval, the decode kernels it was fitted on and where
_DECODE_MODEL_KEYS = ("coefficients", "interval", "kernels_fingerprint", "date", "gpu", "rows", "check")
# coefficients a decode model may hold: nas.latency._decode's DECODE_FEATURES (launch, weights, KV
# cache per head dim, state, unaligned launches and weights), ALIGNED_DECODE_FEATURES (the same
# without the unaligned rows) or LEGACY_DECODE_FEATURES (one KV cost), as profiles had them
_DECODE_MODEL_LENGTHS = (9, 7, 4)
# the features of each kernel family, in coefficient order, as a calibration's kernel_model holds them:
# the one table of them (nas.latency._launches computes each and says what it is). A kernel class is
# ``family[.variant...]`` (``linear.tma``, ``attention.sdpa.D64``) and holds one coefficient per feature.
KERNEL_FEATURES: dict[str, tuple[str, ...]] = {
    "linear": (
        "launch",
        "waves",
        "k_steps",
        "gelu",
        "relu_silu",
        "residual",
        "mbytes",
        "k_steps_k16",
        "k_steps_k8",
        "out_n8",
        "mbytes_k64",
    ),
    "attention": ("launch", "waves", "key_blocks", "critical_blocks", "mbytes"),
    "linear_attention": ("launch", "waves", "chunks_identity", "chunks_elu", "chunks_relu", "prefix", "mbytes"),
    "norm": ("launch", "waves", "mbytes"),
    "conv": ("launch", "waves", "taps", "mbytes"),
    "embed": ("launch", "mbytes"),
}
# per family, how many of its last features a calibration written before them may lack (read as 0): the
# linear's misaligned read (1), and with it the three alignment features added before it (4)
KERNEL_FEATURES_ADDED: dict[str, tuple[int, ...]] = {"linear": (1, 4)}
# mappings inside calibrated.check: summaries keyed by shape ("8x1024") or "all"
_CHECK_SECTIONS = ("cross_validation", "check_set")


def _finite(value: Any) -> bool:
    """A number (not a bool) that is neither NaN nor infinite (an int too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _coefficients(where: str, field: str, value: Any) -> list[float]:
    """A list of finite, non-negative numbers (µs per feature unit)."""
    if not isinstance(value, list) or not all(_finite(c) and c >= 0 for c in value):
        raise ProfileError(f"{where}: field {field!r} must be a list of finite non-negative numbers, got {value!r}")
    return value


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: mapping keys as text (YAML reads ``1024:`` as an int, and
    sorting mixed keys fails), dates as ISO text (YAML reads an unquoted ``2026-12-03`` as a date)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _json(where: str, field: str, value: Any) -> str:
    """Canonical JSON text of a nested section (kept as text so the profile stays hashable)."""
    try:
        return json.dumps(_plain(value), sort_keys=True)
    except (TypeError, ValueError, RecursionError) as err:  # RecursionError: a YAML alias inside itself
        raise ProfileError(f"{where}: field {field!r} holds a value JSON cannot store ({err})") from None


# Upper bounds on a profile's datasheet numbers: far above any GPU made (an H200: 132 SMs, 50 MiB of
# L2, 228 KiB of shared memory per SM, 4.8 TB/s, 989.5 dense bf16 TFLOP/s, launches of a few µs,
# 141 GB of memory) and
# far below what would make the roofline's arithmetic meaningless; a value past one is a typo (a
# unit slip: bytes for GB/s, FLOP/s for TFLOP/s) and is refused, not predicted from.
LIMITS: dict[str, float] = {
    "sm_count": 4096,
    "l2_bytes": 2**34,
    "smem_per_sm_bytes": 2**24,
    "memory_bandwidth_gb_s": 1e6,
    "peak_tflops": 1e6,
    "launch_overhead_us": 1e4,
    "memory_gb": 1e5,  # an H200: 141 GB; bytes written where GB goes are 1.41e11
}


def _positive(where: str, field: str, value: Any, *, integer: bool = False) -> float:
    """``value`` as a positive number, at most the field's ``LIMITS`` entry. YAML 1.1 reads
    ``2e-6`` as a string, so numeric strings are accepted too; booleans are not numbers here."""
    kind = "a positive integer" if integer else "a positive number"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ProfileError(f"{where}: field {field!r} must be {kind}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ProfileError(f"{where}: field {field!r} must be {kind}, got {value!r}")
    if not _finite(value):  # .inf, 1e400, or an integer beyond any float
        raise ProfileError(f"{where}: field {field!r} must be {kind} and finite, got {value!r}")
    limit = LIMITS.get(field.split(".", 1)[0])
    if limit is not None and value > limit:
        raise ProfileError(f"{where}: field {field!r} is {value!r}, above any GPU (at most {limit:g}); check its unit")
    if integer:
        if float(value) != int(value):
            raise ProfileError(f"{where}: field {field!r} must be {kind}, got {value!r}")
        return int(value)
    return float(value)


def _non_negative(where: str, field: str, value: Any) -> float:
    """``value`` as a finite number >= 0 (numeric strings accepted, as in ``_positive``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if not _finite(value) or value < 0:
        raise ProfileError(f"{where}: field {field!r} must be a finite number >= 0, got {value!r}")
    return float(value)


def _fraction(where: str, field: str, value: Any) -> float:
    number = _positive(where, field, value)
    if number > 1:
        raise ProfileError(f"{where}: field {field!r} must be a fraction in (0, 1], got {value!r}")
    return number


def _mapping(where: str, field: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(
            f"{where}: field {field!r} must be a mapping with keys from {list(allowed)}, got {type(value).__name__}"
        )
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ProfileError(f"{where}: field {field!r} has unknown key {unknown[0]!r}; allowed: {list(allowed)}")
    return value


def _fingerprint_text(where: str, field: str, value: Any) -> None:
    """ProfileError for a kernels fingerprint YAML read as a number.

    A fingerprint is 12 hex digits. Written unquoted, one of only decimal digits is read as an int,
    and as an octal one when it starts with 0 and has no 8 or 9: its text (the leading zeros, the
    digits themselves) cannot be recovered, and a wrong one would compare unequal to the kernels'
    and double the interval for no reason.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        raise ProfileError(
            f"{where}: field {field!r} was read as the number {value}: quote it (kernels_fingerprint: "
            f"'0123...'), since YAML drops the leading zeros of an unquoted all-digit value"
        )


def _calibration(where: str, raw: Any) -> Calibration:
    if raw is None:
        return Calibration()
    data = _mapping(where, "calibrated", raw, _CALIBRATION_KEYS)
    bandwidth = data.get("bandwidth_fraction")
    overhead = data.get("launch_overhead_us")
    flops = _mapping(where, "calibrated.flops_fraction", data.get("flops_fraction") or {}, DTYPES)
    measured_with = data.get("measured_with")
    model = data.get("kernel_model")
    if model is not None:
        model = _mapping(where, "calibrated.kernel_model", model, _KERNEL_MODEL_KEYS)
        coefficients = model.get("coefficients") or {}
        if not isinstance(coefficients, dict):
            raise ProfileError(
                f"{where}: field 'calibrated.kernel_model.coefficients' must be a mapping (kernel class -> "
                f"list of numbers), got {type(coefficients).__name__}"
            )
        for cls, coef in coefficients.items():
            field = f"calibrated.kernel_model.coefficients.{cls}"
            features = KERNEL_FEATURES.get(str(cls).split(".")[0])
            if features is None:
                raise ProfileError(
                    f"{where}: field {field!r} names no kernel family; a class is one of "
                    f"{list(KERNEL_FEATURES)}, optionally with a '.variant'"
                )
            _coefficients(where, field, coef)
            family = str(cls).split(".")[0]
            if len(features) - len(coef) not in (0, *KERNEL_FEATURES_ADDED.get(family, ())):
                raise ProfileError(
                    f"{where}: field {field!r} must hold {len(features)} numbers ({', '.join(features)}), "
                    f"got {len(coef)}"
                )
        for key in ("gap_us", "plain_gap_us", "intercept_us", "per_ktoken_us"):
            if key in model:
                _non_negative(where, f"calibrated.kernel_model.{key}", model[key])
    decode = data.get("decode_model")
    if decode is not None:
        decode = _mapping(where, "calibrated.decode_model", decode, _DECODE_MODEL_KEYS)
        coef = _coefficients(where, "calibrated.decode_model.coefficients", decode.get("coefficients"))
        if len(coef) not in _DECODE_MODEL_LENGTHS:
            raise ProfileError(
                f"{where}: field 'calibrated.decode_model.coefficients' must hold 9 numbers (launch, weights, "
                f"KV cache at head dim 16/32/64/128, state, unaligned launches and weights), 7 (without the "
                f"unaligned ones) or 4 (one KV cost), got {len(coef)}"
            )
        _positive(where, "calibrated.decode_model.interval", decode.get("interval"))
        if "check" in decode and not isinstance(decode["check"], dict):
            raise ProfileError(
                f"{where}: field 'calibrated.decode_model.check' must be a mapping (context -> summary), "
                f"got {type(decode['check']).__name__}"
            )
        for key in ("kernels_fingerprint", "date", "gpu"):  # compared and printed as text
            if key in decode:
                if isinstance(decode[key], dict | list) or decode[key] is None:
                    raise ProfileError(
                        f"{where}: field 'calibrated.decode_model.{key}' must be text, got {decode[key]!r}"
                    )
                if key == "kernels_fingerprint":
                    _fingerprint_text(where, "calibrated.decode_model.kernels_fingerprint", decode[key])
                decode = {**decode, key: str(decode[key])}
    check = data.get("check")
    if check is not None and not isinstance(check, dict):
        raise ProfileError(f"{where}: field 'calibrated.check' must be a mapping, got {type(check).__name__}")
    for section in _CHECK_SECTIONS:
        part = (check or {}).get(section, {})
        if not isinstance(part, dict):
            raise ProfileError(
                f"{where}: field 'calibrated.check.{section}' must be a mapping (shape -> summary), "
                f"got {type(part).__name__}"
            )
    sm_count = data.get("sm_count")
    interval = data.get("interval")
    _fingerprint_text(where, "calibrated.kernels_fingerprint", data.get("kernels_fingerprint"))
    return Calibration(
        bandwidth_fraction=None if bandwidth is None else _fraction(where, "calibrated.bandwidth_fraction", bandwidth),
        flops_fractions=tuple(
            (dtype, _fraction(where, f"calibrated.flops_fraction.{dtype}", flops[dtype]))
            for dtype in DTYPES
            if dtype in flops
        ),
        launch_overhead_us=None if overhead is None else _positive(where, "calibrated.launch_overhead_us", overhead),
        measured_with=None if measured_with is None else str(measured_with),
        provenance=tuple((k, str(data[k])) for k in _PROVENANCE_KEYS if data.get(k) is not None),
        sm_count=None if sm_count is None else _positive(where, "calibrated.sm_count", sm_count, integer=True),
        interval=None if interval is None else _positive(where, "calibrated.interval", interval),
        check_json=None if check is None else _json(where, "calibrated.check", check),
        kernel_model_json=None if model is None else _json(where, "calibrated.kernel_model", model),
        decode_model_json=None if decode is None else _json(where, "calibrated.decode_model", decode),
    )


def _parse(where: str, data: Any) -> HardwareProfile:
    """Validate the YAML document of one profile; ``where`` names the file in errors."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping of profile fields, got {type(data).__name__}")
    for key in data:
        if key not in _REQUIRED + _OPTIONAL:
            raise ProfileError(f"{where}: unknown field {key!r}; allowed: {list(_REQUIRED + _OPTIONAL)}")
    for key in _REQUIRED:
        if key not in data:
            raise ProfileError(f"{where}: missing field {key!r}; required: {list(_REQUIRED)}")
    if not isinstance(data["name"], str) or not data["name"].strip():
        raise ProfileError(f"{where}: field 'name' must be a non-empty string, got {data['name']!r}")
    names = data["device_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise ProfileError(
            f"{where}: field 'device_names' must be a list of GPU name strings "
            f"as torch.cuda.get_device_name() returns them, got {names!r}"
        )
    peaks = _mapping(where, "peak_tflops", data["peak_tflops"], DTYPES)
    for dtype in DTYPES:
        if dtype not in peaks:
            raise ProfileError(f"{where}: field 'peak_tflops' is missing dtype {dtype!r}; required: {list(DTYPES)}")
    sources = _mapping(where, "source", data.get("source") or {}, _NUMBERS)
    profile = HardwareProfile(
        name=data["name"].strip(),
        description=str(data.get("description") or ""),
        device_names=tuple(n.strip() for n in names),
        sm_count=_positive(where, "sm_count", data["sm_count"], integer=True),
        l2_bytes=_positive(where, "l2_bytes", data["l2_bytes"], integer=True),
        smem_per_sm_bytes=_positive(where, "smem_per_sm_bytes", data["smem_per_sm_bytes"], integer=True),
        memory_bandwidth_gb_s=_positive(where, "memory_bandwidth_gb_s", data["memory_bandwidth_gb_s"]),
        peak_tflops=PeakTflops(**{d: _positive(where, f"peak_tflops.{d}", peaks[d]) for d in DTYPES}),
        launch_overhead_us=_positive(where, "launch_overhead_us", data["launch_overhead_us"]),
        memory_gb=None if data.get("memory_gb") is None else _positive(where, "memory_gb", data["memory_gb"]),
        compute_capability=_capability(where, data.get("compute_capability")),
        sources=tuple((k, str(v)) for k, v in sources.items()),
        calibrated=_calibration(where, data.get("calibrated")),
        path=where,
    )
    _check_measured_here(where, profile.device_names, profile.sm_count, profile.calibrated)
    return profile


def _capability(where: str, value: Any) -> tuple[int, int] | None:
    """``compute_capability``: ``[major, minor]`` (``[9, 0]`` for an H100), or absent."""
    if value is None:
        return None
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 1 <= value[0] <= 99 or not 0 <= value[1] <= 9:
        raise ProfileError(
            f"{where}: field 'compute_capability' must be [major, minor] as torch.cuda.get_device_capability() "
            f"gives it, e.g. [9, 0], got {value!r}"
        )
    return (value[0], value[1])


def _check_measured_here(where: str, names: tuple[str, ...], sm_count: int, calibrated: Calibration) -> None:
    """ProfileError when the ``calibrated:`` section was measured on a GPU this profile does not
    describe (a copy of a shipped profile edited for another GPU): the predictor would use it as
    this GPU's own calibration, with its interval, and predict the other GPU's latency.
    ``nas profiles calibrate`` only runs on a GPU the profile lists, so its own sections pass."""
    listed = {_normalize(n) for n in names}
    measured = [("calibrated.gpu", calibrated.get("gpu"))]
    if calibrated.decode_model is not None:
        measured.append(("calibrated.decode_model.gpu", calibrated.decode_model.get("gpu")))
    fix = (
        "it describes another GPU: delete the calibrated: section (predictions are then transferred from "
        "the shipped calibration, with a wider interval), or run `nas profiles calibrate` on this GPU"
    )
    for field, gpu in measured:
        if gpu is not None and _normalize(str(gpu)) not in listed:
            raise ProfileError(
                f"{where}: field {field!r} says the calibration was measured on {gpu!r}, which device_names "
                f"{list(names)} does not list; {fix}"
            )
    if calibrated.sm_count is not None and calibrated.sm_count != sm_count:
        raise ProfileError(
            f"{where}: field 'calibrated.sm_count' is {calibrated.sm_count}, the GPU it was measured on, not "
            f"sm_count {sm_count}; {fix}"
        )


def _shipped() -> dict[str, Traversable]:
    """Shipped profile name -> YAML file (package data next to this module)."""
    root = resources.files(__name__)
    return {e.name.removesuffix(".yaml"): e for e in root.iterdir() if e.name.endswith(".yaml")}


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(_shipped())


def parse_profile(text: str, where: str) -> HardwareProfile:
    """A profile from its YAML ``text``; ``where`` (a path, or what recorded the text) names it in
    errors. ``ProfileError`` for YAML that does not parse, a key given twice, or a field that is
    wrong (see ``load_profile``)."""
    try:
        data = load_unique(text)
    except DuplicateKey as dup:
        raise ProfileError(
            f"{where}: field {dup.key!r} is given twice (lines {dup.first} and {dup.second}); keep one"
        ) from None
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ProfileError(f"{where}: not valid YAML: {detail}") from None
    return dataclasses.replace(_parse(where, data), text=text)


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A shipped profile by name (``"h200"``) or a user's YAML file by path.

    Raises ``ProfileError`` (a ``ValueError``) naming the file, field and allowed values.
    """
    text = os.fspath(name_or_path)
    shipped = _shipped()
    path: Traversable
    if text in shipped:
        path = shipped[text]
    elif text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise ProfileError(f"{text}: profile file not found")
    else:
        raise ProfileError(
            f"unknown hardware profile {text!r}; available: {list_profiles()} (or the path of a .yaml file)"
        )
    try:
        text = read_text(path, "a hardware profile")
    except YamlFileError as e:
        raise ProfileError(f"{path}: {e}") from None
    return parse_profile(text, str(path))


def _normalize(device_name: str) -> str:
    return " ".join(device_name.split()).casefold()


def detect_profile(device_name: str | None = None) -> HardwareProfile | None:
    """The shipped profile whose ``device_names`` lists ``device_name`` (case and spacing
    ignored); with ``None``, the name of the current CUDA device. ``None`` on a CPU-only
    machine or for a GPU no profile lists."""
    if device_name is None:
        import torch  # only needed to ask the driver; profiles themselves are plain data

        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    wanted = _normalize(device_name)
    for name in list_profiles():
        profile = load_profile(name)
        if any(_normalize(n) == wanted for n in profile.device_names):
            return profile
    return None
