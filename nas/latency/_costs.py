"""What one inference forward does, op by op: FLOPs, HBM bytes, kernel launches, live memory.

The model (see ``nas.spec``): token embedding ``[V, d]`` plus computed sinusoidal positions;
per layer ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``; final norm; head ``Linear(d, n_out)``
at every position (readout ``token``) or the last one (``last``).

Conventions (the model builder matches these; ``count_params`` checks it):
- a layer has one norm before the mixer if ``mixer != "none"`` and one before the MLP if
  ``mlp_ratio > 0``; a layer with neither has no norm and no parameters. LayerNorm has
  weight and bias (2·d), RMSNorm a weight (d). The final norm has the type of the last layer's.
- mixer ``attention`` and ``linear_attention``: fused QKV ``Linear(d, 3d)`` + bias and output
  ``Linear(d, d)`` + bias; the feature map has no parameters.
- MLP: ``Linear(d, H)`` + bias, activation, ``Linear(H, d)`` + bias with ``H = max(1, round(r·d))``
  (Python's ``round``; a tiny positive ratio still gives one hidden unit, never an empty matmul).
- head ``Linear(d, n_out)`` + bias; no weight tying; positions have no parameters.

Kernels, as a fused implementation launches them: embedding (gather + positions) 1; per layer
mixer norm, QKV linear, attention / linear attention (feature map fused), out linear (+bias
+residual); MLP norm, up linear (+bias +activation), down linear (+bias +residual) — 7 for a
full layer; final norm 1; head 1. Only the rows the head reads go through the final norm. A
nominal count: TritonModel folds each norm into the linear after it, which at short K and few
rows runs it in its own main loop (no launch; ``nas.latency._launches`` follows the route).

FLOPs: matmuls count 2·M·N·K (epilogues are free: their cost is the bytes they move);
elementwise ops count a few FLOPs per element on the vector units. Bytes: each op reads its
inputs and weights once from HBM and writes its output once (ideal reuse through SRAM/L2).
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_profiles import DTYPES
from nas.spec import KV_DTYPES, WEIGHT_DTYPES, ArchSpec, LayerSpec

from ._shape import LatencyShape

__all__ = [
    "DTYPE_BYTES",
    "LINEAR_ATTENTION_CHUNK",
    "PRECISION_BYTES",
    "SCALE_BYTES",
    "OpCost",
    "count_params",
    "kv_bytes",
    "kv_scale_bytes",
    "mlp_hidden",
    "op_costs",
    "state_bytes",
    "weight_bytes",
]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
from kernels.attention import padded_head_dim  # noqa: E402 (the kernels' head-dim rule)
from kernels.linear_attention.reference import CHUNK as LINEAR_ATTENTION_CHUNK  # noqa: E402 (the kernel's chunk length)

_ID_BYTES = 8  # int64 token ids
_NORM_FLOPS = {"layernorm": 8, "rmsnorm": 5}  # per element: reduce, centre/scale, affine


@dataclass(frozen=True)
class OpCost:
    """One fused op of the forward. ``matmul`` ops run on tensor cores at the dtype's peak,
    the others on the vector units (fp32 peak). ``live_bytes``: activation bytes alive while
    it runs (its inputs, outputs and the residual stream)."""

    name: str
    flops: int
    bytes: int
    kernels: int
    matmul: bool
    live_bytes: int


def mlp_hidden(layer: LayerSpec, d_model: int) -> int:
    """Hidden width ``H = max(1, round(mlp_ratio · d_model))``; 0 when the layer has no MLP."""
    return max(1, round(layer.mlp_ratio * d_model)) if layer.mlp_ratio > 0 else 0


# Bytes per element of the precision fields' dtypes (``nas.spec``), and of the fp32 scale kept per
# group of fp8 values (``nas.models.precision``: one per sequence and head of a KV cache, one per
# output channel of a weight)
PRECISION_BYTES = {"fp8": 1, "bf16": 2, "fp32": 4}
SCALE_BYTES = 4


def kv_bytes(layer: LayerSpec, size: int) -> int:
    """Bytes per element of an attention layer's KV cache: ``size`` (the run's dtype, as the
    kernels store it) at the default ``kv_dtype``, else that dtype's."""
    return size if layer.kv_dtype == KV_DTYPES[0] else PRECISION_BYTES[layer.kv_dtype]


def kv_scale_bytes(layer: LayerSpec) -> int:
    """Bytes of one sequence's fp8 KV scales in an attention layer: one fp32 scale per head for K
    and one for V (0 at the default ``kv_dtype``)."""
    return 0 if layer.kv_dtype == KV_DTYPES[0] else 2 * layer.heads * SCALE_BYTES


def state_bytes(layer: LayerSpec) -> int:
    """Bytes per element of a linear-attention layer's state and normalizer (fp32 by default)."""
    return PRECISION_BYTES[layer.state_dtype]


