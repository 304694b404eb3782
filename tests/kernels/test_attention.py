"""kernels/attention/triton: the flash-attention forward against kernels.attention.reference and
the torch model's SelfAttention.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors: TRITON_INTERPRET must be
set before ``kernels.attention.triton`` decorates it, so this module sets it before importing it.
With CUDA the interpreter tests are skipped and the ``gpu`` tests run real sizes in bf16/fp16.
Every run writes into a NaN-filled buffer from fresh random inputs.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F


from kernels.attention import reference as ref
from kernels.attention import triton as fa
from nas.models.mixers import SelfAttention, apply_rope, rope_tables
from tests.kernels._support import (CPU, CUDA, assert_rel_close, head_views, poisoned, random_qkv,
                                    requires_cuda, requires_interpreter)


# Relative Frobenius error bound per dtype: fp32 in the interpreter is exact math up to rounding;
# bf16/fp16 round q (with the folded scale), k, v and p to 8/11-bit mantissas on the GPU.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}
CAUSAL = [pytest.param(True, id="causal"), pytest.param(False, id="full")]
ROPE = [pytest.param(True, id="rope"), pytest.param(False, id="norope")]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert_rel_close(actual, expected, TOLERANCES[dtype])


# ---------------------------------------------------------------------------------------------
# Interpreter: odd shapes (T = 37 spans two 32-row query blocks, diagonal and off-diagonal key
# blocks of 16 and a 5-key tail), every flag, both layouts.
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("rope", ROPE)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("D", [16, 32])
def test_matches_reference_on_qkv_views(D: int, causal: bool, rope: bool) -> None:
    B, T, H = 2, 37, 3
    qkv = random_qkv(B, T, H, D, torch.float32, CPU)
    tables = rope_tables(T, D, device=CPU, dtype=torch.float32) if rope else None
    out = fa.flash_attention_qkv(qkv, H, causal=causal, rope=tables, out=poisoned(B, T, H, D, torch.float32, CPU))
    _assert_close(out, ref.attention(*head_views(qkv, H), causal=causal, rope_tables=tables), torch.float32)


@requires_interpreter
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("T", [1, 16, 64, 70])
def test_lengths_contiguous_layout(T: int, causal: bool) -> None:
    """[B, H, T, D] contiguous tensors, lengths at and around block edges, a custom scale."""
    B, H, D = 1, 2, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    out = fa.flash_attention(q, k, v, causal=causal, scale=0.3, out=poisoned(B, T, H, D, torch.float32, CPU))
    _assert_close(out, ref.attention(q, k, v, causal=causal, scale=0.3), torch.float32)


@requires_interpreter
@pytest.mark.parametrize("causal", CAUSAL)
def test_fp16_in_interpreter(causal: bool) -> None:
    """Half precision through the same code path. (bf16 is left to the GPU tests: the Triton 3.9
    interpreter's bf16 ``tl.dot`` multiplies raw bit patterns.)"""
    B, T, H, D = 2, 37, 3, 32
    qkv = random_qkv(B, T, H, D, torch.float16, CPU)
    tables = rope_tables(T, D, device=CPU, dtype=torch.float16)
    out = fa.flash_attention_qkv(qkv, H, causal=causal, rope=tables, out=poisoned(B, T, H, D, torch.float16, CPU))
    _assert_close(out, ref.attention(*head_views(qkv, H), causal=causal, rope_tables=tables), torch.float16)


@requires_interpreter
@pytest.mark.parametrize("rope", ROPE)
def test_matches_model_rope_and_sdpa(rope: bool) -> None:
    """The kernel computes apply_rope + F.scaled_dot_product_attention of nas.models.mixers."""
    B, T, H, D = 2, 37, 3, 32
    qkv = random_qkv(B, T, H, D, torch.float32, CPU)
    q, k, v = head_views(qkv, H)
    if rope:
        cos, sin = rope_tables(T, D, device=q.device, dtype=q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, H * D)
    tables = rope_tables(T, D, device=q.device, dtype=q.dtype) if rope else None
    _assert_close(fa.flash_attention_qkv(qkv, H, causal=True, rope=tables), expected, torch.float32)


@requires_interpreter
def test_self_attention_mixer_end_to_end() -> None:
    """SelfAttention's forward with its qkv projection, this kernel and its out projection."""
    torch.manual_seed(0)
    B, T, H, D = 2, 37, 3, 16
    mixer = SelfAttention(H * D, H, short_conv=0)
    x = torch.randn(B, T, H * D)
    with torch.no_grad():
        tables = rope_tables(T, D, device=x.device, dtype=x.dtype)
        actual = mixer.out(fa.flash_attention_qkv(mixer.qkv(x), H, causal=True, rope=tables))
        _assert_close(actual, mixer(x), torch.float32)


@requires_interpreter
def test_unaligned_views_are_copied() -> None:
    """Inputs a tensor descriptor cannot read in place (unit stride broken on D, rows off 16-byte
    alignment) and rope tables in a strided view still give the reference result."""
    B, T, H, D = 1, 21, 2, 16
    q = torch.randn(B, H, T, 2 * D)[..., ::2]
    k = torch.randn(B, H, T * D + 1)[..., 1:].view(B, H, T, D)
    v = torch.randn(B, T, H, D).transpose(1, 2)
    cos, sin = (t.t().contiguous().t() for t in rope_tables(T, D, device=CPU, dtype=torch.float32))
    out = fa.flash_attention(q, k, v, causal=True, rope=(cos, sin), out=poisoned(B, T, H, D, torch.float32, CPU))
    _assert_close(out, ref.attention(q, k, v, causal=True, rope_tables=(cos, sin)), torch.float32)


@pytest.mark.parametrize("D", [8, 24, 48, 96, 256])
def test_unsupported_head_dim_raises(D: int) -> None:
    q = torch.randn(1, 2, 5, D)
    with pytest.raises(ValueError, match=f"head dim D={D} .*allowed: 16, 32, 64, 128"):
        fa.flash_attention(q, q, q, causal=True)


def test_bad_inputs_raise() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="share one"):
        fa.flash_attention(q, q[:, :1], q, causal=True)
    with pytest.raises(ValueError, match="dtype"):
        fa.flash_attention(q.double(), q.double(), q.double(), causal=True)
    with pytest.raises(ValueError, match="rope cos"):
        fa.flash_attention(q, q, q, causal=True, rope=(torch.randn(4, 8), torch.randn(4, 8)))
    with pytest.raises(ValueError, match="out must be"):
        fa.flash_attention(q, q, q, causal=True, out=torch.empty(1, 5, 16))
    with pytest.raises(ValueError, match="qkv must be"):
        fa.flash_attention_qkv(torch.randn(1, 5, 40), 3, causal=True)


