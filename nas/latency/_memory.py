"""Memory of one inference forward: weights, peak activations, KV cache, recurrent state."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nas.spec import ArchSpec

from ._costs import DTYPE_BYTES, count_params, op_costs
from ._shape import LatencyShape

__all__ = ["STATE_BYTES", "MemoryEstimate", "memory"]

STATE_BYTES = 4  # linear-attention states accumulate in fp32 whatever the activation dtype
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

    KV cache: K and V ``[T, d]`` per attention layer per sequence (2·T·d elements, ``dtype``).
    Recurrent state: ``heads`` states of ``[Dh, Dh]`` per linear-attention layer per sequence
    (fp32). Peak activation: the largest live set of any op of ``op_costs``.
    """
    ops = op_costs(arch, shape, dtype=dtype)  # validates dtype
    size = DTYPE_BYTES[dtype]
    d, batch, seq = arch.d_model, shape.batch, shape.seq_len
    params = count_params(arch)
    attention = sum(layer.mixer == "attention" for layer in arch.layers)
    kv_cache = attention * 2 * seq * d * batch * size
    state = (
        sum(layer.heads * (d // layer.heads) ** 2 for layer in arch.layers if layer.mixer == "linear_attention")
        * batch
        * STATE_BYTES
    )
    peak = max(op.live_bytes for op in ops)
    weights = params * size
    return MemoryEstimate(params, weights, peak, kv_cache, state, (weights + peak + kv_cache + state) / _MIB)
