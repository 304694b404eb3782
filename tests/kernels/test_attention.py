"""kernels/attention/triton: the flash-attention forward against kernels.attention.reference and
the torch model's SelfAttention.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors: TRITON_INTERPRET must be
set before ``kernels.attention.triton`` decorates it, so this module sets it before importing it.
With CUDA the interpreter tests are skipped and the ``gpu`` tests run real sizes in bf16/fp16.
Every run writes into a NaN-filled buffer from fresh random inputs.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import AttentionConfig, configs
from kernels.attention import reference as ref
from kernels.attention import triton as fa
from nas.models.mixers import SelfAttention, apply_rope, rope_tables
from tests.kernels import _support as support
from tests.kernels._support import CPU, CUDA, Shape, requires_cuda, requires_interpreter

# Relative Frobenius error bound per dtype: fp32 in the interpreter is exact math up to rounding;
# bf16/fp16 round q (with the folded scale), k, v and p to 8/11-bit mantissas on the GPU.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}
CAUSAL = [pytest.param(True, id="causal"), pytest.param(False, id="full")]
ROPE = [pytest.param(True, id="rope"), pytest.param(False, id="norope")]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    support.assert_rel_close(actual, expected, TOLERANCES[dtype])


def _check(shape: Shape, dtype: torch.dtype, device: torch.device, *, causal: bool, rope: bool, config=None) -> None:
    """``flash_attention_qkv`` (``config``: an AttentionConfig, or the autotuner's) on a fresh
    projection against the reference; with ``rope`` the model's tables in q's dtype."""
    T, D = shape[1], shape[3]
    tables = rope_tables(T, D, device=device, dtype=dtype) if rope else None
    kernel = partial(fa.flash_attention_qkv, causal=causal, rope=tables, config=config)
    expected = partial(ref.attention, causal=causal, rope_tables=tables)
    support.check_qkv_kernel(kernel, expected, shape, dtype, device, TOLERANCES[dtype])


# Every config the autotuner may be handed, with its head dim: the per-GPU tables, and the
# interpreter's at each supported head dim.
_TABLES = [(D, c) for table in (configs.HOPPER, configs.DEFAULT) for D, cs in table.items() for c in cs]
EVERY_CONFIG = support.config_params(
    _TABLES + [(D, configs.INTERPRETER) for D in configs.SUPPORTED_HEAD_DIMS],
    lambda c: f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}",
)


# ---------------------------------------------------------------------------------------------
# Interpreter: odd shapes (T = 37 spans two 32-row query blocks, diagonal and off-diagonal key
# blocks of 16 and a 5-key tail), every flag, both layouts.
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("rope", ROPE)
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("D", [16, 32])
def test_matches_reference_on_qkv_views(D: int, causal: bool, rope: bool) -> None:
    _check((2, 37, 3, D), torch.float32, CPU, causal=causal, rope=rope)


@requires_interpreter
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("T", [1, 16, 64, 70])
def test_lengths_contiguous_layout(T: int, causal: bool) -> None:
    """[B, H, T, D] contiguous tensors, lengths at and around block edges, a custom scale."""
    B, H, D = 1, 2, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    out = fa.flash_attention(q, k, v, causal=causal, scale=0.3, out=support.poisoned(B, T, H, D, torch.float32, CPU))
    _assert_close(out, ref.attention(q, k, v, causal=causal, scale=0.3), torch.float32)


@requires_interpreter
@pytest.mark.parametrize("causal", CAUSAL)
def test_fp16_in_interpreter(causal: bool) -> None:
    """Half precision through the same code path. (bf16 is left to the GPU tests: the Triton 3.9
    interpreter's bf16 ``tl.dot`` multiplies raw bit patterns.)"""
    _check((2, 37, 3, 32), torch.float16, CPU, causal=causal, rope=True)


@requires_interpreter
@pytest.mark.parametrize("D,config", EVERY_CONFIG)
def test_every_config(D: int, config: AttentionConfig) -> None:
    """The contract over every config: each tiling, run as given, with RoPE, causal, at an odd
    length (T = 150: a ragged query block and a masked key tail at every tile size)."""
    _check((1, 150, 2, D), torch.float32, CPU, causal=True, rope=True, config=config)


@requires_interpreter
@pytest.mark.parametrize("rope", ROPE)
def test_matches_model_rope_and_sdpa(rope: bool) -> None:
    """The kernel computes apply_rope + F.scaled_dot_product_attention of nas.models.mixers."""
    B, T, H, D = 2, 37, 3, 32
    qkv = support.random_qkv(B, T, H, D, torch.float32, CPU)
    q, k, v = support.head_views(qkv, H)
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
    out = fa.flash_attention(
        q, k, v, causal=True, rope=(cos, sin), out=support.poisoned(B, T, H, D, torch.float32, CPU)
    )
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
GPU_CASES = support.qkv_cases(
    (D, T, dtype)
    for D in (64, 128)
    for T, dtype in [(1000, torch.bfloat16), (4096, torch.bfloat16), (4096, torch.float16)]
)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("D,T,dtype", GPU_CASES)
def test_gpu_matches_reference(D: int, T: int, dtype: torch.dtype, causal: bool) -> None:
    _check((1, T, 16, D), dtype, CUDA, causal=causal, rope=False)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("D,T", [(16, 1000), (32, 1000), (64, 4096), (128, 4096)])
def test_gpu_rope_and_small_heads(D: int, T: int) -> None:
    _check((1, T, 16, D), torch.bfloat16, CUDA, causal=True, rope=True)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("D,config", EVERY_CONFIG)
def test_gpu_every_config(D: int, config: AttentionConfig, causal: bool) -> None:
    """Each tiling compiled and run in bf16 at a ragged length (without RoPE: at D = 128 the
    128×128 tile with RoPE needs more shared memory than sm_90 has; the autotuner skips it)."""
    _check((1, 1000, 16, D), torch.bfloat16, CUDA, causal=causal, rope=False, config=config)
