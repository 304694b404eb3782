"""Token mixers against obviously-correct references written here, not copied from the library.

Chain: O(T²) masked form ↔ token-by-token recurrence ↔ the chunked ``causal_linear_attention``;
softmax attention ↔ explicit causal mask + per-position rotation matrices; short conv ↔ a loop.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from nas.models.mixers import (
    FEATURE_MAP_FNS,
    NORMALIZER_EPS,
    LinearAttention,
    SelfAttention,
    apply_rope,
    causal_linear_attention,
    rope_tables,
)

# (dtype, atol, rtol); the fp32 chunked sum reassociates T·D terms
DTYPES = [
    pytest.param((torch.float32, 1e-4, 1e-4), id="fp32"),
    pytest.param((torch.float64, 1e-10, 1e-10), id="fp64"),
]


# ---------------------------------------------------------------- references


def naive_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normalize: bool) -> torch.Tensor:
    """O(T²) masked form. q, k, v ``[B, H, T, D]`` → ``[B, H, T, D]``."""
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2)) * causal  # [B, H, T, T], scores[t, s] = q_t·k_s for s ≤ t
    out = scores @ v
    if normalize:
        out = out / (scores.sum(-1, keepdim=True) + NORMALIZER_EPS)
    return out


def recurrent_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Token-by-token: S_t = S_{t-1} + k_t v_tᵀ, z_t = z_{t-1} + k_t, o_t = q_t S_t [/ (q_t·z_t)]."""
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, D, v.shape[-1])
    z = q.new_zeros(B, H, D)
    outs = []
    for t in range(T):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + k[:, :, t]
        o = torch.einsum("bhd,bhde->bhe", q[:, :, t], S)
        if normalize:
            o = o / ((q[:, :, t] * z).sum(-1, keepdim=True) + NORMALIZER_EPS)
        outs.append(o)
    return torch.stack(outs, dim=2)


