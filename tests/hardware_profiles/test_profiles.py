"""Shipped profiles load and carry sources; bad files fail with one clear line; detection."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hardware_profiles import (
    Calibration,
    ProfileError,
    detect_profile,
    list_profiles,
    load_profile,
)

SHIPPED = ("a100_80gb", "h100_sxm", "h200", "l4", "rtx4090")
NUMBERS = (
    "sm_count",
    "l2_bytes",
    "smem_per_sm_bytes",
    "memory_bandwidth_gb_s",
    "peak_tflops",
    "launch_overhead_us",
    "memory_gb",
    "compute_capability",
)


def test_list_profiles_has_the_shipped_ones() -> None:
    assert set(SHIPPED) <= set(list_profiles())
    assert list_profiles() == sorted(list_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_and_validates(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.device_names and profile.description
    assert profile.sm_count > 0 and profile.l2_bytes > 0 and profile.smem_per_sm_bytes > 0
    assert profile.bandwidth_bytes_per_s == profile.memory_bandwidth_gb_s * 1e9 > 0
    # Tensor cores: bf16/fp16 twice tf32, tf32 at least the fp32 vector rate (dense figures).
    assert (
        profile.peak_flops("bf16")
        == profile.peak_flops("fp16")
        == pytest.approx(2 * profile.peak_flops("tf32"), rel=0.01)
    )
    assert profile.peak_flops("tf32") >= profile.peak_flops("fp32") > 0
    assert 0 < profile.launch_overhead_us < 50
    for field in NUMBERS:
        assert profile.source(field), f"{name}: no source note for {field}"
    assert "assumption" in profile.source("launch_overhead_us")
    if profile.calibrated != Calibration():  # filled only from a real GPU, and says which
        cal = profile.calibrated
        assert cal.measured_with and profile.name in ("h200", "h100_sxm")
        assert all(0 < f <= 1 for f in (cal.bandwidth_fraction or 1, *(v for _, v in cal.flops_fractions)))


# the datasheets' device memory, GB = 1e9 bytes
MEMORY_GB = {"a100_80gb": 80, "h100_sxm": 80, "h200": 141, "l4": 24, "rtx4090": 24}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_gives_its_device_memory_in_gb_and_mib(name: str) -> None:
    profile = load_profile(name)
    assert profile.memory_gb == MEMORY_GB[name]
    assert str(MEMORY_GB[name]) in profile.source("memory_gb")
    # the memory objectives are MiB (2**20 bytes): 141 GB is 134,468 MiB, not 141 * 1024
    assert profile.memory_mib == pytest.approx(MEMORY_GB[name] * 1e9 / 2**20)


def test_memory_gb_is_optional_and_read_from_a_numeric_string(tmp_path: Path) -> None:
    data = _h200()
    del data["memory_gb"]
    del data["source"]["memory_gb"]
    without = load_profile(_write(tmp_path, data))
    assert without.memory_gb is None and without.memory_mib is None
    assert without.source("memory_gb") is None
    assert load_profile(_write(tmp_path, _with(memory_gb="1.41e2"))).memory_gb == 141.0


# CUDA C++ Programming Guide, compute capabilities: A100 8.0, L4 and RTX 4090 8.9, H100 and H200 9.0
CAPABILITY = {"a100_80gb": (8, 0), "h100_sxm": (9, 0), "h200": (9, 0), "l4": (8, 9), "rtx4090": (8, 9)}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_gives_its_compute_capability(name: str) -> None:
    profile = load_profile(name)
    assert profile.compute_capability == CAPABILITY[name]
    assert "{}.{}".format(*CAPABILITY[name]) in profile.source("compute_capability")


@pytest.mark.parametrize("bad", [[9], [9, 0, 1], "9.0", [9.0, 0], [True, 0], [0, 0], [9, 10]])
def test_a_bad_compute_capability_is_one_line(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ProfileError, match=r"field 'compute_capability' must be \[major, minor\]"):
        load_profile(_write(tmp_path, _with(compute_capability=bad)))
    data = _h200()
    del data["compute_capability"]
    del data["source"]["compute_capability"]
    assert load_profile(_write(tmp_path, data)).compute_capability is None  # optional: nothing checked


def test_load_by_path_equals_load_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "mine.yaml"
    copy.write_text(Path(load_profile("l4").path).read_text())
    assert load_profile(copy) == load_profile("l4")
    assert load_profile(str(copy)).path == str(copy)


def test_unknown_dtype_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"'int8' is not one of \['fp32', 'tf32', 'bf16', 'fp16'\]"):
        load_profile("h200").peak_flops("int8")


def _h200() -> dict[str, Any]:
    return yaml.safe_load(Path(load_profile("h200").path).read_text())


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _without(key: str) -> dict[str, Any]:
    data = _h200()
    del data[key]
    return data


def _with(**changes: Any) -> dict[str, Any]:
    return _h200() | changes


BAD = [
    pytest.param(_without("sm_count"), r"missing field 'sm_count'", id="missing-field"),
    pytest.param(
        _with(memory_bandwidth_gb_s=-4800),
        r"'memory_bandwidth_gb_s' must be a positive number, got -4800",
        id="negative-bandwidth",
    ),
    pytest.param(
        _with(memory_bandwidth_gb_s="fast"), r"'memory_bandwidth_gb_s' must be a positive number", id="text-bandwidth"
    ),
    pytest.param(_with(sm_count=13.5), r"'sm_count' must be a positive integer", id="fractional-sms"),
    pytest.param(_with(sm_count=True), r"'sm_count' must be a positive integer", id="bool-sms"),
    pytest.param(_with(hbm_gb=141), r"unknown field 'hbm_gb'; allowed: \[", id="unknown-field"),
    pytest.param(
        _with(peak_tflops={"fp32": 67, "tf32": 494.5, "bf16": 989.5}),
        r"'peak_tflops' is missing dtype 'fp16'; required: \['fp32', 'tf32', 'bf16', 'fp16'\]",
        id="missing-dtype",
    ),
    pytest.param(
        _with(peak_tflops={"fp32": 67, "tf32": 1, "bf16": 1, "fp16": 1, "fp8": 2}),
        r"'peak_tflops' has unknown key 'fp8'; allowed: \['fp32'",
        id="unknown-dtype",
    ),
    pytest.param(_with(device_names="NVIDIA H200"), r"'device_names' must be a list", id="device-names-str"),
    pytest.param(
        _with(calibrated={"bandwidth_fraction": 1.5}),
        r"'calibrated.bandwidth_fraction' must be a fraction in \(0, 1\], got 1.5",
        id="fraction-over-1",
    ),
    pytest.param(
        _with(calibrated={"flops": 0.5}), r"'calibrated' has unknown key 'flops'; allowed: \[", id="unknown-calibration"
    ),
    pytest.param(_with(source={"sms": "x"}), r"'source' has unknown key 'sms'", id="unknown-source"),
    pytest.param(["h200"], r"expected a mapping of profile fields, got list", id="not-a-mapping"),
    pytest.param(
        _with(memory_bandwidth_gb_s=4.8e12),  # bytes/s written where GB/s goes
        r"'memory_bandwidth_gb_s' is 4800000000000.0, above any GPU \(at most 1e\+06\); check its unit",
        id="bandwidth-in-bytes",
    ),
    pytest.param(
        _with(peak_tflops={"fp32": 67, "tf32": 494.5, "bf16": 9.895e14, "fp16": 989.5}),
        r"'peak_tflops.bf16' is 989500000000000.0, above any GPU",
        id="flops-not-tflops",
    ),
    pytest.param(_with(sm_count=100000), r"'sm_count' is 100000, above any GPU \(at most 4096\)", id="absurd-sms"),
    pytest.param(
        _with(launch_overhead_us=2e6), r"'launch_overhead_us' is 2000000.0, above any GPU", id="absurd-launch"
    ),
    pytest.param(_with(memory_gb=-141), r"'memory_gb' must be a positive number, got -141", id="negative-memory"),
    pytest.param(_with(memory_gb=0), r"'memory_gb' must be a positive number, got 0", id="zero-memory"),
    pytest.param(_with(memory_gb="lots"), r"'memory_gb' must be a positive number, got 'lots'", id="text-memory"),
    pytest.param(_with(memory_gb=True), r"'memory_gb' must be a positive number, got True", id="bool-memory"),
    pytest.param(
        _with(memory_gb=1.41e11),  # bytes written where GB goes
        r"'memory_gb' is 141000000000.0, above any GPU \(at most 100000\); check its unit",
        id="memory-in-bytes",
    ),
]


def test_every_shipped_profile_is_within_the_limits() -> None:
    """The bounds sit far above every shipped GPU's numbers (at least 8x), so no real GPU trips them."""
    from hardware_profiles import LIMITS

    for name in list_profiles():
        p = load_profile(name)
        values = {
            "sm_count": p.sm_count,
            "l2_bytes": p.l2_bytes,
            "smem_per_sm_bytes": p.smem_per_sm_bytes,
            "memory_bandwidth_gb_s": p.memory_bandwidth_gb_s,
            "peak_tflops": max(p.peak_tflops.fp32, p.peak_tflops.tf32, p.peak_tflops.bf16, p.peak_tflops.fp16),
            "launch_overhead_us": p.launch_overhead_us,
            "memory_gb": p.memory_gb,
        }
        assert set(values) == set(LIMITS)
        for field, value in values.items():
            assert 8 * value <= LIMITS[field], (name, field, value)


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_profile_raises_one_line_naming_file_and_field(tmp_path: Path, data: Any, message: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    text = str(info.value)
    assert str(path) in text and "\n" not in text
    assert isinstance(info.value, ValueError)


def test_invalid_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: h200\npeak_tflops: [1, 2\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: not valid YAML: ") as info:
        load_profile(path)
    assert "\n" not in str(info.value)


def test_unknown_name_lists_available_profiles() -> None:
    with pytest.raises(ProfileError, match=r"unknown hardware profile 'h300'; available: \[.*'h200'.*'l4'"):
        load_profile("h300")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nope.yaml: profile file not found"):
        load_profile(tmp_path / "nope.yaml")


def test_calibrated_section_is_read(tmp_path: Path) -> None:
    calibrated = {
        "bandwidth_fraction": 0.85,
        "flops_fraction": {"bf16": 0.7, "fp32": "8.5e-1"},
        "launch_overhead_us": 3,
        "measured_with": "NVIDIA H200, torch 2.13",
    }
    profile = load_profile(_write(tmp_path, _with(calibrated=calibrated)))
    assert profile.calibrated.bandwidth_fraction == 0.85
    assert profile.calibrated.flops_fraction("bf16") == 0.7
    assert profile.calibrated.flops_fraction("fp32") == 0.85  # YAML 1.1 reads 8.5e-1 as text
    assert profile.calibrated.flops_fraction("fp16") is None
    assert profile.calibrated.launch_overhead_us == 3.0
    assert profile.calibrated.measured_with == "NVIDIA H200, torch 2.13"


def test_profile_is_frozen_and_hashable() -> None:
    profile = load_profile("h200")
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.sm_count = 1  # type: ignore[misc]
    assert hash(profile) == hash(load_profile("h200"))


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100_80gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("  nvidia   h200 ", "h200"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA H100 PCIe", None),
        ("Tesla T4", None),
        ("", None),
    ],
    ids=lambda v: repr(v),
)
def test_detect_profile_by_device_name(device_name: str, expected: str | None) -> None:
    profile = detect_profile(device_name)
    assert (profile.name if profile else None) == expected


def test_detect_profile_without_cuda_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect_profile() is None


def test_detect_profile_asks_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert detect_profile().name == "h200"


def _calibrated(*path: str, value: Any) -> dict[str, Any]:
    """The H200 profile with ``calibrated.<path>`` set to ``value``."""
    data = _h200()
    node = data["calibrated"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


MALFORMED = [
    pytest.param(
        _calibrated("kernel_model", "coefficients", "embed", value=[1.81162]),
        r"'calibrated.kernel_model.coefficients.embed' must hold 2 numbers \(launch, mbytes\), got 1",
        id="coefficients-short",
    ),
    pytest.param(
        _calibrated("kernel_model", "coefficients", "norm.rmsnorm", value=[1.0, 0.0, 0.1, 0.2]),
        r"'calibrated.kernel_model.coefficients.norm.rmsnorm' must hold 3 numbers",
        id="coefficients-long",
    ),
    pytest.param(
        _calibrated("kernel_model", "coefficients", "mamba.D64", value=[1.0]),
        r"'calibrated.kernel_model.coefficients.mamba.D64' names no kernel family",
        id="coefficients-unknown-family",
    ),
    pytest.param(
        _calibrated("kernel_model", "coefficients", "conv", value=[1.0, float("inf"), 0.0, 0.0]),
        r"'calibrated.kernel_model.coefficients.conv' must be a list of finite non-negative numbers, got \[1.0, inf",
        id="coefficients-inf",
    ),
    pytest.param(
        _calibrated("kernel_model", "coefficients", "conv", value="fast"),
        r"'calibrated.kernel_model.coefficients.conv' must be a list of finite",
        id="coefficients-text",
    ),
    pytest.param(
        _calibrated("kernel_model", "coefficients", value=[1.0, 2.0]),
        r"'calibrated.kernel_model.coefficients' must be a mapping",
        id="coefficients-list",
    ),
    pytest.param(
        _calibrated("kernel_model", "gap_us", value="abc"),
        r"'calibrated.kernel_model.gap_us' must be a finite number >= 0, got 'abc'",
        id="gap-text",
    ),
    pytest.param(
        _calibrated("kernel_model", "intercept_us", value=-1.0),
        r"'calibrated.kernel_model.intercept_us' must be a finite number >= 0, got -1.0",
        id="intercept-negative",
    ),
    pytest.param(
        _calibrated("kernel_model", "per_ktoken_us", value=float("nan")),
        r"'calibrated.kernel_model.per_ktoken_us' must be a finite number >= 0, got nan",
        id="per-ktoken-nan",
    ),
    pytest.param(
        _calibrated("decode_model", "coefficients", value=[1.0, 0.7, float("inf"), 0.4]),
        r"'calibrated.decode_model.coefficients' must be a list of finite non-negative numbers",
        id="decode-inf",
    ),
    pytest.param(
        _calibrated("decode_model", "coefficients", value=[1.0, 0.7]),
        r"'calibrated.decode_model.coefficients' must hold 9 numbers .* got 2",
        id="decode-short",
    ),
    pytest.param(
        _calibrated("decode_model", "check", value=[1024, 4096]),
        r"'calibrated.decode_model.check' must be a mapping \(context -> summary\), got list",
        id="decode-check-list",
    ),
    pytest.param(
        _calibrated("decode_model", "kernels_fingerprint", value=["f8a7"]),
        r"'calibrated.decode_model.kernels_fingerprint' must be text",
        id="decode-fingerprint-list",
    ),
    pytest.param(
        _calibrated("kernels_fingerprint", value=123456789012),
        r"'calibrated.kernels_fingerprint' was read as the number 123456789012: quote it",
        id="fingerprint-number",
    ),
    pytest.param(
        _calibrated("decode_model", "kernels_fingerprint", value=0o1234567),
        r"'calibrated.decode_model.kernels_fingerprint' was read as the number 342391: quote it",
        id="decode-fingerprint-octal",
    ),
    pytest.param(
        _calibrated("check", "cross_validation", value=None),
        r"'calibrated.check.cross_validation' must be a mapping \(shape -> summary\), got NoneType",
        id="check-section-null",
    ),
    pytest.param(
        _calibrated("interval", value=float("inf")),
        r"'calibrated.interval' must be a positive number and finite, got inf",
        id="interval-inf",
    ),
    pytest.param(
        _with(launch_overhead_us=float("inf")),
        r"'launch_overhead_us' must be a positive number and finite, got inf",
        id="launch-inf",
    ),
    pytest.param(
        _with(memory_bandwidth_gb_s="1e400"),
        r"'memory_bandwidth_gb_s' must be a positive number and finite, got inf",
        id="bandwidth-overflow-text",
    ),
    pytest.param(
        _with(l2_bytes=10**400),
        r"'l2_bytes' must be a positive integer and finite",
        id="l2-beyond-float",
    ),
    pytest.param(
        _with(peak_tflops={"fp32": 67, "tf32": 494.5, "bf16": float("inf"), "fp16": 989.5}),
        r"'peak_tflops.bf16' must be a positive number and finite, got inf",
        id="peak-inf",
    ),
]


@pytest.mark.parametrize(("data", "message"), MALFORMED)
def test_malformed_values_are_one_profile_error_at_load(tmp_path: Path, data: Any, message: str) -> None:
    """Every value the latency model reads is checked when the profile loads (the search loads
    its --target before opening the study; ``nas profiles show`` loads it too): a list of the
    wrong length, a wrong type or a non-finite number is one ProfileError naming the file and
    the field, never a ValueError from the predictor in the middle of a trial."""
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_kernel_families_match_the_latency_model() -> None:
    """The latency model computes a value for every feature the profile format lists, per family
    (one launch of each family has as many features as the table names), and the decode model's
    lengths agree with nas.latency's own (hardware_profiles never imports nas)."""
    import hardware_profiles
    from nas.latency._decode import ALIGNED_DECODE_FEATURES, DECODE_FEATURES, LEGACY_DECODE_FEATURES
    from nas.latency._launches import FEATURES, KINDS, family
    from nas.latency.calibrate import kernel_grid

    assert FEATURES is hardware_profiles.KERNEL_FEATURES
    widths = {family(c.launch(132).cls): len(c.launch(132).x) for c in kernel_grid()}
    assert widths == {fam: len(names) for fam, names in FEATURES.items()}
    assert {name for names in FEATURES.values() for name in names} == set(KINDS)
    assert hardware_profiles._DECODE_MODEL_LENGTHS == (
        len(DECODE_FEATURES),
        len(ALIGNED_DECODE_FEATURES),
        len(LEGACY_DECODE_FEATURES),
    )


def test_hand_written_dates_and_numeric_keys_load_and_predict(tmp_path: Path) -> None:
    """YAML reads an unquoted 2026-12-03 as a date and ``1024:`` as an int; both are kept as text
    (json.dumps could store neither, or sort them beside text keys), and predictions run."""
    from nas.latency import predict_decode
    from nas.spec import ArchSpec, LayerSpec

    text = Path(load_profile("h200").path).read_text().replace("date: '2026-12-03'", "date: 2026-12-03")
    text = text.replace("'1024': {n: 36", "1024: {n: 36")
    assert "date: 2026-12-03" in text and "\n      1024: {n: 36" in text
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    profile = load_profile(path)
    assert (
        profile.calibrated.decode_model["date"] == "2026-12-03" and "1024" in profile.calibrated.decode_model["check"]
    )
    arch = ArchSpec(vocab_size=64, d_model=64, layers=(LayerSpec(mixer="attention", heads=2),), n_out=64)
    assert predict_decode(arch, 1, 1024, profile).median_ms > 0


def _h200_copy_for(tmp_path: Path, edit: dict[str, Any]) -> Path:
    """The shipped h200.yaml as a user copies it, with top-level fields edited (text kept)."""
    text = (Path(load_profile("h200").path)).read_text()
    for key, value in edit.items():
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
        lines[at] = f"{key}: {json.dumps(value)}"  # JSON is YAML
        text = "\n".join(lines) + "\n"
    path = tmp_path / "my_gpu.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # the audit's copy: another GPU's name and SMs, the H200's calibration left in place, which
        # predicted the H200's latency for it, labelled "rtx6000ada, calibrated, ±13 %"
        (
            {"name": "rtx6000ada", "device_names": ["NVIDIA RTX 6000 Ada Generation"], "sm_count": 142},
            r"'calibrated.gpu' says the calibration was measured on 'NVIDIA H200', which device_names "
            r"\['NVIDIA RTX 6000 Ada Generation'\] does not list; it describes another GPU: delete the calibrated:",
        ),
        ({"sm_count": 114}, r"'calibrated.sm_count' is 132, the GPU it was measured on, not sm_count 114"),
    ],
    ids=["another-gpu", "another-sm-count"],
)
def test_a_calibration_measured_on_another_gpu_is_refused(tmp_path: Path, edit: dict, message: str) -> None:
    path = _h200_copy_for(tmp_path, edit)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    data = yaml.safe_load(path.read_text())
    del data["calibrated"]  # what the message says to do: then it loads, uncalibrated
    assert load_profile(_write(tmp_path, data)).calibrated == Calibration()


