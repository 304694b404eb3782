"""Generation costs at a context: what decoding keeps resident, and what one step moves and launches.

One decoding step of ``batch`` sequences that already hold ``context`` tokens each
(``nas.models.TritonDecoder``) runs, per block: norm → QKV linear → short-conv step → RoPE +
cache append and split-KV attention over the cache (one launch: partial softmaxes, combined by
the last slice of each head), or the linear-attention state update → out linear (+residual); norm → MLP up →
down; then the final norm, the head and the position counter. With one token per sequence every
linear is a matrix-vector product: the step is memory-bound (Flash-Decoding; Kimi Linear and
Jet-Nemotron name the KV cache the cost that dominates long-context decoding). Its bytes:

- weights: every parameter once per step (``count_params``, plus the zero rows and columns of
  heads padded to a kernel's head dim and of MLP hidden widths and readout outputs padded to
  ``padded_features``; of the embedding only the B rows gathered), whatever the batch;
- KV cache: each attention layer reads K and V of ``context`` rows: ``2·context·d`` elements per
  sequence (its heads' dims are zero-padded to a kernel's head dim, as the decoder stores them);
- state: each linear-attention layer reads and writes its ``heads`` ``[Dh, Dh]`` states
  and normalizers; each short convolution reads and shifts its ``K-1`` rows of ``3·H·P`` (the
  padded heads' channels).

``cache_memory`` is what stays resident at that context (the objective ``cache_memory``), and
``decode_work`` what one step moves: the inputs of the decode cost model (fitted on a GPU by
``nas profiles calibrate --decode``), which predicts the step as launches × a per-launch cost plus
each byte class × its own cost per byte. A residual width d that is not a multiple of 16 costs
extra (``unaligned_launches``, ``unaligned_weight_mb``): every norm and linear of the step reads or
writes rows d wide, and off a multiple of 16 the Triton kernels lose the divisibility
specialisation that makes their loads vectors, so those launches and the weights they stream run
slower (the decode steps of d % 16 = 8 were the model's largest misses without it:
``docs/latency.md``). The KV cache is one class per kernel head dim
(``KV_HEAD_DIMS``): the split-KV kernel streams rows of one head's dim, and short rows move fewer
bytes per instruction, so a MiB of cache costs more at a small head dim than at a large one; one
cost for every dim predicted held-out steps worse (``docs/benchmarks.md``, earlier experiments).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kernels.attention.configs import SUPPORTED_HEAD_DIMS, padded_head_dim
from kernels.linear.configs import padded_features
from nas.spec import WEIGHT_DTYPES, ArchSpec

from ._costs import (
    DTYPE_BYTES,
    PRECISION_BYTES,
    kv_bytes,
    kv_scale_bytes,
    mlp_hidden,
    state_bytes,
    weight_bytes,
)

__all__ = [
    "ALIGNED_DECODE_FEATURES",
    "DECODE_FEATURES",
    "DECODE_KINDS",
    "KV_HEAD_DIMS",
    "LEGACY_DECODE_FEATURES",
    "CacheEstimate",
    "DecodeWork",
    "cache_memory",
    "decode_work",
    "expand_coefficients",
]

_MIB = 2**20
KV_HEAD_DIMS = SUPPORTED_HEAD_DIMS  # the KV cache's byte classes: one per kernel head dim
# the decode cost model's features, in coefficient order (see DecodeWork.features), and how each
# transfers to another GPU (the kinds of nas.latency._launches.KINDS: a launch's cost or bytes')
DECODE_FEATURES = (
    "launches",
    "weight_mb",
    *(f"cache_mb_d{p}" for p in KV_HEAD_DIMS),
    "state_mb",
    "unaligned_launches",
    "unaligned_weight_mb",
)
DECODE_KINDS = ("launch", "bytes", *("bytes" for _ in KV_HEAD_DIMS), "bytes", "launch", "bytes")
# a profile written before the unaligned rows were priced: [launch, weight, cache per head dim, state]
ALIGNED_DECODE_FEATURES = DECODE_FEATURES[:-2]
# a profile written when the cache was one class: [launch, weight, cache, state] (see expand_coefficients)
LEGACY_DECODE_FEATURES = ("launches", "weight_mb", "cache_mb", "state_mb")


def _check(context: int, batch: int, dtype: str) -> int:
    for name, value in (("context", context), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _kernel_head_dim(arch: ArchSpec, heads: int) -> int:
    """The head dim a kernel stores a layer's heads at (the model's, or the next supported one)."""
    head_dim = arch.d_model // heads
    return padded_head_dim(head_dim) or head_dim


@dataclass(frozen=True)
class CacheEstimate:
    """Bytes resident while ``batch`` sequences decode at ``context`` tokens each: KV cache of
    the attention layers, fp32 states (+ normalizers) of the linear-attention layers, the short
    convolutions' windows, and the weights. ``cache_mb`` excludes the weights, ``total_mb``
    (the objective ``cache_memory``) includes them; MiB."""

    context: int
    batch: int
    kv_cache_bytes: int
    state_bytes: int
    conv_bytes: int
    weight_bytes: int

    @property
    def cache_bytes(self) -> int:
        return self.kv_cache_bytes + self.state_bytes + self.conv_bytes

    @property
    def cache_mb(self) -> float:
        return self.cache_bytes / _MIB

    @property
    def total_mb(self) -> float:
        return (self.cache_bytes + self.weight_bytes) / _MIB

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cache_bytes": self.cache_bytes, "cache_mb": self.cache_mb, "total_mb": self.total_mb}


def cache_memory(arch: ArchSpec, context: int, batch: int = 1, *, dtype: str = "bf16") -> CacheEstimate:
    """What decoding ``arch`` keeps resident at ``context`` tokens for ``batch`` sequences (see
    ``CacheEstimate``); conv windows in ``dtype``; each layer's KV cache in ``dtype`` or its
    ``kv_dtype`` (fp8: one byte an element plus an fp32 scale per sequence, head and K or V), its
    states and normalizers in its ``state_dtype`` (fp32 by default), its linear weights in its
    ``weight_dtype`` (``weight_bytes``), as ``StoredDecoder`` keeps them."""
    size = _check(context, batch, dtype)
    kv = state = conv = 0
    for layer in arch.layers:
        if layer.mixer == "attention":
            kv += 2 * context * layer.heads * _kernel_head_dim(arch, layer.heads) * kv_bytes(layer, size)
            kv += kv_scale_bytes(layer)
        elif layer.mixer == "linear_attention":
            p = _kernel_head_dim(arch, layer.heads)
            state += layer.heads * (p * p + (p if layer.feature_map != "identity" else 0)) * state_bytes(layer)
        if layer.mixer != "none" and layer.short_conv:  # the window of the padded heads' qkv channels
            conv += (layer.short_conv - 1) * 3 * layer.heads * _kernel_head_dim(arch, layer.heads) * size
    return CacheEstimate(context, batch, kv * batch, state * batch, conv * batch, weight_bytes(arch, size))


@dataclass(frozen=True)
class DecodeWork:
    """One decoding step's kernel launches and bytes by class (see the module docstring)."""

    launches: int
    weight_bytes: int
    cache_bytes_by_head_dim: tuple[int, ...]  # KV cache read by the attention layers, per KV_HEAD_DIMS
    state_bytes: int  # linear-attention states read + written, conv windows, activations
    unaligned_launches: int = 0  # norms and linears on rows of a d not a multiple of 16
    unaligned_weight_bytes: int = 0  # the weights those linears read

    @property
    def cache_bytes(self) -> int:
        """KV cache read by the attention layers, all head dims."""
        return sum(self.cache_bytes_by_head_dim)

    def features(self) -> tuple[float, ...]:
        """``DECODE_FEATURES``: launches, MiB per byte class, then the unaligned launches and MiB."""
        return (
            float(self.launches),
            self.weight_bytes / _MIB,
            *(b / _MIB for b in self.cache_bytes_by_head_dim),
            self.state_bytes / _MIB,
            float(self.unaligned_launches),
            self.unaligned_weight_bytes / _MIB,
        )


