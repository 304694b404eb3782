"""Token mixers in plain torch: the training path and the reference the Triton model must match."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.linear_attention.reference import CHUNK as LINEAR_ATTENTION_CHUNK
from kernels.linear_attention.reference import EPS as NORMALIZER_EPS
from kernels.linear_attention.reference import FEATURE_MAP_FNS

__all__ = ["FEATURE_MAP_FNS", "LinearAttention", "SelfAttention", "causal_depthwise_conv", "causal_linear_attention"]


def causal_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, normalize: bool, chunk: int = LINEAR_ATTENTION_CHUNK
) -> torch.Tensor:
    """Causal linear attention in chunked form, O(T·C·D + T·D²) instead of O(T²·D).

    q, k, v: ``[B, H, T, D]`` with the feature map already applied to q and k.
    o_t = φ(q_t)·S_t, S_t = Σ_{s≤t} φ(k_s) v_sᵀ; with ``normalize`` divided by φ(q_t)·Σ_{s≤t} φ(k_s)
    (Katharopoulos et al. 2020, eq. 5). Within a chunk the causal part is a masked matmul; across
    chunks a running state carries the prefix sums.
    """
    B, H, T, D = q.shape
    chunk = min(chunk, T)  # a sequence shorter than a chunk is one chunk: no padding to compute
    pad = (-T) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    n = (T + pad) // chunk
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

    x ``[B, T, C]``, weight ``[C, 1, K]`` (an ``nn.Conv1d`` with ``groups=C``), bias ``[C]``. The
    same as that convolution with K-1 zeros of left padding, computed as K shifted multiply-adds
    in x's own layout: for the short kernels of a mixer (K ≤ 8) this avoids two transposes and
    the CPU's depthwise-convolution backward, the slowest op of a small candidate's step.
    """
    K, T = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, K - 1, 0))  # [B, T + K - 1, C]
    taps = weight[:, 0, :].t()  # [K, C]
    out = bias + padded[:, :T] * taps[0]
    for j in range(1, K):
        out = out + padded[:, j : j + T] * taps[j]
    return out


def rope_tables(T: int, D: int, *, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables (Su et al. 2021), cos and sin ``[T, D//2]``, base 10000."""
    inv = 10000.0 ** (-torch.arange(0, D - D % 2, 2, device=device, dtype=torch.float32) / D)
    ang = torch.arange(T, device=device, dtype=torch.float32).unsqueeze(1) * inv
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
    over the 3d projected channels, and the output ``Linear(d, d)``, all with bias."""

    def __init__(self, d_model: int, heads: int, short_conv: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.conv = (
            nn.Conv1d(3 * d_model, 3 * d_model, short_conv, groups=3 * d_model, padding=short_conv - 1)
            if short_conv
            else None
        )
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        qkv = self.qkv(x)  # [B, T, 3d]
        if self.conv is not None:
            qkv = causal_depthwise_conv(qkv, self.conv.weight, self.conv.bias)
        qkv = qkv.view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # [3, B, H, T, Dh]
        return qkv[0], qkv[1], qkv[2]

    def _merge(self, o: torch.Tensor) -> torch.Tensor:
        B, H, T, Dh = o.shape
        return self.out(o.transpose(1, 2).reshape(B, T, H * Dh))


class SelfAttention(_HeadsMixer):
    """Causal multi-head softmax attention with rotary positions. x ``[B, T, d]`` → ``[B, T, d]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        cos, sin = rope_tables(q.shape[2], q.shape[3], device=q.device, dtype=q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self._merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class LinearAttention(_HeadsMixer):
    """Causal multi-head linear attention with feature map φ. x ``[B, T, d]`` → ``[B, T, d]``.

    Positive feature maps (elu+1, relu) are normalized as in Katharopoulos et al. 2020; the
    identity map can make the normalizer vanish, so it is left unnormalized and q is scaled
    by D^-1/2 instead, as in fla's ``chunk_linear_attn``.
    """

    def __init__(self, d_model: int, heads: int, feature_map: str, short_conv: int) -> None:
        super().__init__(d_model, heads, short_conv)
        self.feature_map = feature_map
        self.normalize = feature_map != "identity"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        phi = FEATURE_MAP_FNS[self.feature_map]
        q, k = phi(q), phi(k)
        if not self.normalize:
            q = q * q.shape[-1] ** -0.5
        return self._merge(causal_linear_attention(q, k, v, normalize=self.normalize))