def test_a_decode_calibration_from_another_gpu_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(load_profile("h200").path).read_text())
    data["device_names"] = ["NVIDIA H200", "NVIDIA H200 NVL"]  # listing more GPUs is fine
    assert load_profile(_write(tmp_path, data)).lists("nvidia  h200 nvl")
    data["calibrated"]["decode_model"]["gpu"] = "NVIDIA H100 80GB HBM3"
    with pytest.raises(ProfileError, match=r"'calibrated.decode_model.gpu' says .* 'NVIDIA H100 80GB HBM3'"):
        load_profile(_write(tmp_path, data))


def test_a_profile_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    text = Path(load_profile("l4").path).read_text().replace("description: ", "description: générique ", 1)
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ProfileError, match=r"latin1.yaml: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_profile(path)


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """PyYAML keeps the last one: the second bandwidth silently replaced the first."""
    path = tmp_path / "dup.yaml"
    text = Path(load_profile("l4").path).read_text()
    path.write_text(text + "memory_bandwidth_gb_s: 3000\n")
    line = 1 + next(i for i, s in enumerate(text.splitlines()) if s.startswith("memory_bandwidth_gb_s:"))
    said = rf"dup.yaml: field 'memory_bandwidth_gb_s' is given twice \(lines {line} and"
    with pytest.raises(ProfileError, match=said):
        load_profile(path)


def test_aliases_expanding_past_the_limit_are_refused_before_anything_is_built(tmp_path: Path) -> None:
    """A "billion laughs" under a field: nine levels of an anchor listing the previous one nine
    times is 9^8 values once expanded. The loader counts them on the parsed nodes, without
    expanding, and refuses the file in one line."""
    path = tmp_path / "laughs.yaml"
    levels = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = Path(load_profile("l4").path).read_text()
    path.write_text(text + "laughs:\n" + "".join(f"  {x}\n" for x in levels))
    with pytest.raises(
        ProfileError, match=r"laughs.yaml: not valid YAML: its aliases expand to more than 100,000 values"
    ):
        load_profile(path)
