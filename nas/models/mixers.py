"""Token mixers in plain torch: the training path and the reference the Triton model must match."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.linear_attention.reference import CHUNK as LINEAR_ATTENTION_CHUNK
from kernels.linear_attention.reference import EPS as NORMALIZER_EPS
from kernels.linear_attention.reference import FEATURE_MAP_FNS
from kernels.linear_attention.reference import step as linear_attention_step
from nas.models.decode import LayerCache
from nas.models.precision import (
    StoredLinear,
    fp8_append,
    fp8_per_head,
    linear_attention_stored_state,
    stored_rows,
    stored_state_step,
)

__all__ = ["FEATURE_MAP_FNS", "LinearAttention", "SelfAttention", "causal_depthwise_conv", "causal_linear_attention"]

_STATE_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # a state_dtype's storage


def _exporting() -> bool:
    """Whether torch.export (or the ONNX exporter on top of it) is tracing: a traced graph must hold
    for every sequence length, so no Python decision may depend on T there."""
    return torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()


def causal_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, normalize: bool, chunk: int = LINEAR_ATTENTION_CHUNK
) -> torch.Tensor:
    """Causal linear attention in chunked form, O(T·C·D + T·D²) instead of O(T²·D).

    q, k, v: ``[B, H, T, D]`` with the feature map already applied to q and k.
    o_t = φ(q_t)·S_t, S_t = Σ_{s≤t} φ(k_s) v_sᵀ; with ``normalize`` divided by φ(q_t)·Σ_{s≤t} φ(k_s)
    (Katharopoulos et al. 2020, eq. 5). Within a chunk the causal part is a masked matmul; across
    chunks a running state carries the prefix sums.

    T is zero-padded up to N = ⌈T / C⌉ chunks; padded rows come after every real one, so the
    causal mask keeps them out of the real rows' sums. Eagerly a sequence shorter than a chunk is
    one chunk of T rows; an export keeps C rows, so the traced graph has no branch on T and its
    shapes follow T's symbol at any length (the same sums plus zeros: fp32 round-off apart).
    """
    B, H, T, D = q.shape
    exporting = _exporting()  # first: evaluating a condition on T would freeze it in a trace
    if not exporting:
        chunk = min(chunk, T)  # a sequence shorter than a chunk is one chunk: no padding to compute
    n = (T + chunk - 1) // chunk
    if exporting or n * chunk != T:  # eagerly no copy when C divides T
        q, k, v = (F.pad(t, (0, 0, 0, n * chunk - T)) for t in (q, k, v))
    q, k, v = (t.reshape(B, H, n, chunk, D) for t in (q, k, v))  # [B, H, N, C, D]

    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, 0.0)  # [B, H, N, C, C]
    kv = k.transpose(-1, -2) @ v  # [B, H, N, D, D]: each chunk's contribution to the state
    state = torch.cumsum(kv, dim=2) - kv  # exclusive prefix: the state before each chunk
    out = scores @ v + q @ state  # [B, H, N, C, D]
    if normalize:
        ksum = k.sum(dim=3)  # [B, H, N, D]
        kprefix = torch.cumsum(ksum, dim=2) - ksum
        denom = scores.sum(-1) + (q * kprefix.unsqueeze(3)).sum(-1)  # [B, H, N, C]
        out = out / (denom.unsqueeze(-1) + NORMALIZER_EPS)
    return out.reshape(B, H, n * chunk, D)[:, :, :T]


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y[:, t] = bias + Σ_j weight[:, 0, j] · x[:, t - K + 1 + j]`` (zeros before the start).

    x ``[B, T, C]``, weight ``[C, 1, K]`` (an ``nn.Conv1d`` with ``groups=C``), bias ``[C]``; or a
    population's weight ``[P, C, 1, K]`` and bias ``[P, C]`` over x ``[P·B, T, C]``. The
    same as that convolution with K-1 zeros of left padding, computed as K shifted multiply-adds
    in x's own layout: for the short kernels of a mixer (K ≤ 8) this avoids two transposes and
    the CPU's depthwise-convolution backward, the slowest op of a small candidate's step.
    """
    K, T = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, K - 1, 0))  # [B, T + K - 1, C]
    if weight.dim() == 4:  # a population (nas.models.population): weight [P, C, 1, K], bias [P, C], x [P·B, T, C]
        P = weight.shape[0]
        padded = padded.reshape(P, -1, *padded.shape[1:])  # [P, B, T + K - 1, C]
        taps = weight[:, :, 0, :].permute(2, 0, 1)[:, :, None, None, :]  # [K, P, 1, 1, C]
        bias = bias[:, None, None, :]
    else:
        taps = weight[:, 0, :].t()  # [K, C]
    out = bias + padded[..., :T, :] * taps[0]
    for j in range(1, K):
        out = out + padded[..., j : j + T, :] * taps[j]
    return out.reshape(x.shape[0], T, -1)


