"""Softmax attention in fp32 torch, written out step by step: the contract the kernel must meet."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rope", "attention"]


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + D/2) of ``x [B, H, T, D]`` by ``cos, sin [>= T, D/2]``."""
    T, half = x.shape[2], x.shape[3] // 2
    c, s = cos[:T].float(), sin[:T].float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    rope_tables: tuple[Tensor, Tensor] | None = None,
    scale: float | None = None,
) -> Tensor:
    """q, k, v ``[B, H, T, D]`` (any float dtype) → ``[B, T, H·D]`` fp32.

    softmax over keys of q·kᵀ·scale, keys after the query masked out when ``causal``.
    """
    B, H, T, D = q.shape
    q, k, v = q.float(), k.float(), v.float()
    if rope_tables is not None:
        q, k = rope(q, *rope_tables), rope(k, *rope_tables)
    scores = (q @ k.transpose(-1, -2)) * (D**-0.5 if scale is None else scale)  # [B, H, T, T]
    if causal:
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    out = scores.softmax(dim=-1) @ v  # [B, H, T, D]
    return out.transpose(1, 2).reshape(B, T, H * D)


def rope_at(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """``rope`` of one token per sequence: ``x [B, H, D]`` rotated at ``positions [B]`` → fp32 ``[B, H, D]``."""
    rows = [rope(x[b, :, None][None], cos[p:], sin[p:]) for b, p in enumerate(positions.tolist())]
    return torch.cat(rows)[:, :, 0]


def decode_attention_ref(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, positions: Tensor, scale: float | None = None
) -> Tensor:
    """q ``[B, H, D]`` over cache rows 0..positions[b] of ``[B, H, C, D]`` → fp32 ``[B, H·D]``:
    softmax(q·kᵀ·scale)·v per sequence; rows past a position are never touched."""
    B, H, D = q.shape
    out = []
    for b, p in enumerate(positions.tolist()):
        k, v = k_cache[b, :, : p + 1].float(), v_cache[b, :, : p + 1].float()  # [H, n, D]
        scores = (k @ q[b].float()[:, :, None])[..., 0] * (D**-0.5 if scale is None else scale)  # [H, n]
        out.append((scores.softmax(-1)[:, None] @ v).reshape(H * D))
    return torch.stack(out)
