"""``StoredDecoder``: ``TritonDecoder`` at the architecture's stored precision (its ``kv_dtype``,
``state_dtype`` and ``weight_dtype`` fields), on the precision kernels.

Per block, what a narrower field changes in the step:

- ``kv_dtype: fp8``: the K and V caches are fp8 ``[B, H, C, P]`` with one fp32 scale per sequence
  and head each, fixed by the prefill (``kernels.attention.decode_fp8.fp8_cache``); a step appends
  with ``rope_append_fp8`` and attends with ``decode_attention_fp8`` (half the bytes per row).
- ``state_dtype: bf16``: the state ``[B, H, P, P]`` and normalizer are bf16, stepped by
  ``linear_attention_step_bf16`` (half the state bytes read and written).
- ``weight_dtype: fp8``: the block's linears (qkv, out, MLP up and down) hold fp8 weights with one
  scale per output channel (``quantize_weight``, once, at construction); each step quantizes the
  input rows per token (``quantize_rows``) and multiplies on the fp8 tensor cores
  (``linear_fp8``, bias, activation and residual in its epilogue): two launches where
  ``linear_rows`` is one. The head is no block's and stays at the model's dtype.

The math is ``HybridModel.step``'s with ``stored_precision()`` on (``nas.models.precision``): the
torch model rounds the normalized rows before its linear, so fp8 weights need the norms unfolded
(``to_triton(model, fold_norms=False)``; the decoder runs each norm as a launch of its own
either way, so unfolding costs a step nothing). A block at full precision runs
``TritonDecoder``'s kernels unchanged.

This file is apart from ``triton_decode.py`` so that the full-precision decode step, and every
latency measured or calibrated with it, keeps its fingerprint (``nas.latency``): a stored
precision's measured decode is keyed by ``stored_decode_fingerprint`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.linear_attention.reference import normalizes
from nas.models.decode import LayerCache
from nas.models.triton_decode import TritonDecoder, _Buffers
from nas.models.triton_model import TritonModel, _Block
from nas.spec import LayerSpec

__all__ = ["StoredDecoder"]

_Linear = tuple[torch.Tensor, torch.Tensor]  # (weight, bias) at the model's dtype
_Fp8Linear = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (fp8 weight, fp32 scales, bias)


@dataclass(frozen=True)
class _StoredBuffers(_Buffers):
    """``_Buffers`` plus an fp8 cache's scales (fp32 ``[B, H]``; None for a bf16 cache)."""

    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None


@dataclass(frozen=True)
class _Fp8Weights:
    """A ``weight_dtype: fp8`` block's linears as ``linear_fp8`` takes them (None where it has none)."""

    qkv: _Fp8Linear | None
    out: _Fp8Linear | None
    up: _Fp8Linear | None
    down: _Fp8Linear | None


def _fp8(pair: _Linear | None) -> _Fp8Linear | None:
    from kernels.linear.fp8 import quantize_weight

    if pair is None:
        return None
    weight, bias = pair
    return (*quantize_weight(weight), bias)


