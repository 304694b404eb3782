"""kernels/linear/fp8: per-row quantization against the fp8 rule (``kernels._fp8.scaled``) bit for
bit, the fp8 matmul with its epilogue against the fp32 reference over the operands as they read
back, and against what the accuracy objective scores (``nas.models.precision.StoredLinear``).

Without CUDA the kernels run under Triton's interpreter at small odd shapes (tiles of 16 × 16 and
K steps of 32 that the shapes cross); the ``gpu`` tests run the Hopper tile at real sizes and
compare with ``torch._scaled_mm``, the peer on the same fp8 operands.
"""

from __future__ import annotations

import pytest
import torch

from kernels._fp8 import FP8_DTYPE, scaled
from kernels.linear import reference as ref
from kernels.linear.fp8 import K_ALIGN, Fp8Config, linear_fp8, padded_k, quantize_rows, quantize_weight
from tests.kernels._support import CPU, CUDA, DTYPE_NAMES, assert_rel_close, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

# the output's one rounding (fp32 sums of exact fp8 products otherwise)
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _operands(M: int, N: int, K: int, device, key: tuple):
    """Activations whose rows span four decades (their scales differ), a weight, bias, residual."""
    gen = _gen(*key)
    x = torch.randn(M, K, generator=gen) * torch.logspace(-2, 2, M)[:, None]
    if M > 2:
        x[1] = 0.0  # an all-zero token: scale 1
    w = torch.randn(N, K, generator=gen) / K**0.5
    b, r = torch.randn(N, generator=gen), torch.randn(M, N, generator=gen)
    return [t.to(device) for t in (x, w, b, r)]


def _read_back(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return values.float() * scales[:, None]


def _close(got: torch.Tensor, want: torch.Tensor, bound: float) -> None:
    """Relative Frobenius error within ``bound``; an all-zero reference (relu of a negative 1 × 1)
    wants zeros."""
    if want.norm() == 0:
        assert got.float().abs().max() == 0
    else:
        assert_rel_close(got, want, bound)


@requires_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=DTYPE_NAMES.get)
@pytest.mark.parametrize(("M", "K"), [(1, 7), (3, 16), (37, 53), (16, 300)])
def test_rows_quantize_as_the_rule_bit_for_bit(M: int, K: int, dtype) -> None:
    x = (torch.randn(M, K, generator=_gen("rows", M, K)) * torch.logspace(-3, 3, M)[:, None]).to(dtype)
    got, scales = quantize_rows(x)
    want, want_scales = scaled(x, -1)
    assert got.dtype == FP8_DTYPE and got.shape == (M, padded_k(K)) and padded_k(K) % K_ALIGN == 0
    assert torch.equal(got[:, :K].view(torch.uint8), want.view(torch.uint8))
    assert not got[:, K:].view(torch.uint8).any(), "the padding past K must be zeros"
    assert torch.equal(scales, want_scales)


@pytest.mark.parametrize(("N", "K"), [(1, 7), (5, 16), (29, 53)])
def test_a_weight_is_stored_with_k_padded_by_zeros(N: int, K: int) -> None:
    w = torch.randn(N, K, generator=_gen("weight", N, K))
    got, scales = quantize_weight(w)
    want, want_scales = scaled(w, -1)
    assert got.shape == (N, padded_k(K)) and got.is_contiguous()
    assert torch.equal(got[:, :K].view(torch.uint8), want.view(torch.uint8)) and torch.equal(scales, want_scales)
    assert not got[:, K:].view(torch.uint8).any()


@requires_interpreter
@pytest.mark.parametrize("activation", [None, "gelu", "silu", "relu"], ids=str)
@pytest.mark.parametrize(("M", "N", "K"), [(1, 1, 1), (3, 17, 33), (37, 29, 53), (20, 48, 100)])
def test_matmul_with_its_epilogue_matches_the_reference(M: int, N: int, K: int, activation) -> None:
    x, w, b, r = _operands(M, N, K, CPU, ("matmul", M, N, K))
    (xq, sx), (wq, sw) = quantize_rows(x), quantize_weight(w)
    xr, wr = _read_back(xq, sx), _read_back(wq, sw)
    for out_dtype in (torch.float32, torch.bfloat16):
        for bias, residual in ((None, None), (b, None), (b, r), (None, r)):
            got = linear_fp8(xq, sx, wq, sw, bias, activation=activation, residual=residual, out_dtype=out_dtype)
            want = ref.linear(xr, wr, bias, activation=activation, residual=residual)
            assert got.dtype == out_dtype and got.shape == (M, N)
            _close(got, want, BOUNDS[out_dtype])


