"""What a model carries from one generated token to the next: a ``LayerCache`` per block.

``HybridModel.prefill`` fills a ``DecodeCache`` from a prompt and ``HybridModel.step`` advances
it one token at a time; ``TritonDecoder.load`` copies one into the kernels' device buffers.
Softmax attention keeps every key and value (grows with the context, up to ``capacity``);
linear attention keeps a fixed ``Dh × Dh`` state per head; a short convolution keeps its last
K-1 inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor

__all__ = ["DecodeCache", "LayerCache"]


@dataclass
class LayerCache:
    """One block's decoding state; every field None for a block without a mixer (MLP only).

    conv: ``[B, K-1, 3d]`` the last K-1 qkv projections before the short conv (zeros before the start).
    k, v: ``[B, H, C, Dh]`` softmax attention's keys (after RoPE) and values, rows [0, length) valid;
      fp8 when the model decodes at its stored precision with ``kv_dtype: fp8``, then read back as
      ``row · k_scale`` (``v_scale``): fp32 ``[B, H]``, fixed by the prefill (None otherwise).
    state: ``[B, H, Dh, Dh]`` linear attention's Σ_s φ(k_s) v_sᵀ, fp32 (bf16 at ``state_dtype: bf16``).
    z: ``[B, H, Dh]`` Σ_s φ(k_s), the state's dtype; None for the unnormalized identity map.
    """

    conv: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    state: Tensor | None = None
    z: Tensor | None = None
    k_scale: Tensor | None = None
    v_scale: Tensor | None = None

    def nbytes(self) -> int:
        """Bytes held by the tensors (the KV cache at full capacity, not only its valid rows)."""
        tensors = (getattr(self, f.name) for f in fields(self))
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@dataclass
class DecodeCache:
    """Every block's ``LayerCache``, the tokens consumed so far and the KV rows allocated."""

    layers: list[LayerCache]
    length: int
    capacity: int

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