def _linear_weights(layer: LayerSpec, d: int) -> tuple[int, int]:
    """(weight elements, output channels) of a block's linear layers: QKV and out for a mixer,
    up and down for an MLP (their biases are not weights a ``weight_dtype`` stores)."""
    elements = channels = 0
    if layer.mixer != "none":
        elements, channels = 4 * d * d, 4 * d
    if hidden := mlp_hidden(layer, d):
        elements, channels = elements + 2 * d * hidden, channels + hidden + d
    return elements, channels


def weight_bytes(arch: ArchSpec, size: int) -> int:
    """Bytes of ``arch``'s parameters at ``size`` bytes each, except the linear weights of a block
    whose ``weight_dtype`` is narrower: at that dtype's bytes, plus one fp32 scale per output
    channel. Equal to ``count_params(arch) · size`` at full precision."""
    total = count_params(arch) * size
    for layer in arch.layers:
        if layer.weight_dtype != WEIGHT_DTYPES[0]:
            elements, channels = _linear_weights(layer, arch.d_model)
            total += elements * (PRECISION_BYTES[layer.weight_dtype] - size) + channels * SCALE_BYTES
    return total


def _norm_params(norm: str, d: int) -> int:
    return 2 * d if norm == "layernorm" else d


def count_params(arch: ArchSpec) -> int:
    """Number of parameters of the torch model, by the conventions in the module docstring."""
    d = arch.d_model
    total = arch.vocab_size * d
    for layer in arch.layers:
        if layer.mixer != "none":
            total += _norm_params(layer.norm, d) + (3 * d * d + 3 * d) + (d * d + d)
            total += 3 * d * (layer.short_conv + 1) if layer.short_conv else 0
        if layer.mlp_ratio > 0:
            hidden = mlp_hidden(layer, d)
            total += _norm_params(layer.norm, d) + (d * hidden + hidden) + (hidden * d + d)
    final_norm = arch.layers[-1].norm
    return total + _norm_params(final_norm, d) + d * arch.n_out + arch.n_out


def _linear(name: str, rows: int, n_in: int, n_out: int, size: int, *, residual: bool, live: int) -> OpCost:
    """``y[rows, n_out] = x[rows, n_in] @ W[n_in, n_out] + b`` (+ residual[rows, n_out]):
    reads x, W, b (and the residual), writes y."""
    reads = rows * n_in + n_in * n_out + n_out + (rows * n_out if residual else 0)
    return OpCost(name, 2 * rows * n_in * n_out, size * (reads + rows * n_out), 1, True, live)


def _norm(name: str, norm: str, rows: int, d: int, size: int, *, live: int) -> OpCost:
    """Reads x[rows, d] and the affine parameters, writes y[rows, d]."""
    return OpCost(name, _NORM_FLOPS[norm] * rows * d, size * (2 * rows * d + _norm_params(norm, d)), 1, False, live)


def _attention(name: str, batch: int, seq: int, d: int, size: int, *, live: int) -> OpCost:
    """Causal flash attention over all heads: q,k,v ``[B, H, T, Dh]`` -> o ``[B, T, H·Dh]``.

    Per head the T(T+1)/2 unmasked (query, key) pairs each cost 2·Dh for QKᵀ and 2·Dh for PV,
    so FLOPs are 4·B·pairs·d (softmax exps not counted). Reads q, k, v, writes o; the T×T
    scores never leave SRAM. Live while it runs: the residual stream, q, k, v, o and, on the
    SDPA route (``kernels.attention.configs.prefers_sdpa``), the rotated q and k: 7 streams,
    counted on every device so the memory objective stays an upper bound whatever the route.
    """
    pairs = seq * (seq + 1) // 2
    return OpCost(name, 4 * batch * pairs * d, size * 4 * batch * seq * d, 1, True, live)


def _linear_attention(name: str, batch: int, seq: int, d: int, heads: int, size: int, *, live: int) -> OpCost:
    """Chunked causal linear attention, one kernel keeping the ``[Dh, Dh]`` state per head in SRAM.

    Per head and chunk of length c: intra-chunk ``(QKᵀ ⊙ mask) V`` computes the full c×c block,
    4·c²·Dh; inter-chunk ``Q S`` and the state update ``S += Kᵀ V`` cost 4·c·Dh². Over the
    sequence that is O(T·C·Dh + T·Dh²) per head. Reads q, k, v, writes o.
    """
    d_head = d // heads
    full, rest = divmod(seq, LINEAR_ATTENTION_CHUNK)
    intra = 4 * d_head * (full * LINEAR_ATTENTION_CHUNK**2 + rest**2)
    inter = 4 * seq * d_head * d_head
    return OpCost(name, batch * heads * (intra + inter), size * 4 * batch * seq * d, 1, True, live)


