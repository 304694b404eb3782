"""``TritonModel``: a HybridModel's forward on the library's fused kernels (``kernels/``).

Per block: norm → qkv linear (+bias) → short causal conv → attention (RoPE fused) or causal
linear attention (feature map fused) → out linear with the residual add in its epilogue; then
norm → MLP up with the activation in its epilogue → MLP down with the residual add. Only the
embedding gather and reshapes run in torch. Each norm (and the final one) is folded into the
linear after it (``fold_norms``, the default): its scale and shift go into that linear's weight
and bias once, at construction (``kernels.linear.reference.fold_norm``), and the linear
normalises its input rows itself (``linear(..., norm=)``: inside the fused kernel's main loop,
one launch fewer per norm, where ``kernels.linear.configs.norm_in_kernel`` says so; elsewhere a
unit-affine norm launch before the linear's route). The decoder runs the same unit-affine norm as a
launch of its own before its row kernels. A head dim the kernels do not run (one that is not
16, 32, 64 or 128) is zero-padded to the next one they do, in the weights, once, at construction
(``_pad_weights``): the qkv projection (and short conv) write every head already padded and the
out projection reads the padded heads, so a forward makes no padding copies and gives exactly
the model's result. So are the MLP's hidden width and the readout's outputs, to a multiple of
``kernels.linear.configs.FEATURE_ALIGN`` (``_pad_hidden``, ``_pad_outputs``): no linear then
reads or writes rows the kernels cannot move as vectors, but those of the residual width d; the
logits are a view of the readout's first n_out columns. Weights are cast once to ``dtype`` at
construction (bf16 on a GPU; fp32 lets the CPU interpreter tests compare with the torch model
tightly).

Capturing the forward in a CUDA graph per input shape (``capture``) is what makes its latency
that of the kernels rather than of Python's launch overhead, which dominates small models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels._common import pdl_early
from kernels.device import is_cuda
from kernels.errors import KernelCompileError
from nas import settings
from nas.models.hybrid import HybridModel
from nas.models.mixers import rope_tables

__all__ = ["TritonModel", "to_triton"]

# Forwards (B·T) and decoding steps (B) of at most this many tokens launch their kernels with the early PDL trigger
# (``kernels._common.pdl_early``), larger ones with the wait only: on a multi-wave grid the next kernel's programs,
# resident early, crowd the SMs the grid still needs (docs/benchmarks.md, earlier experiments).
PDL_EARLY_MAX_TOKENS = 256
_ROPE_BASE_LEN = 256  # rotary tables are grown (doubled) on demand past this length


@dataclass(frozen=True)
class _Norm:
    kind: str  # "layernorm" | "rmsnorm"
    weight: torch.Tensor | None  # None: folded into the linear after it (unit scale here)
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
    padded_head_dim: int | None  # the kernel's head dim: the model's, or the next supported one (zero-padded)
    feature_map: str | None
    norm1: _Norm | None
    qkv: tuple[torch.Tensor, torch.Tensor] | None
    qkv_sums: torch.Tensor | None  # fp32 Σₖ of the qkv weight where a LayerNorm is folded into it
    conv: tuple[torch.Tensor, torch.Tensor] | None  # weight [3d, K], bias [3d]
    out: tuple[torch.Tensor, torch.Tensor] | None
    norm2: _Norm | None
    up: tuple[torch.Tensor, torch.Tensor] | None
    up_sums: torch.Tensor | None
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


def _folded(
    norm: torch.nn.Module | None, linear: torch.nn.Linear, fold: bool
) -> tuple[_Norm | None, tuple[torch.Tensor, torch.Tensor]]:
    """(the norm as run, the linear after it, both fp32): with
    ``fold``, the norm's scale and shift moved into the linear (``fold_norm``) and the norm left
    unit-affine, which the linear runs in its main loop (the decoder, as its own launch)."""
    from kernels.linear.reference import fold_norm

    w, b = linear.weight.detach().float(), linear.bias.detach().float()
    if norm is None or not fold:
        return _norm(norm, torch.float32), (w, b)
    beta = getattr(norm, "bias", None)
    w, b = fold_norm(norm.weight.detach(), None if beta is None else beta.detach(), w, b)
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
    kind = "layernorm" if isinstance(norm, torch.nn.LayerNorm) else "rmsnorm"
    return _Norm(kind, None, None, eps), (w, b)


def _sums(norm: _Norm | None, weight: torch.Tensor) -> torch.Tensor | None:
    """The cast weight's fp32 row sums where a folded LayerNorm's prologue reads them."""
    from kernels.linear.reference import weight_sums

    return weight_sums(weight) if norm is not None and norm.weight is None and norm.kind == "layernorm" else None


def _cast(pair: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return pair[0].to(dtype).contiguous(), pair[1].to(dtype).contiguous()


def _to(norm: _Norm | None, dtype: torch.dtype) -> _Norm | None:
    if norm is None:
        return None
    weight = None if norm.weight is None else norm.weight.to(dtype)
    return _Norm(norm.kind, weight, None if norm.bias is None else norm.bias.to(dtype), norm.eps)


class TritonModel:
    """tokens ``[B, T]`` int64 → logits, computed by ``kernels/``; see the module docstring."""

    def __init__(self, model: HybridModel, *, dtype: torch.dtype = torch.bfloat16, fold_norms: bool = True) -> None:
        from kernels.attention import SUPPORTED_HEAD_DIMS, padded_head_dim
        from kernels.linear import set_tma

        set_tma(settings.get().linear_tma)  # NAS_LINEAR_TMA: the app's choice, handed to the kernels
        self.arch, self.dtype, self.fold_norms = model.arch, dtype, fold_norms
        d = model.arch.d_model
        self.embed = model.embed.weight.detach().to(dtype)
        blocks = []
        for i, block in enumerate(model.blocks):
            spec = block.spec
            padded = None
            if spec.heads:
                head_dim = d // spec.heads
                padded = padded_head_dim(head_dim)
                if padded is None:
                    raise KernelCompileError(
                        f"layer {i}: head dim {head_dim} has no {spec.mixer} kernel "
                        f"(supported: {list(SUPPORTED_HEAD_DIMS)}, or an even head dim below "
                        f"{max(SUPPORTED_HEAD_DIMS)}, zero-padded)"
                    )
            mixer, mlp = block.mixer, block.mlp
            norm1 = qkv = conv = out = None
            if mixer is not None:
                norm1, qkv = _folded(block.norm1, mixer.qkv, fold_norms)
                out = _linear(mixer.out, torch.float32)
                if mixer.conv is not None:
                    conv = (mixer.conv.weight.detach()[:, 0].float(), mixer.conv.bias.detach().float())
                if padded != d // spec.heads:
                    qkv, conv, out = _pad_weights(qkv, conv, out, spec.heads, padded, spec.mixer, spec.feature_map)
                qkv, out = _cast(qkv, dtype), _cast(out, dtype)
                conv = None if conv is None else _cast(conv, dtype)
            norm2 = up = down = None
            if mlp is not None:
                norm2, up = _folded(block.norm2, block.mlp_up, fold_norms)
                up, down = _pad_hidden(up, _linear(block.mlp_down, torch.float32))
                up, down = _cast(up, dtype), _cast(down, dtype)
            norm1, norm2 = _to(norm1, dtype), _to(norm2, dtype)
            blocks.append(
                _Block(
                    spec.mixer,
                    spec.heads,
                    padded,
                    spec.feature_map,
                    norm1,
                    qkv,
                    None if qkv is None else _sums(norm1, qkv[0]),
                    conv,
                    out,
                    norm2,
                    up,
                    None if up is None else _sums(norm2, up[0]),
                    spec.activation,
                    down,
                )
            )
        self.blocks = tuple(blocks)
        final_norm, head = _folded(model.norm, model.head, fold_norms)
        self.final_norm, self.head = _to(final_norm, dtype), _cast(_pad_outputs(head), dtype)
        self.head_sums = _sums(self.final_norm, self.head[0])
        self._rope: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (D, padded D) → cos, sin
        self._retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # outgrown tables, kept alive for old graphs

    def _rope_tables(self, T: int, D: int, P: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[≥ T, P/2]`` for head dim D run as P (see ``_pad_heads``): the model's
        frequencies in the first D/2 columns, the identity rotation (cos 1, sin 0) after them."""
        cached = self._rope.get((D, P))
        if cached is None or cached[0].shape[0] < T or cached[0].device != device:
            length = max(_ROPE_BASE_LEN, 1 << (T - 1).bit_length())
            cos, sin = rope_tables(length, D, device=device, dtype=torch.float32)
            if P != D:
                cos = F.pad(cos, (0, (P - D) // 2), value=1.0)
                sin = F.pad(sin, (0, (P - D) // 2), value=0.0)
            if (D, P) in self._rope:  # graphs captured at a shorter T still read the old tables
                self._retired.append(self._rope[(D, P)])
            cached = self._rope[(D, P)] = (cos.contiguous(), sin.contiguous())
        return cached

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens ``[B, T]`` → logits ``[B, T, n_out]`` (readout "token") or ``[B, n_out]``, in ``dtype``."""
        with pdl_early(tokens.numel() <= PDL_EARLY_MAX_TOKENS):
            return self._forward(tokens)

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from kernels.attention.triton import flash_attention_qkv
        from kernels.conv import causal_depthwise_conv
        from kernels.linear import linear
        from kernels.linear_attention.triton import linear_attention_qkv

        B, T = tokens.shape
        d = self.arch.d_model
        h = F.embedding(tokens, self.embed).view(B * T, d)  # residual stream [M, d]
        for blk in self.blocks:
            if blk.qkv is not None:
                qkv = _normed_linear(h, blk.norm1, blk.qkv, blk.qkv_sums).view(B, T, -1)
                if blk.conv is not None:
                    qkv = causal_depthwise_conv(qkv, *blk.conv)
                D, P = d // blk.heads, blk.padded_head_dim  # qkv: [B, T, 3·H·P], heads padded
                if blk.mixer == "attention":
                    o = flash_attention_qkv(
                        qkv, blk.heads, causal=True, scale=D**-0.5, rope=self._rope_tables(T, D, P, tokens.device)
                    )
                else:
                    o = linear_attention_qkv(qkv, blk.heads, feature_map=blk.feature_map)
                h = linear(o.reshape(B * T, blk.heads * P), *blk.out, residual=h)
            if blk.up is not None:
                u = _normed_linear(h, blk.norm2, blk.up, blk.up_sums, activation=blk.activation)
                h = linear(u, *blk.down, residual=h)
        if self.arch.readout == "last":
            h = h.view(B, T, d)[:, -1]
        logits = self.logits(_normed_linear(h, self.final_norm, self.head, self.head_sums))
        return logits.view(B, T, -1) if self.arch.readout == "token" else logits

    def logits(self, padded: torch.Tensor) -> torch.Tensor:
        """The readout's ``[rows, n_out]`` of its output ``[rows, padded n_out]`` (a view)."""
        return padded[:, : self.arch.n_out]

    __call__ = forward

    def capture(self, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Record the forward on the static buffer ``tokens`` (CUDA) into a CUDA graph; returns a
        function that replays it and gives the static output. Refill ``tokens`` in place between
        replays. Kernels are compiled and autotuned by a warm-up call outside the graph."""
        if not is_cuda(tokens.device):
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


def _normed_linear(
    h: torch.Tensor,
    norm: _Norm,
    linear_: tuple[torch.Tensor, torch.Tensor],
    sums: torch.Tensor | None,
    activation: str | None = None,
) -> torch.Tensor:
    """``linear(norm(h))``: one launch where the norm is folded (its weight None), else two."""
    from kernels.linear import linear

    if norm.weight is None:
        return linear(h, *linear_, activation=activation, norm=norm.kind, norm_eps=norm.eps, weight_sums=sums)
    return linear(norm(h), *linear_, activation=activation)


def _halves(D: int, P: int) -> tuple[slice, slice, slice, slice]:
    """Where head dim D's two rotary halves sit in the padded head dim P: [0, D/2) and [P/2, P/2 + D/2),
    so the kernel's rotate-half pairing (i, i + P/2) pairs the same channels as the model's (i, i + D/2)."""
    return slice(0, D // 2), slice(D // 2, D), slice(0, D // 2), slice(P // 2, P // 2 + D // 2)


def _channels(heads: int, D: int, P: int, mixer: str) -> torch.Tensor:
    """Where each of the model's ``H·D`` head channels sits among the kernel's ``H·P``: attention's
    rotary halves at [0, D/2) and [P/2, P/2 + D/2) of its head (``_halves``), linear attention's
    at [0, D); int64 ``[H·D]``."""
    c = torch.arange(D)
    if mixer == "attention":
        c = torch.where(c < D // 2, c, c - D // 2 + P // 2)
    return (torch.arange(heads)[:, None] * P + c[None, :]).reshape(-1)


def _pad_weights(
    qkv: tuple[torch.Tensor, torch.Tensor],
    conv: tuple[torch.Tensor, torch.Tensor] | None,
    out: tuple[torch.Tensor, torch.Tensor],
    heads: int,
    P: int,
    mixer: str,
    feature_map: str | None,
) -> tuple[
    tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None, tuple[torch.Tensor, torch.Tensor]
]:
    """Head dim D = d/H run as P > D, in the weights (fp32 in, fp32 out), exactly the model's result:
    the qkv projection's rows (and the short conv's channels) move to ``_channels`` of each of q,
    k and v, the padded rows are zero, and the out projection reads those channels (zero columns
    elsewhere). Softmax attention: zero channels add 0 to q·k and to o; the caller passes the
    scale D^-1/2 and rotary tables padded with the identity. Linear attention: φ of a padded key
    channel must be 0, so for elu+1 it is −∞ (exp(−∞) = 0) through the bias of the last op before
    the mixer (the conv's, else the projection's; relu and identity: 0), and the identity map's q
    scale P^-1/2 is corrected to D^-1/2 on that op's q rows (weights and bias)."""
    (w, b), (wo, bo) = qkv, out
    d = w.shape[1]
    D = d // heads
    idx = _channels(heads, D, P, mixer)
    rows = torch.cat([s * heads * P + idx for s in range(3)])

    def spread(t: torch.Tensor) -> torch.Tensor:  # [3d, ...] → [3·H·P, ...], zeros between
        z = t.new_zeros(3 * heads * P, *t.shape[1:])
        z[rows] = t
        return z

    w, b = spread(w), spread(b)
    wc, bc = (spread(conv[0]), spread(conv[1])) if conv is not None else (None, None)
    last_w, last_b = (wc, bc) if conv is not None else (w, b)  # the op whose output the mixer reads
    if feature_map == "elu+1":
        pad_keys = torch.ones(heads * P, dtype=torch.bool)
        pad_keys[idx] = False
        last_b[heads * P : 2 * heads * P][pad_keys] = float("-inf")
    elif feature_map == "identity":
        scale = (P / D) ** 0.5
        last_w[: heads * P] *= scale
        last_b[: heads * P] *= scale
    wide = wo.new_zeros(wo.shape[0], heads * P)
    wide[:, idx] = wo
    return (w, b), (None if conv is None else (wc, bc)), (wide, bo)


def _pad_outputs(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear's (weight [N, K], bias [N]) with N zero-padded to ``padded_features(N)``."""
    from kernels.linear.configs import padded_features

    w, b = pair
    extra = padded_features(w.shape[0]) - w.shape[0]
    return F.pad(w, (0, 0, 0, extra)), F.pad(b, (0, extra))


def _pad_hidden(
    up: tuple[torch.Tensor, torch.Tensor], down: tuple[torch.Tensor, torch.Tensor]
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The MLP's hidden width zero-padded to ``padded_features``: up's extra outputs are
    act(0 + 0) and down reads them through zero columns, so the result is the model's."""
    up = _pad_outputs(up)
    extra = up[0].shape[0] - down[0].shape[1]
    return up, (F.pad(down[0], (0, extra)), down[1])


def to_triton(model: HybridModel, *, dtype: torch.dtype = torch.bfloat16, fold_norms: bool = True) -> TritonModel:
    """The kernels-only forward of ``model`` (weights cast once to ``dtype``; ``fold_norms``:
    each norm run inside the linear after it, see ``TritonModel``)."""
    return TritonModel(model, dtype=dtype, fold_norms=fold_norms)
