"""What a model computes when its KV cache, recurrent state and weights are stored narrower than
it was trained: the torch reference of the precision fields of ``LayerSpec``.

Training runs at its own precision (fp32 on a CPU, bf16 autocast on a GPU); a deployment may store
what a decode step reads in fewer bytes. These functions round a tensor as it would be stored and
give it back in its own dtype (quantize, then dequantize), so the forward that follows is the
model's own math on the stored values:

- ``fp8_per_head``: a KV cache in fp8 e4m3 with one scale per sequence and head;
- ``fp8_per_channel``: a linear layer's weight in fp8 e4m3 with one scale per output channel;
- ``fp8_per_token``: a linear layer's input in fp8 e4m3 with one scale per row (token), taken from
  that row when it arrives (a "dynamic" scale): with ``fp8_per_channel``, what an fp8 matmul on
  Hopper's or Ada's tensor cores multiplies (``kernels.linear.fp8``);
- ``fp8_append``: a decoded token's key or value row stored in an fp8 KV cache whose scales the
  prefill fixed (``kernels.attention.decode_fp8.fp8_cache``), saturated at ±448;
- ``bf16``: a value stored in bf16 (round to nearest even);
- ``linear_attention_stored_state``: causal linear attention in recurrent form whose state (and
  normalizer) is rounded to bf16 after each token's update, where a decode step stores it;
  ``stored_state_step`` is one decoding step of it on a bf16 state.

Scale rule (both fp8 roundings): ``scale = amax / FP8_MAX`` over the group that shares it, so the
group's largest magnitude maps onto e4m3's largest finite value, 448; each element is stored as
``fp8(x / scale)`` (round to nearest even, e4m3's subnormals below 2^-6) and read back as that
times ``scale`` (fp32). A group that is all zeros takes scale 1 (stored exactly). The scale
itself is kept in fp32 (``nas.latency`` counts its bytes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels._fp8 import FP8_DTYPE, FP8_MAX, scaled
from kernels.linear_attention.reference import EPS as NORMALIZER_EPS
from kernels.linear_attention.reference import feature, normalizes

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "StoredLinear",
    "bf16",
    "fp8_append",
    "fp8_per_channel",
    "fp8_per_head",
    "fp8_per_token",
    "fp8_scaled",
    "linear_attention_stored_state",
    "stored_rows",
    "stored_state_step",
]


def fp8_scaled(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``x`` stored in fp8 e4m3 with one scale per group of the elements that share every index
    but ``dims`` (the module docstring's scale rule: ``kernels._fp8.scaled``, the kernels' own),
    read back in ``x``'s dtype."""
    values, scale = scaled(x, dims)
    for d in sorted(d % x.dim() for d in dims):
        scale = scale.unsqueeze(d)
    return (values.float() * scale).to(x.dtype)


def fp8_per_head(x: torch.Tensor) -> torch.Tensor:
    """Keys or values ``[B, H, T, Dh]`` as an fp8 KV cache stores them: one scale per sequence and
    head, from the amax over that head's ``T`` positions and ``Dh`` channels (the scale a prefill
    of the whole sequence picks; the rows of every position share it)."""
    return fp8_scaled(x, (2, 3))


