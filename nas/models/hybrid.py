"""``HybridModel``: embedding, pre-norm residual blocks (mixer + MLP), final norm, head; and
token-by-token decoding (``prefill`` a prompt, then ``step``) over a ``DecodeCache``.

``stored_precision()`` switches the forward and decoding to the architecture's precision fields:
KV cache, recurrent state and linear-layer weights rounded as they would be stored
(``nas.models.precision``); training runs at the model's own precision."""

from __future__ import annotations

import math

import torch
from torch import nn

from nas.models.decode import DecodeCache, LayerCache
from nas.models.mixers import LinearAttention, SelfAttention
from nas.models.precision import StoredLinear
from nas.spec import ArchSpec, LayerSpec

__all__ = ["HybridModel", "Block"]

_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}


def _norm(kind: str, d: int) -> nn.Module:
    return nn.LayerNorm(d) if kind == "layernorm" else nn.RMSNorm(d, eps=1e-5)


class Block(nn.Module):
    """``x + mixer(norm1(x))`` then ``x + mlp(norm2(x))``; parts absent from the spec are absent here
    (no norm before a missing mixer or MLP), which is the convention ``count_params`` follows."""

    def __init__(self, d_model: int, spec: LayerSpec) -> None:
        super().__init__()
        self.spec = spec
        self.mixer: nn.Module | None = None
        if spec.mixer == "attention":
            self.mixer = SelfAttention(d_model, spec.heads, spec.short_conv)
        elif spec.mixer == "linear_attention":
            self.mixer = LinearAttention(d_model, spec.heads, spec.feature_map, spec.short_conv)
        self.norm1 = _norm(spec.norm, d_model) if self.mixer is not None else None
        self.mlp: nn.Sequential | None = None
        if spec.mlp_ratio > 0:
            hidden = max(1, round(spec.mlp_ratio * d_model))
            self.mlp = nn.Sequential(
                StoredLinear(d_model, hidden), _ACTIVATIONS[spec.activation](), StoredLinear(hidden, d_model)
            )
        self.norm2 = _norm(spec.norm, d_model) if self.mlp is not None else None

    # The block's layout, named in one place: the torch init and ``to_triton`` address the
    # sub-modules through these (the state-dict names "mlp.0" / "mlp.2" stay, so stored weights load).
    @property
    def mlp_up(self) -> nn.Linear | None:
        """``[.., d] -> [.., hidden]``, followed by the activation."""
        return self.mlp[0] if self.mlp is not None else None

    @property
    def mlp_down(self) -> nn.Linear | None:
        """``[.., hidden] -> [.., d]``, added into the residual stream."""
        return self.mlp[2] if self.mlp is not None else None

    def residual_projections(self) -> list[nn.Linear]:
        """The projections whose output is added into the residual stream (mixer out, MLP down)."""
        return [m for m in (self.mixer.out if self.mixer is not None else None, self.mlp_down) if m is not None]

    def linears(self) -> list[StoredLinear]:
        """The block's linear layers, whose weights its ``weight_dtype`` stores."""
        mixer = list(self.mixer.linears()) if self.mixer is not None else []
        return mixer + [m for m in (self.mlp_up, self.mlp_down) if m is not None]

    def stored_precision(self, on: bool) -> None:
        """Round what the block's precision fields narrow (``on``), or nothing (off)."""
        spec = self.spec
        if isinstance(self.mixer, SelfAttention):
            self.mixer.kv_fp8 = on and spec.kv_dtype == "fp8"
        if isinstance(self.mixer, LinearAttention):
            self.mixer.state_dtype = spec.state_dtype if on else "fp32"
        for linear in self.linears():
            linear.fp8 = on and spec.weight_dtype == "fp8"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mixer is not None:
            x = x + self.mixer(self.norm1(x))
        return self._mlp(x)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm2(x)) if self.mlp is not None else x

    def prefill(self, x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, LayerCache]:
        """x ``[B, T, d]`` → the forward's output and the block's cache (empty without a mixer)."""
        if self.mixer is None:
            return self._mlp(x), LayerCache()
        out, cache = self.mixer.prefill(self.norm1(x), capacity)
        return self._mlp(x + out), cache

    def step(self, x: torch.Tensor, cache: LayerCache, position: int) -> torch.Tensor:
        """x ``[B, d]`` of the token at ``position`` → ``[B, d]``; advances ``cache`` in place."""
        if self.mixer is not None:
            x = x + self.mixer.step(self.norm1(x), cache, position)
        return self._mlp(x)