def rope_tables(
    T: int, D: int, *, device: torch.device, dtype: torch.dtype, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables (Su et al. 2021), cos and sin ``[T - start, D//2]`` for positions
    ``start .. T-1``, base 10000 (a decode step takes the one row of its position)."""
    inv = 10000.0 ** (-torch.arange(0, D - D % 2, 2, device=device, dtype=torch.float32) / D)
    ang = torch.arange(start, T, device=device, dtype=torch.float32).unsqueeze(1) * inv
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., i], x[..., i + D//2]), i < D//2, of ``[B, H, T, D]`` by position
    (half-split layout). An odd head dim (heads need only divide d_model) leaves its last channel
    unrotated, so the map stays a rotation."""
    half = x.shape[-1] // 2
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest), dim=-1)


class _HeadsMixer(nn.Module):
    """Shared projections: fused QKV ``Linear(d, 3d)``, an optional depthwise causal convolution
    over the 3d projected channels, and the output ``Linear(d, d)``, all with bias.

    Decoding (``prefill`` then ``step``, see ``nas.models.decode``) runs the forward's own math
    on the prompt and keeps what the next token needs; ``step`` takes x ``[B, d]`` at
    ``position`` (the tokens consumed so far) and advances its ``LayerCache`` in place.
    """

    def __init__(self, d_model: int, heads: int, short_conv: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = StoredLinear(d_model, 3 * d_model)
        self.conv = (
            nn.Conv1d(3 * d_model, 3 * d_model, short_conv, groups=3 * d_model, padding=short_conv - 1)
            if short_conv
            else None
        )
        self.out = StoredLinear(d_model, d_model)

    def linears(self) -> tuple[StoredLinear, StoredLinear]:
        """The projections whose weights ``weight_dtype`` stores (``Block.stored_precision``)."""
        return self.qkv, self.out

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v ``[B, H, T, Dh]`` and the projection before the conv ``[B, T, 3d]`` (for a prefill)."""
        B, T, _ = x.shape
        raw = self.qkv(x)  # [B, T, 3d]
        qkv = causal_depthwise_conv(raw, self.conv.weight, self.conv.bias) if self.conv is not None else raw
        qkv = qkv.view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # [3, B, H, T, Dh]
        return qkv[0], qkv[1], qkv[2], raw

    def _merge(self, o: torch.Tensor) -> torch.Tensor:
        B, H, T, Dh = o.shape
        return self.out(o.transpose(1, 2).reshape(B, T, H * Dh))

    def _conv_state(self, raw: torch.Tensor) -> torch.Tensor | None:
        """The conv's inputs a step needs: the last K-1 rows of ``raw [B, T, 3d]``, zeros before the start."""
        if self.conv is None:
            return None
        K, T = self.conv.kernel_size[0], raw.shape[1]
        return F.pad(raw, (0, 0, K - 1, 0))[:, T:].clone()  # [B, K-1, 3d]

    def _split_step(self, x: torch.Tensor, conv_state: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """x ``[B, d]`` → q, k, v ``[B, H, Dh]``; shifts ``conv_state`` in place."""
        B = x.shape[0]
        qkv = self.qkv(x)  # [B, 3d]
        if self.conv is not None:
            window = torch.cat((conv_state, qkv.unsqueeze(1)), dim=1)  # [B, K, 3d]
            # the forward's conv over the window, last row: the same products summed in the same order
            qkv = causal_depthwise_conv(window, self.conv.weight, self.conv.bias)[:, -1]
            conv_state.copy_(window[:, 1:])
        return qkv.view(B, 3, self.heads, -1).unbind(1)


def _rows(x: torch.Tensor, capacity: int) -> torch.Tensor:
    """``[B, H, T, Dh]`` → ``[B, H, capacity, Dh]``, rows T.. zero."""
    return F.pad(x, (0, 0, 0, capacity - x.shape[2])).contiguous()


class SelfAttention(_HeadsMixer):
    """Causal multi-head softmax attention with rotary positions. x ``[B, T, d]`` → ``[B, T, d]``.

    The rotary tables are kept between forwards (a plain attribute, not a buffer: never in the
    state dict) and sliced to T, as a deployed model keeps them; rows are computed one position at
    a time, so a slice equals the tables computed at T. An export traces them from T instead, so
    the exported graph takes any sequence length.

    ``kv_fp8`` (set by ``Block.stored_precision``, off in training): the forward attends over its
    keys (after RoPE) and values as an fp8 KV cache stores them (``fp8_per_head``)."""

    def __init__(self, d_model: int, heads: int, short_conv: int) -> None:
        super().__init__(d_model, heads, short_conv)
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.kv_fp8 = False

    def _tables(self, T: int, D: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if _exporting():
            return rope_tables(T, D, device=like.device, dtype=like.dtype)
        cached = self._rope_cache
        if cached is None or cached[0].shape[0] < T or cached[0].dtype != like.dtype or cached[0].device != like.device:
            cached = self._rope_cache = rope_tables(T, D, device=like.device, dtype=like.dtype)
        return cached[0][:T], cached[1][:T]

    def _mix(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The output ``[B, T, d]``, the rotated keys and the values ``[B, H, T, Dh]`` (before any
        fp8 rounding: a prefill stores them itself), the raw projection."""
        q, k, v, raw = self._split(x)
        cos, sin = self._tables(q.shape[2], q.shape[3], q)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = (fp8_per_head(k), fp8_per_head(v)) if self.kv_fp8 else (k, v)
        return self._merge(F.scaled_dot_product_attention(q, keys, values, is_causal=True)), k, v, raw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mix(x)[0]

    def prefill(self, x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, LayerCache]:
        """x ``[B, T, d]`` → the forward's output and a cache of ``capacity`` ≥ T key/value rows
        (with ``kv_fp8``: fp8 rows and the per-head scales the prompt fixes, ``fp8_cache``)."""
        out, k, v, raw = self._mix(x)
        conv = self._conv_state(raw)
        if self.kv_fp8:
            from kernels.attention.decode_fp8 import fp8_cache

            (k, k_scale), (v, v_scale) = fp8_cache(k, capacity), fp8_cache(v, capacity)
            return out, LayerCache(conv=conv, k=k, v=v, k_scale=k_scale, v_scale=v_scale)
        return out, LayerCache(conv=conv, k=_rows(k, capacity), v=_rows(v, capacity))

    def step(self, x: torch.Tensor, cache: LayerCache, position: int) -> torch.Tensor:
        """x ``[B, d]`` → ``[B, d]``: RoPE at ``position``, k and v written to that row, then
        attention over rows 0..position (an fp8 cache: the row stored with the prefill's scales,
        ``fp8_append``, and every row read back with them)."""
        q, k, v = self._split_step(x, cache.conv)  # [B, H, Dh]
        cos, sin = rope_tables(position + 1, q.shape[-1], device=q.device, dtype=q.dtype, start=position)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rows = slice(0, position + 1)
        if cache.k_scale is not None:
            cache.k[:, :, position] = fp8_append(k, cache.k_scale)
            cache.v[:, :, position] = fp8_append(v, cache.v_scale)
            keys = stored_rows(cache.k[:, :, rows], cache.k_scale, q.dtype)
            values = stored_rows(cache.v[:, :, rows], cache.v_scale, q.dtype)
        else:
            cache.k[:, :, position], cache.v[:, :, position] = k, v
            keys, values = cache.k[:, :, rows], cache.v[:, :, rows]
        return self._merge(F.scaled_dot_product_attention(q.unsqueeze(2), keys, values))[:, 0]


class LinearAttention(_HeadsMixer):
    """Causal multi-head linear attention with feature map φ. x ``[B, T, d]`` → ``[B, T, d]``.

    Positive feature maps (elu+1, relu) are normalized as in Katharopoulos et al. 2020; the
    identity map can make the normalizer vanish, so it is left unnormalized and q is scaled
    by D^-1/2 instead, as in fla's ``chunk_linear_attn``.

    ``state_dtype`` (set by ``Block.stored_precision``; "fp32" in training): at "bf16" the forward
    runs token by token with its state stored in bf16 (``linear_attention_stored_state``).
    """

    def __init__(self, d_model: int, heads: int, feature_map: str, short_conv: int) -> None:
        super().__init__(d_model, heads, short_conv)
        self.feature_map = feature_map
        self.normalize = feature_map != "identity"
        self.state_dtype = "fp32"

    def _mix(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple | None]:
        """The output ``[B, T, d]``, φ(k) and v ``[B, H, T, Dh]``, the raw projection, and at a
        stored state dtype the state and normalizer after the last token as stored (else None)."""
        q, k, v, raw = self._split(x)
        phi = FEATURE_MAP_FNS[self.feature_map]
        q, k = phi(q), phi(k)
        if not self.normalize:
            q = q * q.shape[-1] ** -0.5
        if self.state_dtype != "fp32":
            o, state, z = linear_attention_stored_state(
                q, k, v, normalize=self.normalize, dtype=self.state_dtype, with_state=True
            )
            return self._merge(o.to(q.dtype)), k, v, raw, (state, z)
        return self._merge(causal_linear_attention(q, k, v, normalize=self.normalize)), k, v, raw, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mix(x)[0]

    def prefill(self, x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, LayerCache]:
        """x ``[B, T, d]`` → the forward's output and the state after T tokens (``capacity`` is
        the softmax mixer's; a linear-attention state does not grow); at a stored state dtype,
        the state and normalizer in that dtype, as the token-by-token forward left them."""
        out, k, v, raw, stored = self._mix(x)
        conv = self._conv_state(raw)
        if stored is not None:
            dtype = _STATE_TORCH_DTYPES[self.state_dtype]
            state, z = stored
            return out, LayerCache(conv=conv, state=state.to(dtype), z=None if z is None else z.to(dtype))
        k = k.float()
        with torch.autocast(k.device.type, enabled=False):  # the state is fp32 under autocast too
            state = k.transpose(-1, -2) @ v.float()  # [B, H, Dh, Dh]
        z = k.sum(2) if self.normalize else None  # [B, H, Dh]
        return out, LayerCache(conv=conv, state=state, z=z)

    def step(self, x: torch.Tensor, cache: LayerCache, position: int) -> torch.Tensor:
        """x ``[B, d]`` → ``[B, d]``: S += φ(k)vᵀ, z += φ(k), o = φ(q)·S [/ (φ(q)·z + EPS)] (on a
        bf16 state, each sum rounded where it is stored: ``stored_state_step``).
        ``position`` is unused (no positions in linear attention); the signature is the mixers'."""
        q, k, v = self._split_step(x, cache.conv)  # [B, H, Dh]
        if cache.state.dtype != torch.float32:
            o = stored_state_step(q, k, v, cache.state, cache.z, feature_map=self.feature_map)
            return self.out(o.to(q.dtype))
        # the identity map keeps no z; the reference step sums one regardless, into scratch here
        z = cache.z if cache.z is not None else cache.state.new_zeros(cache.state.shape[:-1])
        o = linear_attention_step(q, k, v, cache.state, z, feature_map=self.feature_map)  # [B, H·Dh] fp32
        return self.out(o.to(q.dtype))
