"""Memory of one inference forward: weights, peak activations, KV cache, recurrent state."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nas.spec import ArchSpec

from ._costs import DTYPE_BYTES, count_params, kv_bytes, kv_scale_bytes, op_costs, state_bytes, weight_bytes
from ._shape import LatencyShape

__all__ = ["STATE_BYTES", "MemoryEstimate", "memory"]

STATE_BYTES = 4  # linear-attention states accumulate in fp32 whatever the activation dtype (the default state_dtype)
_MIB = 2**20


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes for ``shape.batch`` sequences of ``shape.seq_len`` tokens; ``total_mb`` (MiB)
    adds all four, an upper bound since a prefill holds K/V in its activations too."""

    params: int
    weight_bytes: int
    peak_activation_bytes: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    total_mb: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory(arch: ArchSpec, shape: LatencyShape, *, dtype: str = "bf16") -> MemoryEstimate:
    """Memory of ``arch`` at ``shape`` with weights and activations in ``dtype``.

    KV cache: K and V ``[T, d]`` per attention layer per sequence (2·T·d elements, ``dtype``, or
    the layer's ``kv_dtype`` with its per-head fp32 scales). Recurrent state: ``heads`` states of
    ``[Dh, Dh]`` per linear-attention layer per sequence (its ``state_dtype``, fp32 by default).
    Weights: ``dtype``, a block's linear weights at its ``weight_dtype`` (``weight_bytes``). Peak
    activation: the largest live set of any op of ``op_costs``.
    """
    ops = op_costs(arch, shape, dtype=dtype)  # validates dtype
    size = DTYPE_BYTES[dtype]
    d, batch, seq = arch.d_model, shape.batch, shape.seq_len
    params = count_params(arch)
    kv_cache = batch * sum(
        2 * seq * d * kv_bytes(layer, size) + kv_scale_bytes(layer)
        for layer in arch.layers
        if layer.mixer == "attention"
    )
    state = batch * sum(
        layer.heads * (d // layer.heads) ** 2 * state_bytes(layer)
        for layer in arch.layers
        if layer.mixer == "linear_attention"
    )
    peak = max(op.live_bytes for op in ops)
    weights = weight_bytes(arch, size)
    return MemoryEstimate(params, weights, peak, kv_cache, state, (weights + peak + kv_cache + state) / _MIB)
