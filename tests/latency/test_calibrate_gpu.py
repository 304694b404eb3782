"""Calibration on a real GPU: a small kernel grid and a few forwards, fitted, written, read back."""

from __future__ import annotations

import pytest
import torch

from hardware_profiles import detect_profile, load_profile
from nas.latency import predict
from nas.latency.calibrate import (
    SHAPES,
    CalibrationError,
    calibration_section,
    environment,
    fit,
    kernel_grid,
    measure_models,
    random_archs,
    require_gpu,
    time_kernels,
    write_calibration,
)
from tests.kernels._support import requires_cuda


@pytest.mark.gpu
@requires_cuda
def test_calibrate_small_grid_round_trip(tmp_path):
    profile = detect_profile()
    if profile is None:
        pytest.skip(f"no shipped profile lists {torch.cuda.get_device_name()}")
    sms = require_gpu(profile)
    first = {}
    for case in kernel_grid():  # the first case of every kernel class, and a few more linears
        first.setdefault(case.launch(132).cls, case)
    cases = [*first.values(), *kernel_grid()[:12]]
    kernel_rows = time_kernels(cases)
    assert all("us" in r and r["us"] > 0 for r in kernel_rows), [r for r in kernel_rows if "us" not in r]
    archs = random_archs(7, 4)
    model_rows = measure_models([(a, SHAPES[0]) for a in archs[:3]])
    check_rows = measure_models([(archs[3], SHAPES[0])])
    model, report = fit(kernel_rows, model_rows, check_rows, sm_count=sms)
    path = write_calibration(profile, calibration_section(model, report, environment(), sms), tmp_path / "p.yaml")
    calibrated = load_profile(str(path))
    assert calibrated.calibrated.get("gpu") == torch.cuda.get_device_name()
    lat = predict(archs[3], SHAPES[0], calibrated)
    assert lat.median_ms > 0 and "calibrated" in lat.label()


@pytest.mark.gpu
@requires_cuda
def test_calibrate_refuses_a_profile_of_another_gpu():
    name = torch.cuda.get_device_name()
    other = next(p for p in ("l4", "rtx4090", "h200") if name not in load_profile(p).device_names)
    with pytest.raises(CalibrationError, match="does not list"):
        require_gpu(load_profile(other))
