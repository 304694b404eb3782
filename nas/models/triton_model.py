"""``TritonModel``: a HybridModel's forward on the library's fused kernels (``kernels/``).

Per block: norm → qkv linear (+bias) → short causal conv → attention (RoPE fused) or causal
linear attention (feature map fused) → out linear with the residual add in its epilogue; then
norm → MLP up with the activation in its epilogue → MLP down with the residual add. Only the
embedding gather and reshapes run in torch. Weights are cast once to ``dtype`` at construction
(bf16 on a GPU; fp32 lets the CPU interpreter tests compare with the torch model tightly).

Capturing the forward in a CUDA graph per input shape (``capture``) is what makes its latency
that of the kernels rather than of Python (issue: eager ~911 µs vs ~99 µs replayed, d128×4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nas.latency import KernelCompileError
from nas.models.hybrid import HybridModel
from nas.models.mixers import rope_tables

__all__ = ["TritonModel", "to_triton"]

_ROPE_BASE_LEN = 256  # rotary tables are grown (doubled) on demand past this length


@dataclass(frozen=True)
class _Norm:
    kind: str  # "layernorm" | "rmsnorm"
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from kernels.norm import layer_norm, rms_norm

        if self.kind == "layernorm":
            return layer_norm(x, self.weight, self.bias, self.eps)
        return rms_norm(x, self.weight, self.eps)


@dataclass(frozen=True)
class _Block:
    mixer: str
    heads: int
    feature_map: str | None
    norm1: _Norm | None
    qkv: tuple[torch.Tensor, torch.Tensor] | None
    conv: tuple[torch.Tensor, torch.Tensor] | None  # weight [3d, K], bias [3d]
    out: tuple[torch.Tensor, torch.Tensor] | None
    norm2: _Norm | None
    up: tuple[torch.Tensor, torch.Tensor] | None
    activation: str
    down: tuple[torch.Tensor, torch.Tensor] | None


def _norm(module: torch.nn.Module | None, dtype: torch.dtype) -> _Norm | None:
    if module is None:
        return None
    kind = "layernorm" if isinstance(module, torch.nn.LayerNorm) else "rmsnorm"
    bias = getattr(module, "bias", None)
    eps = module.eps if module.eps is not None else torch.finfo(torch.float32).eps
    return _Norm(kind, module.weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype), eps)


def _linear(module: torch.nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return module.weight.detach().to(dtype), module.bias.detach().to(dtype)


class TritonModel:
    """tokens ``[B, T]`` int64 → logits, computed by ``kernels/``; see the module docstring."""

    def __init__(self, model: HybridModel, *, dtype: torch.dtype = torch.bfloat16) -> None:
        from kernels.attention import SUPPORTED_HEAD_DIMS as ATTN_DIMS
        from kernels.linear_attention import SUPPORTED_HEAD_DIMS as LIN_DIMS

        self.arch, self.dtype = model.arch, dtype
        d = model.arch.d_model
        self.embed = model.embed.weight.detach().to(dtype)
        blocks = []
        for i, block in enumerate(model.blocks):
            spec = block.spec
            if spec.heads:
                supported = ATTN_DIMS if spec.mixer == "attention" else LIN_DIMS
                if d // spec.heads not in supported:
                    raise KernelCompileError(f"layer {i}: head dim {d // spec.heads} has no {spec.mixer} kernel "
                                             f"(supported: {list(supported)})")
            mixer, mlp = block.mixer, block.mlp
            conv = None
            if mixer is not None and mixer.conv is not None:
                conv = (mixer.conv.weight.detach()[:, 0].to(dtype), mixer.conv.bias.detach().to(dtype))
            blocks.append(_Block(
                spec.mixer, spec.heads, spec.feature_map, _norm(block.norm1, dtype),
                _linear(mixer.qkv, dtype) if mixer is not None else None, conv,
                _linear(mixer.out, dtype) if mixer is not None else None, _norm(block.norm2, dtype),
                _linear(mlp[0], dtype) if mlp is not None else None, spec.activation,
                _linear(mlp[2], dtype) if mlp is not None else None))
        self.blocks = tuple(blocks)
        self.final_norm = _norm(model.norm, dtype)
        self.head = _linear(model.head, dtype)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def _rope_tables(self, T: int, D: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].shape[0] < T or self._rope[0].device != device:
            length = max(_ROPE_BASE_LEN, 1 << (T - 1).bit_length())
            self._rope = rope_tables(length, D, device=device, dtype=torch.float32)
        return self._rope

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens ``[B, T]`` → logits ``[B, T, n_out]`` (readout "token") or ``[B, n_out]``, in ``dtype``."""
        from kernels.attention.triton import flash_attention_qkv
        from kernels.conv import causal_depthwise_conv
        from kernels.linear import linear
        from kernels.linear_attention.triton import linear_attention_qkv

        B, T = tokens.shape
        d = self.arch.d_model
        h = F.embedding(tokens, self.embed).view(B * T, d)  # residual stream [M, d]
        for blk in self.blocks:
            if blk.qkv is not None:
                qkv = linear(blk.norm1(h), *blk.qkv).view(B, T, 3 * d)
                if blk.conv is not None:
                    qkv = causal_depthwise_conv(qkv, *blk.conv)
                if blk.mixer == "attention":
                    o = flash_attention_qkv(qkv, blk.heads, causal=True,
                                            rope=self._rope_tables(T, d // blk.heads, tokens.device))
                else:
                    o = linear_attention_qkv(qkv, blk.heads, feature_map=blk.feature_map)
                h = linear(o.view(B * T, d), *blk.out, residual=h)
            if blk.up is not None:
                u = linear(blk.norm2(h), *blk.up, activation=blk.activation)
                h = linear(u, *blk.down, residual=h)
        if self.arch.readout == "last":
            h = h.view(B, T, d)[:, -1]
        logits = linear(self.final_norm(h), *self.head)
        return logits.view(B, T, -1) if self.arch.readout == "token" else logits

    __call__ = forward

    def capture(self, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Record the forward on the static buffer ``tokens`` (CUDA) into a CUDA graph; returns a
        function that replays it and gives the static output. Refill ``tokens`` in place between
        replays. Kernels are compiled and autotuned by a warm-up call outside the graph."""
        if tokens.device.type != "cuda":
            raise ValueError("capture needs tokens on a CUDA device")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.forward(tokens)  # compile, autotune, grow the rotary tables
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.forward(tokens)

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


def to_triton(model: HybridModel, *, dtype: torch.dtype = torch.bfloat16) -> TritonModel:
    """The kernels-only forward of ``model`` (weights cast once to ``dtype``)."""
    return TritonModel(model, dtype=dtype)