def rotation_matrices(T: int, D: int) -> torch.Tensor:
    """``[T, D, D]`` fp64: R_t rotates the plane (i, i + D//2) by t·10000^(-2i/D) for i < D//2;
    an odd last channel is left alone."""
    half = D // 2
    R = torch.eye(D, dtype=torch.float64).repeat(T, 1, 1)
    for t in range(T):
        for i in range(half):
            a = t * 10000.0 ** (-2 * i / D)
            c, s = math.cos(a), math.sin(a)
            R[t, i, i], R[t, i, i + half] = c, -s
            R[t, i + half, i], R[t, i + half, i + half] = s, c
    return R


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y[b, t, c] = bias[c] + Σ_j weight[c, 0, j] · x[b, t - (K-1) + j, c], zero before the start.
    x ``[B, T, C]``, weight ``[C, 1, K]`` (nn.Conv1d layout)."""
    B, T, C = x.shape
    K = weight.shape[-1]
    y = bias.expand(B, T, C).clone()
    for t in range(T):
        for j in range(K):
            s = t - (K - 1) + j
            if s >= 0:
                y[:, t] += weight[:, 0, j] * x[:, s]
    return y


def naive_self_attention(m: SelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Explicit: projections, (conv), per-position rotation, QKᵀ/√D with a -inf causal mask, softmax."""
    B, T, d = x.shape
    H = m.heads
    Dh = d // H
    qkv = x @ m.qkv.weight.T + m.qkv.bias
    if m.conv is not None:
        qkv = causal_depthwise_conv(qkv, m.conv.weight, m.conv.bias)
    q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(B, T, H, Dh).transpose(1, 2) for i in range(3))
    R = rotation_matrices(T, Dh).to(x.dtype)
    q = torch.einsum("tij,bhtj->bhti", R, q)
    k = torch.einsum("tij,bhtj->bhti", R, k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    o = scores.masked_fill(future, float("-inf")).softmax(-1) @ v  # [B, H, T, Dh]
    return o.transpose(1, 2).reshape(B, T, d) @ m.out.weight.T + m.out.bias


def qkv_heads(x: torch.Tensor, d: int, H: int) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    return tuple(x[..., i * d : (i + 1) * d].reshape(B, T, H, d // H).transpose(1, 2) for i in range(3))


# ---------------------------------------------------------------- causal_linear_attention


def _qkv(B: int, H: int, T: int, D: int, dtype: torch.dtype, positive: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    if positive:  # what a positive feature map hands the normalized form
        q, k = F.elu(q) + 1, F.elu(k) + 1
    else:
        q = q * D**-0.5
    return q.to(dtype), k.to(dtype), v.to(dtype)


SEQ_LENS = [pytest.param(t, id=f"T{t}") for t in (1, 37, 64, 130)]  # below, at and past the chunk
NORMALIZE = [pytest.param(True, id="normalized"), pytest.param(False, id="unnormalized")]


@functools.cache
def _case(T: int, normalize: bool) -> tuple[torch.Tensor, ...]:
    """fp64 (q, k, v, masked-form output) for one sequence length, shared by every chunk and dtype."""
    q, k, v = _qkv(2, 3, T, 48, torch.float64, positive=normalize)
    return q, k, v, naive_linear_attention(q, k, v, normalize)


@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("T", SEQ_LENS)
def test_references_agree(T, normalize):
    q, k, v, masked = _case(T, normalize)
    torch.testing.assert_close(recurrent_linear_attention(q, k, v, normalize), masked, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype_tol", DTYPES)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("chunk", [1, 16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("T", SEQ_LENS)
def test_chunked_matches_reference(T, chunk, normalize, dtype_tol):
    dtype, atol, rtol = dtype_tol
    q, k, v, masked = _case(T, normalize)
    got = causal_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), normalize=normalize, chunk=chunk)
    assert got.shape == (2, 3, T, 48) and got.dtype == dtype
    torch.testing.assert_close(got, masked.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_chunked_gradients_match_reference(normalize):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 37, 12, torch.float64, positive=normalize))
    grad_out = torch.randn(1, 2, 37, 12, dtype=torch.float64)
    got = torch.autograd.grad(
        (causal_linear_attention(q, k, v, normalize=normalize, chunk=16) * grad_out).sum(), (q, k, v)
    )
    want = torch.autograd.grad((naive_linear_attention(q, k, v, normalize) * grad_out).sum(), (q, k, v))
    for g, w, name in zip(got, want, "qkv", strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=f"d{name}")


def test_linear_attention_is_causal():
    q, k, v = _qkv(1, 2, 37, 8, torch.float64, positive=True)
    base = causal_linear_attention(q, k, v, normalize=True, chunk=16)
    t = 20
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t:] += 1.0
    v2[:, :, t:] -= 3.0
    moved = causal_linear_attention(q, k2, v2, normalize=True, chunk=16)
    torch.testing.assert_close(moved[:, :, :t], base[:, :, :t], atol=1e-12, rtol=0)
    assert not torch.allclose(moved[:, :, t:], base[:, :, t:])


@pytest.mark.parametrize("feature_map", ["identity", "elu+1", "relu"])
def test_linear_attention_module_matches_reference(feature_map):
    torch.manual_seed(0)
    d, H, T = 48, 4, 37
    m = LinearAttention(d, H, feature_map, short_conv=0).double()
    x = torch.randn(2, T, d, dtype=torch.float64)
    q, k, v = qkv_heads(x @ m.qkv.weight.T + m.qkv.bias, d, H)
    phi = FEATURE_MAP_FNS[feature_map]
    q, k = phi(q), phi(k)
    normalize = feature_map != "identity"  # identity can zero the normalizer: scaled instead
    if not normalize:
        q = q / math.sqrt(d // H)
    o = recurrent_linear_attention(q, k, v, normalize)
    want = o.transpose(1, 2).reshape(2, T, d) @ m.out.weight.T + m.out.bias
    torch.testing.assert_close(m(x), want, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- softmax attention + RoPE

ATTN_SHAPES = [
    pytest.param((48, 4), id="d48-H4-Dh12"),
    pytest.param((48, 16), id="d48-H16-Dh3-odd"),
    pytest.param((30, 30), id="d30-H30-Dh1"),
    pytest.param((32, 1), id="d32-H1-Dh32"),
]
# rope tables are built in fp32 (as the kernels build them), so fp64 agrees to ~1e-6, not 1e-12
ATTN_DTYPES = [
    pytest.param((torch.float32, 1e-5, 1e-4), id="fp32"),
    pytest.param((torch.float64, 1e-5, 1e-5), id="fp64"),
]


@pytest.mark.parametrize("dtype_tol", ATTN_DTYPES)
@pytest.mark.parametrize("short_conv", [0, 4], ids=["noconv", "conv4"])
@pytest.mark.parametrize("shape", ATTN_SHAPES)
def test_self_attention_matches_naive(shape, short_conv, dtype_tol):
    d, H = shape
    dtype, atol, rtol = dtype_tol
    torch.manual_seed(0)
    m = SelfAttention(d, H, short_conv).to(dtype)
    with torch.no_grad():  # non-zero biases so a dropped bias shows
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 37, d, dtype=dtype)
    torch.testing.assert_close(m(x), naive_self_attention(m, x), atol=atol, rtol=rtol)


def test_rope_tables_are_kept_between_forwards_and_sliced_exactly():
    """Tables are computed when a longer sequence (or another dtype) first comes, and a shorter
    one reads a slice that equals its own tables bit for bit; the state dict never holds them."""
    torch.manual_seed(0)
    m = SelfAttention(24, 3, 0)
    x = torch.randn(2, 40, 24)
    computed = []
    for T in (9, 5, 9, 40, 17):
        before = m._rope_cache
        got = m(x[:, :T])
        computed.append(m._rope_cache is not before)
        fresh = SelfAttention(24, 3, 0)
        fresh.load_state_dict(m.state_dict())
        assert torch.equal(got, fresh(x[:, :T])), T  # fresh computes its tables at T
    assert computed == [True, False, False, True, False]
    m.double()(x[:, :5].double())  # another dtype: computed again, not a cast of the fp32 tables
    assert m._rope_cache[0].dtype == torch.float64
    assert not any("rope" in key for key in m.state_dict())


def test_rope_is_not_a_no_op():
    """The reference would also pass for an attention with no positions at all, were it not for this."""
    torch.manual_seed(0)
    m = SelfAttention(16, 2, 0).double()
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    q, k, v = qkv_heads(m.qkv(x), 16, 2)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    plain = m.out(plain.transpose(1, 2).reshape(1, 9, 16))
    assert not torch.allclose(m(x), plain, atol=1e-4)


@pytest.mark.parametrize("D", [16, 5, 1], ids=lambda D: f"D{D}")
def test_rope_scores_depend_only_on_relative_offset(D):
    torch.manual_seed(0)
    q, k = torch.randn(2, D, dtype=torch.float64)
    cos, sin = rope_tables(200, D, device=torch.device("cpu"), dtype=torch.float64)
    rq = apply_rope(q.expand(1, 1, 200, D), cos, sin)[0, 0]  # [T, D]: q placed at every position
    rk = apply_rope(k.expand(1, 1, 200, D), cos, sin)[0, 0]
    assert rq.shape == (200, D)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(200))  # a rotation keeps norms
    torch.testing.assert_close(rq[0], q)  # position 0 is not rotated
    for offset in (0, 1, 7, 50):
        dots = torch.stack([rq[m] @ rk[m - offset] for m in range(offset, offset + 120)])
        # fp32 angles: m·θ carries ~1e-7·m of error
        torch.testing.assert_close(dots, dots[0].expand_as(dots), atol=1e-4, rtol=1e-4, msg=f"offset {offset}")
    if D > 1:
        assert not torch.isclose(rq[5] @ rk[5], rq[5] @ rk[2]), "scores must depend on the offset"


# ---------------------------------------------------------------- short conv


@pytest.mark.parametrize("K", [1, 2, 4, 7], ids=lambda K: f"K{K}")
@pytest.mark.parametrize("cls", [SelfAttention, LinearAttention], ids=["attention", "linear_attention"])
def test_short_conv_equals_handwritten_causal_conv(cls, K):
    torch.manual_seed(0)
    d, H, T = 12, 3, 37
    m = cls(d, H, "elu+1", K) if cls is LinearAttention else cls(d, H, K)
    with torch.no_grad():
        m.conv.bias.normal_()
    assert m.conv.weight.shape == (3 * d, 1, K)
    x = torch.randn(2, T, d)
    want = causal_depthwise_conv(m.qkv(x), m.conv.weight, m.conv.bias)
    got = torch.stack(m._split(x)[:3]).permute(1, 3, 0, 2, 4).reshape(2, T, 3 * d)  # [3, B, H, T, Dh] → [B, T, 3d]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", [SelfAttention, LinearAttention], ids=["attention", "linear_attention"])
def test_short_conv_mixer_is_causal(cls):
    torch.manual_seed(0)
    m = cls(12, 3, "relu", 4) if cls is LinearAttention else cls(12, 3, 4)
    x = torch.randn(2, 37, 12)
    base = m(x)
    for t in (0, 10, 36):
        x2 = x.clone()
        x2[:, t] += 1.0
        out = m(x2)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
        assert not torch.allclose(out[:, t], base[:, t])


# ---------------------------------------------------------------- traced for export

TRACED_LENGTHS = (1, 17, 64, 65, 100, 129)  # one token; below, at and past the chunk; odd non-multiples


@pytest.mark.parametrize(
    "feature_map,short_conv", [("identity", 0), ("elu+1", 4), ("relu", 3)], ids=["identity", "elu1-conv4", "relu-conv3"]
)
def test_linear_attention_traces_to_one_program_for_every_length(feature_map, short_conv):
    """torch.export at the length ``nas export`` traces at gives a program that is the eager module
    at every length: the export path (C rows per chunk, always padded) is the same function, and
    the trace took no decision on T (one would be a guard, and the export a constraint violation).
    Captured as torch.onnx captures a model: size-oblivious, no special case for a size of 1."""
    from nas.results.onnx_model import TRACE_LEN

    torch.manual_seed(0)
    m = LinearAttention(30, 2, feature_map, short_conv).double().eval()  # head dim 15
    shapes = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", min=1)},)
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        program = torch.export.export(m, (torch.randn(2, TRACE_LEN, 30, dtype=torch.float64),), dynamic_shapes=shapes)
    for T in TRACED_LENGTHS:
        x = torch.randn(3, T, 30, dtype=torch.float64)
        torch.testing.assert_close(program.module()(x), m(x), atol=1e-12, rtol=1e-12, msg=f"T={T}")