class HybridModel(nn.Module):
    """tokens ``[B, T]`` int64 → logits ``[B, T, n_out]`` (readout "token") or ``[B, n_out]`` ("last")."""

    def __init__(self, arch: ArchSpec) -> None:
        super().__init__()
        self.arch = arch
        self.at_stored_precision = False
        self.embed = nn.Embedding(arch.vocab_size, arch.d_model)
        self.blocks = nn.ModuleList(Block(arch.d_model, layer) for layer in arch.layers)
        self.norm = _norm(arch.layers[-1].norm, arch.d_model)
        self.head = nn.Linear(arch.d_model, arch.n_out)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02) for projections, residual outputs scaled by 1/sqrt(2·depth).
        residual = {id(m.weight) for block in self.blocks for m in block.residual_projections()}
        for name, p in self.named_parameters():
            if p.dim() == 2 and not name.startswith("embed"):
                std = 0.02 / math.sqrt(2 * len(self.blocks)) if id(p) in residual else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def stored_precision(self, on: bool = True) -> HybridModel:
        """Make the forward compute (``on``) as a deployment storing the KV cache, recurrent state
        and linear-layer weights at the architecture's precision fields would: each rounded where
        it is stored (``nas.models.precision``), the rest of the math unchanged; or (off, the
        default) at the model's own precision. The parameters are never changed. Returns the model.
        At full precision (every field at its default) nothing is rounded either way."""
        for block in self.blocks:
            block.stored_precision(on)
        self.at_stored_precision = on
        return self

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # [B, T, d]
        for block in self.blocks:
            x = block(x)
        if self.arch.readout == "last":
            x = x[:, -1]
        return self.head(self.norm(x))

    def _check_generates(self, op: str) -> None:
        if self.arch.readout != "token":
            raise ValueError(
                f"{op}: readout {self.arch.readout!r} gives one output per sequence; decoding needs readout 'token'"
            )

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, capacity: int | None = None) -> tuple[torch.Tensor, DecodeCache]:
        """tokens ``[B, T]`` int64 → logits ``[B, T, n_out]`` (the forward's) and a cache ready
        for ``step``, with room for ``capacity`` (default T, at least T) tokens in all."""
        self._check_generates("prefill")
        if tokens.dim() != 2 or tokens.shape[1] < 1:
            raise ValueError(f"prefill: tokens must be [B, T] with T >= 1, got {tuple(tokens.shape)}")
        T = tokens.shape[1]
        capacity = T if capacity is None else capacity
        if capacity < T:
            raise ValueError(f"prefill: capacity must be >= the prompt's {T} tokens, got {capacity}")
        x = self.embed(tokens)  # [B, T, d]
        layers = []
        for block in self.blocks:
            x, cache = block.prefill(x, capacity)
            layers.append(cache)
        return self.head(self.norm(x)), DecodeCache(layers, T, capacity)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
        """tokens ``[B]`` int64, the next token of each sequence → logits ``[B, n_out]``;
        ``cache`` advances by one token in place."""
        self._check_generates("step")
        if tokens.dim() != 1:
            raise ValueError(f"step: tokens must be [B], got {tuple(tokens.shape)}")
        if cache.length >= cache.capacity:
            raise ValueError(
                f"step: the cache is full (capacity {cache.capacity} tokens); prefill with a larger capacity"
            )
        x = self.embed(tokens)  # [B, d]
        for block, layer in zip(self.blocks, cache.layers, strict=True):
            x = block.step(x, layer, cache.length)
        cache.length += 1
        return self.head(self.norm(x))