class StoredDecoder(TritonDecoder):
    """``TritonDecoder`` whose caches, states and linear weights are stored as the architecture's
    precision fields say (see the module docstring). ``load`` takes a cache prefilled with
    ``HybridModel.stored_precision()`` on (fp8 K/V with their scales, bf16 states)."""

    def __init__(self, tmodel: TritonModel, batch: int, capacity: int) -> None:
        if not isinstance(tmodel, TritonModel):
            raise TypeError(
                f"StoredDecoder takes a TritonModel, got {type(tmodel).__name__}: "
                "StoredDecoder(to_triton(model.cuda(), fold_norms=False), batch, capacity)"
            )
        specs = tmodel.arch.layers
        if tmodel.fold_norms and any(s.weight_dtype == "fp8" for s in specs):
            raise ValueError(
                "StoredDecoder: fp8 weights quantize the normalized rows, as the torch model does; "
                "build the TritonModel with to_triton(model, fold_norms=False)"
            )
        self._specs = {id(blk): spec for blk, spec in zip(tmodel.blocks, specs, strict=True)}
        super().__init__(tmodel, batch, capacity)
        self.fp8 = tuple(self._fp8_weights(blk) for blk in tmodel.blocks)

    def _spec(self, blk: _Block) -> LayerSpec:
        return self._specs[id(blk)]

    def _fp8_weights(self, blk: _Block) -> _Fp8Weights | None:
        if self._spec(blk).weight_dtype != "fp8":
            return None
        return _Fp8Weights(_fp8(blk.qkv), _fp8(blk.out), _fp8(blk.up), _fp8(blk.down))

    def _buffers(self, blk: _Block) -> _StoredBuffers:
        from kernels._fp8 import FP8_DTYPE
        from kernels.linear_attention.step_bf16 import STATE_DTYPE

        B, C, dt, dev = self.batch, self.capacity, self.tmodel.dtype, self.device
        spec = self._spec(blk)
        conv = k = v = rope = state = z = k_scale = v_scale = None
        if blk.conv is not None:
            conv = torch.zeros(B, blk.conv[0].shape[1] - 1, blk.conv[0].shape[0], dtype=dt, device=dev)
        H, P = blk.heads, blk.padded_head_dim
        if blk.mixer == "attention":
            fp8 = spec.kv_dtype == "fp8"
            k, v = (torch.zeros(B, H, C, P, dtype=FP8_DTYPE if fp8 else dt, device=dev) for _ in range(2))
            if fp8:
                k_scale, v_scale = (torch.ones(B, H, dtype=torch.float32, device=dev) for _ in range(2))
            rope = self.tmodel._rope_tables(C, self.tmodel.arch.d_model // H, P, dev)
        elif blk.mixer == "linear_attention":
            sdt = STATE_DTYPE if spec.state_dtype == "bf16" else torch.float32
            state = torch.zeros(B, H, P, P, dtype=sdt, device=dev)
            if normalizes(blk.feature_map):
                z = torch.zeros(B, H, P, dtype=sdt, device=dev)
        return _StoredBuffers(conv, k, v, rope, state, z, k_scale, v_scale)

    def nbytes(self) -> int:
        """``TritonDecoder.nbytes`` at the stored dtypes, the fp8 caches' scales included."""
        scales = [t for buf in self.layers for t in (buf.k_scale, buf.v_scale) if t is not None]
        return super().nbytes() + sum(t.numel() * t.element_size() for t in scales)

    @torch.no_grad()
    def load(self, cache) -> None:
        """``TritonDecoder.load`` of a stored-precision prefill: fp8 rows copied as stored, their
        scales with them; bf16 states as stored."""
        super().load(cache)
        for buf, layer in zip(self.layers, cache.layers, strict=True):
            if buf.k_scale is not None:
                buf.k_scale.copy_(layer.k_scale)
                buf.v_scale.copy_(layer.v_scale)

    def _check_layer(self, i: int, blk: _Block, layer: LayerCache) -> None:
        """``TritonDecoder``'s checks, and that the cache is stored as this decoder stores it: fp8
        keys and values (with their scales) exactly where the decoder's are, a bf16 state exactly
        where the decoder's is (other dtypes are cast, as ``TritonDecoder.load`` does)."""
        from kernels._fp8 import FP8_DTYPE

        super()._check_layer(i, blk, layer)
        buf = self.layers[i]
        narrow = {"k": FP8_DTYPE, "v": FP8_DTYPE, "state": torch.bfloat16, "z": torch.bfloat16}
        for name, dtype in narrow.items():
            got, want = getattr(layer, name), getattr(buf, name)
            if got is not None and want is not None and (got.dtype == dtype) != (want.dtype == dtype):
                raise ValueError(
                    f"load: layer {i} ({blk.mixer}): cache field {name!r} is {got.dtype}, the decoder stores "
                    f"{want.dtype} (prefill with model.stored_precision() on, of the same architecture)"
                )
        if buf.k_scale is not None and (layer.k_scale is None or layer.v_scale is None):
            raise ValueError(f"load: layer {i} (attention): an fp8 cache needs k_scale and v_scale")

    @torch.no_grad()
    def fill_random(self, length: int, generator: torch.Generator | None = None) -> None:
        """``TritonDecoder.fill_random``, an fp8 cache's rows cast from N(0, 1) with scales 1."""
        super().fill_random(length, generator)
        for buf in self.layers:
            if buf.k_scale is not None:
                buf.k_scale.fill_(1.0)
                buf.v_scale.fill_(1.0)

    def _linear(
        self,
        x: torch.Tensor,
        pair: _Linear,
        fp8: _Fp8Linear | None,
        *,
        activation: str | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``linear_rows`` at the model's dtype, or the fp8 route: quantize the rows, then one fp8 GEMM."""
        from kernels.linear.decode import linear_rows
        from kernels.linear.fp8 import linear_fp8, quantize_rows

        if fp8 is None:
            return linear_rows(x, *pair, activation=activation, residual=residual)
        x_q, s_x = quantize_rows(x)
        return linear_fp8(x_q, s_x, *fp8, activation=activation, residual=residual, out_dtype=self.tmodel.dtype)

    def _step_kernels(self, tokens: torch.Tensor) -> torch.Tensor:
        from kernels.attention.decode import decode_attention, rope_append
        from kernels.attention.decode_fp8 import decode_attention_fp8, rope_append_fp8
        from kernels.conv.decode import causal_conv_step
        from kernels.linear.decode import linear_rows
        from kernels.linear_attention.step_bf16 import linear_attention_step_bf16
        from kernels.linear_attention.triton import linear_attention_step

        tm, B, d = self.tmodel, self.batch, self.tmodel.arch.d_model
        h = F.embedding(tokens, tm.embed)  # residual stream [B, d]
        for blk, buf, w in zip(tm.blocks, self.layers, self.fp8, strict=True):
            if blk.qkv is not None:
                qkv = self._linear(blk.norm1(h), blk.qkv, w and w.qkv)  # [B, 3·H·P]
                if blk.conv is not None:
                    qkv = causal_conv_step(qkv, buf.conv, *blk.conv)
                H, D, P = blk.heads, d // blk.heads, blk.padded_head_dim
                if blk.mixer == "attention" and buf.k_scale is not None:
                    scales = (buf.k_scale, buf.v_scale)
                    q = rope_append_fp8(qkv, H, buf.k, buf.v, *scales, self.positions, buf.rope)
                    o = decode_attention_fp8(q, buf.k, buf.v, *scales, self.positions, scale=D**-0.5)
                elif blk.mixer == "attention":
                    q = rope_append(qkv, H, buf.k, buf.v, self.positions, buf.rope)
                    o = decode_attention(q, buf.k, buf.v, self.positions, scale=D**-0.5)
                else:
                    q, k, v = qkv.view(B, 3, H, P).unbind(1)
                    bf16 = buf.state.dtype != torch.float32
                    step = linear_attention_step_bf16 if bf16 else linear_attention_step
                    o = step(q, k, v, buf.state, buf.z, feature_map=blk.feature_map)
                h = self._linear(o.reshape(B, H * P), blk.out, w and w.out, residual=h)
            if blk.up is not None:
                u = self._linear(blk.norm2(h), blk.up, w and w.up, activation=blk.activation)
                h = self._linear(u, blk.down, w and w.down, residual=h)
        logits = tm.logits(linear_rows(tm.final_norm(h), *tm.head))  # [B, n_out], a view
        self.positions += 1
        return logits