# ---------------------------------------------------------------------------------------------
# GPU: real lengths, bf16 and fp16, against the fp32 reference on the same device.
# ---------------------------------------------------------------------------------------------

# (D, T, dtype): H = 16 and lengths that are multiples of 16 share compiled kernels with the
# benchmark; 1000 has a partial query block and a masked key tail; fp16 at one length keeps the
# compile count down.
GPU_CASES = [
    pytest.param(D, T, dtype, id=f"D{D}-T{T}-{name}")
    for D in (64, 128)
    for T, dtype, name in [(1000, torch.bfloat16, "bf16"), (4096, torch.bfloat16, "bf16"), (4096, torch.float16, "fp16")]
]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("D,T,dtype", GPU_CASES)
def test_gpu_matches_reference(D: int, T: int, dtype: torch.dtype, causal: bool) -> None:
    B, H = 1, 16
    qkv = random_qkv(B, T, H, D, dtype, CUDA)
    out = fa.flash_attention_qkv(qkv, H, causal=causal, out=poisoned(B, T, H, D, dtype, CUDA))
    _assert_close(out, ref.attention(*head_views(qkv, H), causal=causal), dtype)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("D,T", [(16, 1000), (32, 1000), (64, 4096), (128, 4096)])
def test_gpu_rope_and_small_heads(D: int, T: int) -> None:
    B, H = 1, 16
    qkv = random_qkv(B, T, H, D, torch.bfloat16, CUDA)
    tables = rope_tables(T, D, device=CUDA, dtype=torch.bfloat16)  # the model's tables: q's dtype
    out = fa.flash_attention_qkv(qkv, H, causal=True, rope=tables, out=poisoned(B, T, H, D, torch.bfloat16, CUDA))
    _assert_close(out, ref.attention(*head_views(qkv, H), causal=True, rope_tables=tables), torch.bfloat16)
