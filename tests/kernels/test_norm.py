"""kernels/norm: reference vs ``nn.LayerNorm`` / ``nn.RMSNorm``, then the Triton kernel vs the reference.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET is set
before ``kernels.norm`` decorates it); with CUDA the ``gpu`` tests run it compiled at model
sizes. Both outputs (y and the residual stream h) are filled with NaN before each run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.norm import NormConfig, configs, layer_norm, rms_norm
from kernels.norm import reference as ref
from tests.kernels._support import CUDA, DEVICE, INTERPRETED, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

# y vs the fp32 reference: (rtol, atol). y is O(1), so atol is absolute; bf16 output rounding is
# ≤ 2^-8 relative (2^-7 under the interpreter, which truncates fp32 → bf16).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}
# h = x + residual vs the reference's rounding of the exact sum: equal on the GPU; under the
# interpreter a bf16 h may be truncated instead, one ulp (2^-7 relative) below.
H_RTOL = {torch.bfloat16: 2**-7 if INTERPRETED else 0.0}
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in TOLERANCES]
KINDS = ["layer_norm", "rms_norm"]


def _inputs(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    residual: bool,
    bias: bool,
    device: torch.device,
    gen: torch.Generator,
):
    N = shape[-1]
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(device=device, dtype=dtype)  # non-zero mean
    r = torch.randn(shape, generator=gen).to(device=device, dtype=dtype) if residual else None
    w = (1 + 0.3 * torch.randn(N, generator=gen)).to(device)  # fp32 params, as the model keeps them
    b = (0.3 * torch.randn(N, generator=gen)).to(device) if bias else None
    return x, r, w, b


def _run(kind: str, x, r, w, b, eps: float = 1e-5, config: NormConfig | None = None):
    """The kernel into NaN-poisoned buffers, and the reference on the same inputs."""
    out = torch.full_like(x, float("nan"))
    kwargs = dict(residual=r, out=out, config=config)
    if r is not None:
        kwargs["residual_out"] = torch.full_like(x, float("nan"))
    if kind == "layer_norm":
        got, want = layer_norm(x, w, b, eps, **kwargs), ref.layer_norm(x, w, b, eps, residual=r)
    else:
        got, want = rms_norm(x, w, eps, **kwargs), ref.rms_norm(x, w, eps, residual=r)
    got = got if r is not None else (got, None)
    want = want if r is not None else (want, None)
    assert got[0].data_ptr() == out.data_ptr()
    return got, want


def _assert_close(got, want, dtype: torch.dtype) -> None:
    (y, h), (y_ref, h_ref) = got, want
    assert torch.isfinite(y).all(), "a y element was not written (NaN poison left)"
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(y.float().cpu(), y_ref.float().cpu(), rtol=rtol, atol=atol)
    if h is not None:
        assert h.dtype == dtype and torch.isfinite(h).all(), "an h element was not written (NaN poison left)"
        torch.testing.assert_close(h.cpu(), h_ref.cpu(), rtol=H_RTOL.get(dtype, 0.0), atol=0.0)


# ---------------------------------------------------------------------------------------------
# The reference against torch's modules.
# ---------------------------------------------------------------------------------------------


def test_reference_matches_torch_modules() -> None:
    gen = _gen("modules")
    x, r = torch.randn(37, 48, generator=gen) * 3 + 1, torch.randn(37, 48, generator=gen)
    ln, rms = nn.LayerNorm(48), nn.RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        for p in (ln.weight, ln.bias, rms.weight):
            p.normal_(generator=gen)
    torch.testing.assert_close(ref.layer_norm(x, ln.weight, ln.bias), ln(x))
    torch.testing.assert_close(ref.rms_norm(x, rms.weight), rms(x))
    y, h = ref.layer_norm(x, ln.weight, ln.bias, residual=r)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, ln(x + r))


# ---------------------------------------------------------------------------------------------
# Interpreter: M = 37 rows (a ragged last program of 4 rows), N = 48 (masked to BLOCK_N = 64).
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("residual", [False, True], ids=["no-res", "res"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_interpreter_matches_reference(kind: str, dtype: torch.dtype, residual: bool) -> None:
    inputs = _inputs(
        (37, 48), dtype, residual=residual, bias=True, device=torch.device("cpu"), gen=_gen(kind, dtype, residual)
    )
    _assert_close(*_run(kind, *inputs), dtype)


@requires_interpreter
def test_interpreter_leading_dims_no_bias_other_eps_and_config() -> None:
    inputs = _inputs(
        (3, 13, 50), torch.float32, residual=True, bias=False, device=torch.device("cpu"), gen=_gen("lead")
    )
    _assert_close(*_run("layer_norm", *inputs, eps=1e-3, config=NormConfig(rows=8, num_warps=2)), torch.float32)
    x = inputs[0]
    assert layer_norm(x[:0], inputs[2], None).shape == (0, 13, 50)


# The config is a function of the row width: one width per power-of-two bucket of BLOCK_N (1 to
# MAX_N), each one past a power of two so the row is masked.
EVERY_WIDTH = [
    pytest.param(n, id=f"N{n}-rows{configs.norm_config(n).rows}w{configs.norm_config(n).num_warps}")
    for n in (1, *(2**i + 1 for i in range(14)))
]


@requires_interpreter
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N", EVERY_WIDTH)
def test_every_config(N: int, kind: str) -> None:
    """The contract over every config a GPU run picks (``norm_config(N)``), run as given on 5 rows."""
    inputs = _inputs((5, N), torch.float32, residual=True, bias=True, device=torch.device("cpu"), gen=_gen("every", N))
    _assert_close(*_run(kind, *inputs, config=configs.norm_config(N)), torch.float32)


def test_bad_arguments_name_the_field() -> None:
    x, w = torch.randn(4, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \[8\]"):
        layer_norm(x, torch.randn(7, device=DEVICE), None)
    with pytest.raises(ValueError, match="residual.dtype must equal"):
        rms_norm(x, w, residual=x.half())
    with pytest.raises(ValueError, match="normalized dim must be in"):
        rms_norm(torch.randn(2, 20000, device=DEVICE), torch.randn(20000, device=DEVICE))
    with pytest.raises(ValueError, match="residual_out is written only when residual is given"):
        rms_norm(x, w, residual_out=torch.empty_like(x))
    with pytest.raises(ValueError, match="out must be a contiguous"):
        layer_norm(x, w, None, out=torch.empty(4, 8, dtype=torch.float16, device=DEVICE))


# ---------------------------------------------------------------------------------------------
# GPU: compiled at model sizes.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("residual", [False, True], ids=["no-res", "res"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(4099, 1024), (1000, 200), (64, 8192)], ids=str)
def test_gpu_bf16_shapes(shape: tuple[int, int], kind: str, residual: bool) -> None:
    inputs = _inputs(shape, torch.bfloat16, residual=residual, bias=True, device=CUDA, gen=_gen(shape, kind, residual))
    _assert_close(*_run(kind, *inputs), torch.bfloat16)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d.values[0] != torch.bfloat16])
def test_gpu_other_dtypes(dtype: torch.dtype, kind: str) -> None:
    inputs = _inputs((2, 2049, 768), dtype, residual=True, bias=True, device=CUDA, gen=_gen(dtype, kind))
    _assert_close(*_run(kind, *inputs), dtype)


@pytest.mark.gpu
@requires_cuda
def test_gpu_fused_equals_unfused_model_step() -> None:
    """``layer_norm(x, residual=r)`` gives the model's ``h = x + r; y = LayerNorm(h)`` in bf16."""
    gen = _gen("model")
    x, r = (torch.randn(8, 512, 768, generator=gen).to(CUDA, torch.bfloat16) for _ in range(2))
    ln = nn.LayerNorm(768)
    with torch.no_grad():
        for p in (ln.weight, ln.bias):
            p.normal_(generator=gen)
        ln = ln.to(CUDA)
        y, h = layer_norm(x, ln.weight, ln.bias, residual=r)
        assert torch.equal(h, x + r)
        torch.testing.assert_close(y.float(), ln((x + r).float()), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N", EVERY_WIDTH)
def test_gpu_every_config(N: int, kind: str) -> None:
    inputs = _inputs((1000, N), torch.bfloat16, residual=True, bias=True, device=CUDA, gen=_gen("gpu-every", N))
    _assert_close(*_run(kind, *inputs), torch.bfloat16)
