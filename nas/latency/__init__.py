"""Latency and memory of a candidate: predicted from a hardware profile (``predict``), or,
on a CUDA machine, measured on the Triton model (a ``measure`` entry point, added next to
``predict`` and returning the same ``Latency``).
"""

from ._measure import LatencyCache, cache_key, kernels_fingerprint, measure
from kernels.errors import KernelCompileError, KernelError, KernelLaunchError, KernelMismatchError
from ._costs import DTYPE_BYTES, LINEAR_ATTENTION_CHUNK, OpCost, count_params, mlp_hidden, op_costs
from ._memory import STATE_BYTES, MemoryEstimate, memory
from ._predict import DEFAULT_BANDWIDTH_FRACTION, DEFAULT_FLOPS_FRACTION, predict
from ._result import SOURCES, Latency
from ._shape import LatencyShape, parse_shape

__all__ = [
    "DEFAULT_BANDWIDTH_FRACTION",
    "DEFAULT_FLOPS_FRACTION",
    "DTYPE_BYTES",
    "KernelCompileError",
    "KernelError",
    "KernelLaunchError",
    "KernelMismatchError",
    "LINEAR_ATTENTION_CHUNK",
    "SOURCES",
    "STATE_BYTES",
    "Latency",
    "LatencyCache",
    "LatencyShape",
    "MemoryEstimate",
    "OpCost",
    "cache_key",
    "kernels_fingerprint",
    "count_params",
    "measure",
    "memory",
    "mlp_hidden",
    "op_costs",
    "parse_shape",
    "predict",
]
