"""Causal linear attention in fp32 torch, in its plainest forms: the contract the kernels meet.

``linear_attention`` is the quadratic form (masked φ(q)·φ(k)ᵀ scores times v), ``step`` the
recurrence one token at a time; both equal the chunked form ``nas.models.mixers`` trains with.
The op's constants live here, once: the feature maps φ, the normalizer's EPS and the chunk
length CHUNK of the chunked forms (the model's and the GPU tilings').
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CHUNK", "EPS", "FEATURE_MAPS", "FEATURE_MAP_FNS", "feature", "normalizes", "linear_attention", "step"]

FEATURE_MAP_FNS = {  # φ by name, in x's dtype
    "identity": lambda x: x,
    "elu+1": lambda x: F.elu(x) + 1.0,
    "relu": F.relu,
}
FEATURE_MAPS = tuple(FEATURE_MAP_FNS)
EPS = 1e-6  # added to the normalizer φ(q)·z
CHUNK = 64  # tokens per chunk of the chunked forms, as fla's chunk kernels


def feature(x: Tensor, feature_map: str) -> Tensor:
    """φ(x) in fp32; the identity map also takes q's D^-1/2 scale where it is applied (see below)."""
    return FEATURE_MAP_FNS[feature_map](x.float())


def normalizes(feature_map: str) -> bool:
    """Whether outputs are divided by φ(q)·z + EPS: yes for the positive maps (elu+1, relu); the
    identity map can make that normalizer vanish, so it is left unnormalized and q is scaled by
    D^-1/2 instead, as in fla's ``chunk_linear_attn``."""
    return feature_map != "identity"


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, feature_map: str) -> Tensor:
    """q, k, v ``[B, H, T, D]`` raw projections → ``[B, T, H·D]`` fp32.

    o_t = Σ_{s≤t} (φq_t·φk_s) v_s, divided by Σ_{s≤t} φq_t·φk_s + EPS for elu+1 and relu;
    the identity map is unnormalized with q scaled by D^-1/2.
    """
    B, H, T, D = q.shape
    qf, kf = feature(q, feature_map), feature(k, feature_map)
    if not normalizes(feature_map):
        qf = qf * D**-0.5
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (qf @ kf.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, H, T, T]
    out = scores @ v.float()
    if normalizes(feature_map):
        out = out / (scores.sum(-1, keepdim=True) + EPS)
    return out.transpose(1, 2).reshape(B, T, H * D)


def step(q: Tensor, k: Tensor, v: Tensor, state: Tensor, z: Tensor, *, feature_map: str) -> Tensor:
    """One token: q, k, v ``[B, H, D]``; state ``[B, H, D, D]`` and z ``[B, H, D]`` fp32 updated
    in place (S += φ(k)vᵀ, z += φ(k)); returns o ``[B, H·D]`` fp32 = φ(q)·S [/ (φ(q)·z + EPS)]."""
    B, H, D = q.shape
    qf, kf = feature(q, feature_map), feature(k, feature_map)
    if not normalizes(feature_map):
        qf = qf * D**-0.5
    state += kf.unsqueeze(-1) * v.float().unsqueeze(-2)
    z += kf
    out = (qf.unsqueeze(-1) * state).sum(-2)  # [B, H, D]
    if normalizes(feature_map):
        out = out / ((qf * z).sum(-1, keepdim=True) + EPS)
    return out.reshape(B, H * D)