@requires_interpreter
@pytest.mark.parametrize(
    "config", [Fp8Config(16, 16, 32, 1, 4, 1), Fp8Config(32, 16, 16, 3, 4, 1), Fp8Config(16, 32, 64, 2, 4, 2)], ids=str
)
def test_every_tile_and_tile_order_gives_the_same_result(config: Fp8Config) -> None:
    """Tiles larger and smaller than the shape, and grouped tile orders, with ragged edges."""
    M, N, K = 45, 39, 70
    x, w, b, r = _operands(M, N, K, CPU, ("tiles",))
    (xq, sx), (wq, sw) = quantize_rows(x), quantize_weight(w)
    want = ref.linear(_read_back(xq, sx), _read_back(wq, sw), b, activation="gelu", residual=r)
    got = linear_fp8(xq, sx, wq, sw, b, activation="gelu", residual=r, out_dtype=torch.float32, config=config)
    assert_rel_close(got, want, 1e-5)


@requires_interpreter
def test_the_kernel_computes_what_the_accuracy_objective_scores() -> None:
    """A StoredLinear with fp8 on (the search's reference of ``weight_dtype: fp8``) and the kernel
    (quantize the input per token, multiply by the stored weight, add the bias) agree to fp32
    round-off: the accuracy a candidate is scored with is this kernel's arithmetic."""
    from nas.models.precision import StoredLinear

    layer = StoredLinear(53, 29)
    layer.fp8 = True
    x = torch.randn(3, 7, 53, generator=_gen("stored")) * 3
    with torch.no_grad():
        want = layer(x).reshape(21, 29)
        (xq, sx), (wq, sw) = quantize_rows(x.reshape(21, 53)), quantize_weight(layer.weight)
        got = linear_fp8(xq, sx, wq, sw, layer.bias, out_dtype=torch.float32)
    assert_rel_close(got, want, 1e-6)


@requires_interpreter
def test_bad_inputs_are_named() -> None:
    x, w, b, r = _operands(5, 6, 16, CPU, ("bad",))
    (xq, sx), (wq, sw) = quantize_rows(x), quantize_weight(w)
    with pytest.raises(ValueError, match="must share K"):
        linear_fp8(xq, sx, wq[:, :8], sw)
    with pytest.raises(ValueError, match=r"w_q must be torch.float8_e4m3fn \[6, 16\]"):
        linear_fp8(xq, sx, w, sw)
    with pytest.raises(ValueError, match=r"s_x must be contiguous fp32 \[5\]"):
        linear_fp8(xq, sx[:4], wq, sw)
    with pytest.raises(ValueError, match="activation must be one of"):
        linear_fp8(xq, sx, wq, sw, activation="tanh")
    with pytest.raises(ValueError, match=r"residual must be \[5, 6\]"):
        linear_fp8(xq, sx, wq, sw, residual=r.t())
    with pytest.raises(ValueError, match="K must be a multiple of 16"):
        linear_fp8(xq[:, :8], sx, wq[:, :8], sw)
    with pytest.raises(ValueError, match=r"x must be \[M, K\]"):
        quantize_rows(x.t())
    with pytest.raises(ValueError, match=r"weight must be \[N, K\]"):
        quantize_weight(w[0])


# ---------------------------------------------------------------------------------------------
# GPU: the Hopper tile at real sizes, against the reference and torch._scaled_mm.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    ("M", "N", "K"), [(4096, 1024, 1024), (513, 3072, 768), (8, 4096, 1024), (16, 1000, 1024), (3, 3072, 768)]
)
def test_gpu_fp8_matmul_matches_the_reference_and_scaled_mm(M: int, N: int, K: int) -> None:
    x, w, b, r = _operands(M, N, K, CUDA, ("gpu", M, N, K))
    x = x.to(torch.bfloat16)
    (xq, sx), (wq, sw) = quantize_rows(x), quantize_weight(w)
    want = ref.linear(_read_back(xq, sx), _read_back(wq, sw), b, activation="silu", residual=r)
    got = linear_fp8(xq, sx, wq, sw, b, activation="silu", residual=r)
    assert_rel_close(got, want, BOUNDS[torch.bfloat16])
    if torch.cuda.get_device_capability() >= (9, 0) and K % 16 == 0 and N % 16 == 0:  # cuBLASLt's fp8 needs both
        peer = torch._scaled_mm(xq, wq.t(), scale_a=sx[:, None], scale_b=sw[None, :], out_dtype=torch.float32)
        plain = linear_fp8(xq, sx, wq, sw, out_dtype=torch.float32)
        # both promote the tensor cores' ~14-bit running sums to fp32 every so many products (ours
        # every BLOCK_K = 128, cuBLAS by its own schedule): apart by that rounding, well under 1e-3
        assert_rel_close(plain, peer, 1e-3)