def expand_coefficients(coef: list[float]) -> list[float]:
    """Coefficients in ``DECODE_FEATURES`` order: as given; a model from before the unaligned rows
    were priced (``ALIGNED_DECODE_FEATURES``) with 0 for them; a legacy model's
    (``LEGACY_DECODE_FEATURES``) with its one cache cost for every head dim, and 0 for the
    unaligned rows (the same predictions as they had). ValueError for any other length."""
    if len(coef) == len(DECODE_FEATURES):
        return list(coef)
    unpriced = [0.0] * (len(DECODE_FEATURES) - len(ALIGNED_DECODE_FEATURES))
    if len(coef) == len(ALIGNED_DECODE_FEATURES):
        return [*coef, *unpriced]
    if len(coef) == len(LEGACY_DECODE_FEATURES):
        return [coef[0], coef[1], *(coef[2] for _ in KV_HEAD_DIMS), coef[3], *unpriced]
    raise ValueError(
        f"a decode model has {len(DECODE_FEATURES)} coefficients ({', '.join(DECODE_FEATURES)}), "
        f"{len(ALIGNED_DECODE_FEATURES)} (before the unaligned rows) "
        f"or {len(LEGACY_DECODE_FEATURES)} (the earlier {', '.join(LEGACY_DECODE_FEATURES)}), got {len(coef)}"
    )