# The SM count the two passes' groups are counted for in the memory estimate: more SMs make more
# groups (``two_pass_group``), so a count above today's GPUs' (132 on an H100/H200) keeps it a bound.
_TWO_PASS_SMS = 192


def _two_pass_states(batch: int, seq: int, d: int, layer: LayerSpec, size: int) -> int:
    """Bytes of the states before every chunk, where sm_90's rule takes the two passes
    (``kernels.linear_attention.configs.forward_route``, 16-bit inputs, states in the input's 2
    bytes), of the groups' fp32 totals when pass 1 runs in several, and for the normalized maps of
    z before every chunk and in the totals (fp32): counted on every device, as the SDPA route's
    streams are, so the memory objective stays an upper bound whatever the route."""
    from kernels.linear_attention.configs import (
        CARRY_TILE,
        TWO_PASS_HOPPER,
        forward_route,
        padded_head_dim,
        two_pass_plan,
    )

    P = padded_head_dim(d // layer.heads)
    if size != 2 or layer.mixer != "linear_attention" or P is None:
        return 0
    if forward_route((9, 0), batch * layer.heads, seq, P, layer.feature_map) != "two_pass":
        return 0
    plan = two_pass_plan(batch * layer.heads, seq, P, TWO_PASS_HOPPER[P][0], _TWO_PASS_SMS)
    total = plan.buffer_bytes(size)
    if layer.feature_map != "identity":  # z before every chunk, and a scan tile of it per group total
        total += 4 * plan.batch_heads * (plan.chunks * P + (plan.groups * min(P * P, CARRY_TILE) if plan.carry else 0))
    return total


def _short_conv(name: str, rows: int, d: int, width: int, size: int, *, live: int) -> OpCost:
    """Depthwise causal convolution of width K over qkv ``[rows, 3d]``: 2·K FLOPs per element;
    reads the input and the K+1 weights per channel, writes the output."""
    elems = rows * 3 * d
    return OpCost(name, 2 * width * elems, size * (2 * elems + 3 * d * (width + 1)), 1, False, live)


def op_costs(arch: ArchSpec, shape: LatencyShape, *, dtype: str = "bf16") -> list[OpCost]:
    """The ops of one inference forward of ``arch`` on ``shape`` in execution order.

    Activations and weights are ``dtype`` (fp32 and tf32 are 4 bytes, bf16 and fp16 2).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)}")
    size = DTYPE_BYTES[dtype]
    d, batch, seq = arch.d_model, shape.batch, shape.seq_len
    tokens = shape.tokens
    stream = size * tokens * d  # bytes of one [B, T, d] activation, e.g. the residual stream
    ops = [OpCost("embed", tokens * d, tokens * _ID_BYTES + 2 * stream, 1, False, tokens * _ID_BYTES + stream)]
    for i, layer in enumerate(arch.layers):
        prefix = f"layers.{i}"
        if layer.mixer != "none":
            # one [B, T, H·P] activation: the heads as the kernels run them, padded to P in the
            # weights (nas.models.triton_model._pad_weights); FLOPs stay the model's
            heads = size * tokens * layer.heads * (padded_head_dim(d // layer.heads) or d // layer.heads)
            ops += [
                _norm(f"{prefix}.mixer_norm", layer.norm, tokens, d, size, live=2 * stream),
                _linear(f"{prefix}.qkv", tokens, d, 3 * d, size, residual=False, live=2 * stream + 3 * heads),
                *(
                    [_short_conv(f"{prefix}.short_conv", tokens, d, layer.short_conv, size, live=stream + 6 * heads)]
                    if layer.short_conv
                    else []
                ),
                _attention(f"{prefix}.attention", batch, seq, d, size, live=stream + 6 * heads)
                if layer.mixer == "attention"
                else _linear_attention(
                    f"{prefix}.linear_attention",
                    batch,
                    seq,
                    d,
                    layer.heads,
                    size,
                    live=stream + 4 * heads + _two_pass_states(batch, seq, d, layer, size),
                ),
                _linear(f"{prefix}.out", tokens, d, d, size, residual=True, live=2 * stream + heads),
            ]
        if layer.mlp_ratio > 0:
            hidden = mlp_hidden(layer, d)
            wide = size * tokens * hidden  # bytes of the [B, T, H] hidden activation
            ops += [
                _norm(f"{prefix}.mlp_norm", layer.norm, tokens, d, size, live=2 * stream),
                _linear(f"{prefix}.mlp_up", tokens, d, hidden, size, residual=False, live=2 * stream + wide),
                _linear(f"{prefix}.mlp_down", tokens, hidden, d, size, residual=True, live=2 * stream + wide),
            ]
    rows = tokens if arch.readout == "token" else batch  # positions the head reads
    ops += [
        _norm("final_norm", arch.layers[-1].norm, rows, d, size, live=stream + size * rows * d),
        _linear("head", rows, d, arch.n_out, size, residual=False, live=size * rows * (d + arch.n_out)),
    ]
    return ops
