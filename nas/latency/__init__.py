"""Latency and memory of a candidate: predicted from a hardware profile (``predict``, with an
interval from the profile's calibration), or, on a CUDA machine, measured on the Triton model
(``measure``, returning the same ``Latency``); ``nas.latency.calibrate`` fits the prediction's
per-kernel cost model on a GPU.
"""

from kernels.errors import KernelCompileError, KernelError, KernelLaunchError, KernelMismatchError

from ._costs import (
    DTYPE_BYTES,
    LINEAR_ATTENTION_CHUNK,
    PRECISION_BYTES,
    SCALE_BYTES,
    OpCost,
    count_params,
    mlp_hidden,
    op_costs,
    weight_bytes,
)
from ._decode import CacheEstimate, DecodeWork, cache_memory, decode_work
from ._launches import Launch, launches
from ._measure import (
    LatencyCache,
    cache_key,
    decode_fingerprint,
    kernels_fingerprint,
    measure,
    stored_decode_fingerprint,
)
from ._measure_decode import measure_decode
from ._memory import STATE_BYTES, MemoryEstimate, memory
from ._model import KernelModel
from ._predict import (
    DEFAULT_BANDWIDTH_FRACTION,
    DEFAULT_FLOPS_FRACTION,
    EXTRAPOLATION_WIDENING,
    EXTRAPOLATION_WIDENING_PER_DOUBLING,
    STORED_WIDENING,
    CalibrationWarning,
    PredictionStatus,
    predict,
    predict_decode,
    prediction_status,
    reference_profile,
    transfer_interval,
    transfer_ratios,
)
from ._result import LATENCY_KINDS, SOURCES, STORED_NOTE, UNPRICED, Latency, shared_labels, unpriced_precision
from ._shape import LatencyShape, parse_shape

__all__ = [
    "DEFAULT_BANDWIDTH_FRACTION",
    "DEFAULT_FLOPS_FRACTION",
    "DTYPE_BYTES",
    "EXTRAPOLATION_WIDENING",
    "EXTRAPOLATION_WIDENING_PER_DOUBLING",
    "CacheEstimate",
    "CalibrationWarning",
    "DecodeWork",
    "KernelCompileError",
    "KernelError",
    "KernelLaunchError",
    "KernelMismatchError",
    "KernelModel",
    "LATENCY_KINDS",
    "LINEAR_ATTENTION_CHUNK",
    "Launch",
    "SOURCES",
    "STORED_NOTE",
    "STORED_WIDENING",
    "UNPRICED",
    "STATE_BYTES",
    "Latency",
    "LatencyCache",
    "LatencyShape",
    "MemoryEstimate",
    "OpCost",
    "PRECISION_BYTES",
    "SCALE_BYTES",
    "PredictionStatus",
    "cache_key",
    "cache_memory",
    "decode_fingerprint",
    "decode_work",
    "kernels_fingerprint",
    "count_params",
    "launches",
    "measure",
    "measure_decode",
    "memory",
    "mlp_hidden",
    "op_costs",
    "weight_bytes",
    "parse_shape",
    "predict",
    "predict_decode",
    "prediction_status",
    "reference_profile",
    "shared_labels",
    "stored_decode_fingerprint",
    "transfer_interval",
    "transfer_ratios",
    "unpriced_precision",
]