def _kv_class(head_dim: int) -> int:
    """The ``KV_HEAD_DIMS`` index a layer's cache is costed at (a dim no kernel runs: the next above, or the last)."""
    return next((i for i, p in enumerate(KV_HEAD_DIMS) if p >= head_dim), len(KV_HEAD_DIMS) - 1)


def decode_work(arch: ArchSpec, context: int, batch: int = 1, *, dtype: str = "bf16") -> DecodeWork:
    """What one step of ``batch`` sequences at ``context`` tokens launches and moves, as the
    library's decoder runs it at the architecture's stored precision (``StoredDecoder`` below full
    precision): an fp8 KV cache reads one byte an element (its scales are a few bytes a head), a
    bf16 state two, and a block with fp8 weights reads them at one byte plus a scale per output
    channel and quantizes each linear's input rows first (a launch more per linear, the rows read
    once more and written in fp8). At full precision: bf16 (``dtype``) KV cache and weights,
    fp32 states."""
    size = _check(context, batch, dtype)
    d, B = arch.d_model, batch
    launches = 1 + 2 + 1  # embedding gather; final norm + head; position counter
    rows_d = 2  # launches on rows d wide: the final norm and the head; per block its norms, linears and d-row quantizes
    act = B * d * size * 2 + B * padded_features(arch.n_out) * size  # embedding rows, final norm, logits
    state = padding = 0  # padding: weights the padded heads add (zero rows and columns)
    cache = [0] * len(KV_HEAD_DIMS)
    for layer in arch.layers:
        fp8 = layer.weight_dtype != WEIGHT_DTYPES[0]
        w_size = PRECISION_BYTES[layer.weight_dtype] if fp8 else size
        if layer.mixer != "none":
            launches += 3  # norm, qkv, out
            rows_d += 3
            p = _kernel_head_dim(arch, layer.heads)
            hp = layer.heads * p  # the heads padded to p in the weights: qkv writes 3·hp, out reads hp
            others = 3 + (3 * (layer.short_conv + 1) if layer.short_conv else 0)  # qkv bias, conv weights + bias
            padding += (hp - d) * (4 * d * w_size + others * size)
            act += B * d * size * 2 + B * 3 * hp * size + B * (hp + 2 * d) * size  # norm, qkv out, out + residual
            if fp8:  # quantize_rows before qkv and out: read the rows, write them in fp8
                launches += 2
                rows_d += 1
                act += B * (d + hp) * (size + 1)
            if layer.short_conv:
                launches += 1
                state += 2 * (layer.short_conv - 1) * 3 * hp * B * size + B * 3 * hp * size * 2
            if layer.mixer == "attention":
                launches += 2  # rope + append; split-KV (the last slice of each head combines)
                cache[_kv_class(p)] += 2 * context * layer.heads * p * B * kv_bytes(layer, size)
                state += B * kv_scale_bytes(layer)
            else:
                launches += 1
                state += 2 * layer.heads * (p * p + p) * state_bytes(layer) * B
        hidden = padded_features(mlp_hidden(layer, d))  # zero-padded in the weights, as the head's outputs
        if hidden:
            padding += (hidden - mlp_hidden(layer, d)) * (2 * d * w_size + size)  # up's rows + bias, down's columns
            launches += 3
            rows_d += 3
            act += B * d * size * 2 + B * hidden * size * 2 + B * d * size * 3
            if fp8:  # quantize_rows before up and down
                launches += 2
                rows_d += 1
                act += B * (d + hidden) * (size + 1)
    padding += (padded_features(arch.n_out) - arch.n_out) * (d + 1) * size
    weights = weight_bytes(arch, size) - arch.vocab_size * d * size + padding  # the embedding: B rows gathered
    unaligned = d % 16 != 0
    return DecodeWork(launches, weights, tuple(cache), state + act, rows_d * unaligned, weights * unaligned)