def fp8_per_channel(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight ``[out, in]`` stored in fp8: one scale per output channel (row),
    from the amax over its ``in`` inputs. The bias is not rounded (it stays at the model's dtype)."""
    return fp8_scaled(weight, (1,))


def fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    """A linear layer's input ``[..., in]`` as an fp8 matmul takes it: one scale per row, from the
    amax over its ``in`` channels (each token quantized on its own, when it arrives)."""
    return fp8_scaled(x, (x.dim() - 1,))


def fp8_append(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A new row of keys or values ``[B, H, Dh]`` as an fp8 cache with fixed scales ``[B, H]``
    (fp32, the prefill's) stores it: ``fp8(clamp(x · (1 / scale), ±448))``, the decode kernel's
    ``rope_append_fp8`` rule (a value past the prefill's range saturates)."""
    inverse = 1.0 / scale.float()
    return (x.float() * inverse.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def stored_rows(cache: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 cache rows ``[B, H, T, Dh]`` read back with their scales ``[B, H]`` in ``dtype``
    (``fp8_per_head``'s read-back: the fp32 product, then cast)."""
    return (cache.float() * scale[:, :, None, None]).to(dtype)


def bf16(x: torch.Tensor) -> torch.Tensor:
    """``x`` stored in bf16 (round to nearest even), read back in its own dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def linear_attention_stored_state(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, normalize: bool, dtype: str, with_state: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Causal linear attention token by token, its state stored at ``dtype`` ("fp32" or "bf16").

    q, k, v: ``[B, H, T, D]`` with the feature map applied (and q scaled, for the identity map),
    as ``nas.models.mixers.causal_linear_attention`` takes them; returns ``[B, H, T, D]`` fp32.
    As the decode step (``kernels.linear_attention.reference.step``) runs each token:
    S_t = round(S_{t-1} + φ(k_t) v_tᵀ) and, normalized, z_t = round(z_{t-1} + φ(k_t)), each sum
    taken in fp32 from the stored value; o_t = φ(q_t)·S_t [/ (φ(q_t)·z_t + EPS)] reads the values
    as stored. ``round`` is ``bf16`` for "bf16" and nothing for "fp32" (then this is the chunked
    form's math in another summation order: equal to fp32 round-off). The loop over T costs T
    small launches, which is why training keeps the chunked form. ``with_state``: also the state
    and normalizer after the last token (fp32 tensors holding the stored values; z None unless
    ``normalize``), what a prefill leaves for the decode steps.
    """
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"state dtype {dtype!r} is not one of ['fp32', 'bf16']")
    store = bf16 if dtype == "bf16" else (lambda t: t)
    q, k, v = q.float(), k.float(), v.float()
    B, H, T, D = q.shape
    state = q.new_zeros(B, H, D, v.shape[-1])
    z = q.new_zeros(B, H, D)
    out = q.new_empty(B, H, T, v.shape[-1])
    with torch.autocast(q.device.type, enabled=False):  # the state's sums are fp32 under autocast too
        for t in range(T):
            qt, kt = q[:, :, t], k[:, :, t]
            state = store(state + kt.unsqueeze(-1) * v[:, :, t].unsqueeze(-2))
            o = (qt.unsqueeze(-1) * state).sum(-2)  # [B, H, Dv]
            if normalize:
                z = store(z + kt)
                o = o / ((qt * z).sum(-1, keepdim=True) + NORMALIZER_EPS)
            out[:, :, t] = o
    return (out, state, z if normalize else None) if with_state else out


def stored_state_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, z: torch.Tensor | None, *, feature_map: str
) -> torch.Tensor:
    """One decoding step on a bf16 state, in place: q, k, v ``[B, H, D]`` raw projections; state
    ``[B, H, D, D]`` and z ``[B, H, D]`` bf16 (z None for the unnormalized identity map). Each sum is
    taken in fp32 from the stored value and rounded when stored; the output reads them as stored
    (``linear_attention_stored_state``'s token, the contract of
    ``kernels.linear_attention.step_bf16``). Returns o ``[B, H·D]`` fp32."""
    B, H, D = q.shape
    qf, kf = feature(q, feature_map), feature(k, feature_map)
    if not normalizes(feature_map):
        qf = qf * D**-0.5
    with torch.autocast(q.device.type, enabled=False):
        state.copy_((state.float() + kf.unsqueeze(-1) * v.float().unsqueeze(-2)).to(state.dtype))
        out = (qf.unsqueeze(-1) * state.float()).sum(-2)
        if z is not None:
            z.copy_((z.float() + kf).to(z.dtype))
        if normalizes(feature_map):
            out = out / ((qf * z.float()).sum(-1, keepdim=True) + NORMALIZER_EPS)
    return out.reshape(B, H * D)


class StoredLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters and state-dict names) whose forward, while ``fp8`` is set,
    is the fp8 matmul's: its input rounded per token (``fp8_per_token``) times its weight as fp8
    stores it (``fp8_per_channel``), summed in fp32, plus the bias (not rounded). The parameters
    themselves are never rounded, so training, the stored weights and the exports are the model's own."""

    fp8: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fp8:
            return super().forward(x)
        return F.linear(fp8_per_token(x), fp8_per_channel(self.weight), self.bias)
