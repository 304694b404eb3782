"""Shipped profiles load and carry sources; bad files fail with one clear line; detection."""

from __future__ import annotations

import dataclasses
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
NUMBERS = ("sm_count", "l2_bytes", "smem_per_sm_bytes", "memory_bandwidth_gb_s", "peak_tflops", "launch_overhead_us")


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
        assert cal.measured_with and profile.name in ("h200",)
        assert all(0 < f <= 1 for f in (cal.bandwidth_fraction or 1, *(v for _, v in cal.flops_fractions)))


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
]


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
