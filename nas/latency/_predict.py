"""Roofline latency prediction: per-op max(compute, memory) time plus kernel launches.

Each op of ``op_costs`` takes ``max(flops / (peak · f_flops), bytes / (bandwidth · f_bw))
+ kernels · launch_overhead``. Matmul ops use the dtype's tensor-core peak, the others the
fp32 vector peak. The achieved fractions come from the profile's ``calibrated:`` section;
without one they default to ``DEFAULT_FLOPS_FRACTION`` and ``DEFAULT_BANDWIDTH_FRACTION``,
and the launch overhead to the profile's nominal ``launch_overhead_us``.
"""

from __future__ import annotations

from hardware_profiles import HardwareProfile
from nas.spec import ArchSpec

from ._costs import op_costs
from ._result import Latency
from ._shape import LatencyShape

__all__ = ["DEFAULT_BANDWIDTH_FRACTION", "DEFAULT_FLOPS_FRACTION", "predict"]

# Uncalibrated guesses: large well-tuned GEMMs reach roughly 60-75 % of datasheet tensor peak,
# streaming kernels roughly 80-90 % of datasheet bandwidth. Replaced by measured fractions.
DEFAULT_FLOPS_FRACTION = 0.6
DEFAULT_BANDWIDTH_FRACTION = 0.8


def _flops_per_s(profile: HardwareProfile, dtype: str) -> float:
    fraction = profile.calibrated.flops_fraction(dtype)
    return profile.peak_flops(dtype) * (DEFAULT_FLOPS_FRACTION if fraction is None else fraction)


def predict(arch: ArchSpec, shape: LatencyShape, profile: HardwareProfile, *,
            dtype: str = "bf16") -> Latency:
    """Predicted inference-forward latency of ``arch`` at ``shape`` on ``profile``.

    The breakdown gives each op's ms in execution order; they sum to ``median_ms``.
    """
    ops = op_costs(arch, shape, dtype=dtype)  # validates dtype
    matmul_rate = _flops_per_s(profile, dtype)
    vector_rate = _flops_per_s(profile, "fp32")
    bandwidth_fraction = profile.calibrated.bandwidth_fraction
    bandwidth = profile.bandwidth_bytes_per_s * (
        DEFAULT_BANDWIDTH_FRACTION if bandwidth_fraction is None else bandwidth_fraction)
    launch_us = profile.calibrated.launch_overhead_us or profile.launch_overhead_us
    breakdown = []
    for op in ops:
        compute = op.flops / (matmul_rate if op.matmul else vector_rate)
        seconds = max(compute, op.bytes / bandwidth) + op.kernels * launch_us * 1e-6
        breakdown.append((op.name, seconds * 1e3))
    return Latency(
        median_ms=sum(ms for _, ms in breakdown),
        iqr_ms=0.0,
        source="predicted",
        device=profile.name,
        dtype=dtype,
        shape=shape,
        breakdown=tuple(breakdown),
    )
