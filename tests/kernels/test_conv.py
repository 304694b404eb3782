"""kernels/conv: reference vs the model's ``nn.Conv1d`` path, then the Triton kernel vs the reference.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET is set
before ``kernels.conv`` decorates it); with CUDA the ``gpu`` tests run it compiled at model
sizes. The output buffer is filled with NaN before each run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.conv import ConvConfig, causal_depthwise_conv, configs
from kernels.conv import reference as ref
from tests.kernels._support import CUDA, DEVICE, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

# (rtol, atol) against the fp32 reference; outputs are O(1). bf16 rounding ≤ 2^-8 relative
# (2^-7 under the interpreter, which truncates fp32 → bf16).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in TOLERANCES]


def _inputs(
    B: int, T: int, C: int, K: int, dtype: torch.dtype, *, bias: bool, device: torch.device, gen: torch.Generator
):
    x = torch.randn(B, T, C, generator=gen)
    w = torch.randn(C, K, generator=gen) / K**0.5
    b = torch.randn(C, generator=gen) if bias else None
    return tuple(None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, b))


def _model_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The model's path (nas.models.mixers._HeadsMixer): Conv1d(groups=C, padding=K−1) on
    ``[B, C, T]``, first T outputs kept, back to ``[B, T, C]``."""
    C, K = w.shape
    conv = nn.Conv1d(C, C, K, groups=C, padding=K - 1, bias=b is not None).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        conv.weight.copy_(w[:, None, :])
        if b is not None:
            conv.bias.copy_(b)
        return conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


def _check(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype, config: ConvConfig | None = None
) -> None:
    """The kernel into a NaN-poisoned buffer vs the fp32 reference on the same inputs."""
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    y = causal_depthwise_conv(x, w, b, out=out, config=config)
    assert y.data_ptr() == out.data_ptr()
    assert torch.isfinite(y).all(), "an output element was not written (NaN poison left)"
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(y.float().cpu(), ref.causal_depthwise_conv(x, w, b).cpu(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# The reference against the model's nn.Conv1d path.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 3, 4])
def test_reference_matches_model_conv1d(K: int) -> None:
    x, w, b = _inputs(2, 37, 48, K, torch.float32, bias=True, device=torch.device("cpu"), gen=_gen("ref", K))
    torch.testing.assert_close(ref.causal_depthwise_conv(x, w, b), _model_conv(x, w, b))


def test_reference_is_causal() -> None:
    x, w, b = _inputs(1, 20, 8, 4, torch.float32, bias=True, device=torch.device("cpu"), gen=_gen("causal"))
    changed = x.clone()
    changed[:, 10:] += 1.0
    before, after = ref.causal_depthwise_conv(x, w, b), ref.causal_depthwise_conv(changed, w, b)
    assert torch.equal(before[:, :10], after[:, :10]) and not torch.equal(before[:, 10:], after[:, 10:])


# ---------------------------------------------------------------------------------------------
# Interpreter: T = 37 and C = 48 over 16 × 32 tiles, so the causal halo crosses tile edges.
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("K", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_matches_reference(dtype: torch.dtype, K: int, bias: bool) -> None:
    x, w, b = _inputs(2, 37, 48, K, dtype, bias=bias, device=torch.device("cpu"), gen=_gen(dtype, K, bias))
    _check(x, w, b, dtype)


@requires_interpreter
def test_interpreter_strided_inputs() -> None:
    """x as the model has it: one third of a qkv buffer (row stride 3·C), and a ``[B, C, T]`` transpose."""
    gen = _gen("strided")
    qkv = torch.randn(2, 37, 3 * 40, generator=gen)
    w, b = torch.randn(40, 3, generator=gen), torch.randn(40, generator=gen)
    _check(qkv[..., 40:80], w, b, torch.float32)
    _check(torch.randn(2, 40, 37, generator=gen).transpose(1, 2), w, b, torch.float32)


# Every tile the kernel may be launched with.
EVERY_CONFIG = [
    pytest.param(c, id=f"{c.block_t}x{c.block_c}w{c.num_warps}")
    for c in dict.fromkeys((configs.HOPPER, configs.DEFAULT, configs.INTERPRETER))
]


@requires_interpreter
@pytest.mark.parametrize("config", EVERY_CONFIG)
def test_every_config(config: ConvConfig) -> None:
    """The contract over every config, run as given: T = 150 and C = 200 ragged against every tile."""
    x, w, b = _inputs(2, 150, 200, 4, torch.float32, bias=True, device=DEVICE, gen=_gen("every", config))
    _check(x, w, b, torch.float32, config)


def test_bad_arguments_name_the_field() -> None:
    x = torch.randn(2, 5, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"x must be \[B, T, C\]"):
        causal_depthwise_conv(x[0], torch.randn(8, 4, device=DEVICE))
    with pytest.raises(ValueError, match=r"weight must have shape \[8, 4\]"):
        causal_depthwise_conv(x, torch.randn(9, 4, device=DEVICE))
    with pytest.raises(ValueError, match=r"bias must have shape \[8\]"):
        causal_depthwise_conv(x, torch.randn(8, 4, device=DEVICE), torch.randn(3, device=DEVICE))
    with pytest.raises(ValueError, match="K must be >= 1"):
        causal_depthwise_conv(x, torch.randn(8, 0, device=DEVICE))


# ---------------------------------------------------------------------------------------------
# GPU: compiled at model sizes (C = 3·d), against the reference and the model's cuDNN path.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,C,K", [(4, 2049, 1536, 4), (3, 37, 200, 3)], ids=str)
def test_gpu_matches_reference_and_model(B: int, T: int, C: int, K: int, dtype: torch.dtype) -> None:
    x, w, b = _inputs(B, T, C, K, dtype, bias=True, device=CUDA, gen=_gen("gpu", B, T, C, K, dtype))
    _check(x, w, b, dtype)
    # Each side rounds once to dtype (twice the tolerance); in fp32 cuDNN may use TF32 (~1e-3).
    tol = max(2 * TOLERANCES[dtype][0], 2e-3 if dtype == torch.float32 else 0.0)
    torch.testing.assert_close(causal_depthwise_conv(x, w, b).float(), _model_conv(x, w, b).float(), rtol=tol, atol=tol)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("config", EVERY_CONFIG)
def test_gpu_every_config(config: ConvConfig) -> None:
    x, w, b = _inputs(3, 1000, 1000, 4, torch.bfloat16, bias=True, device=CUDA, gen=_gen("gpu-every", config))
    _check(x, w, b, torch.bfloat16, config)


# ---------------------------------------------------------------------------------------------
# The decode step (kernels/conv/decode.py): token by token from a zero state, against the
# convolution over the whole sequence.
# ---------------------------------------------------------------------------------------------


def _steps_match_sequence(B: int, T: int, C: int, K: int, dtype: torch.dtype, device: torch.device) -> None:
    """T steps of ``causal_conv_step`` from a zero state equal ``causal_depthwise_conv`` over the
    sequence (the fp32 reference), and the state ends as the last K − 1 inputs; the reference step
    does the same in fp32."""
    from kernels.conv.decode import causal_conv_step

    x, w, b = _inputs(B, T, C, K, dtype, bias=True, device=device, gen=_gen("step", B, T, C, K, dtype))
    state = torch.zeros(B, K - 1, C, device=device, dtype=dtype)
    state_ref = torch.zeros(B, K - 1, C, device=device, dtype=torch.float32)
    ys = [causal_conv_step(x[:, t], state, w, b) for t in range(T)]
    ys_ref = [ref.causal_conv_step_ref(x[:, t], state_ref, w, b) for t in range(T)]
    expected = ref.causal_depthwise_conv(x, w, b)
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(torch.stack(ys, 1).float(), expected, rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.stack(ys_ref, 1), expected, rtol=1e-5, atol=1e-5)
    tail = torch.zeros(B, K - 1, C, device=device, dtype=dtype)  # the last K − 1 inputs, zero-padded
    keep = min(T, K - 1)
    if keep:
        tail[:, K - 1 - keep :] = x[:, T - keep :]
    assert torch.equal(state, tail) and torch.equal(state_ref, tail.float())


@requires_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 2, 4, 8, 13, 16])
def test_step_matches_sequence(K: int, dtype: torch.dtype) -> None:
    """Odd batch and channels (C = 37 over two 32-channel programs), T longer and shorter than K."""
    _steps_match_sequence(3, 11, 37, K, dtype, DEVICE)
    _steps_match_sequence(1, 3, 5, K, dtype, DEVICE)


@requires_interpreter
def test_step_bad_arguments_raise() -> None:
    from kernels.conv.decode import causal_conv_step

    x, w, b = torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(8)
    with pytest.raises(ValueError, match=r"state must have shape \[2, 3, 8\]"):
        causal_conv_step(x, torch.zeros(2, 2, 8), w, b)
    with pytest.raises(ValueError, match="K must be in 1..16"):
        causal_conv_step(x, torch.zeros(2, 16, 8), torch.zeros(8, 17), b)
    with pytest.raises(ValueError, match="state must be contiguous"):
        causal_conv_step(x, torch.zeros(2, 8, 3).transpose(1, 2), w, b)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 4, 8, 16])
def test_gpu_step_matches_sequence(K: int, dtype: torch.dtype) -> None:
    _steps_match_sequence(5, 20, 1536 + 7, K, dtype, CUDA)


def test_the_step_takes_every_short_conv_a_space_may_hold() -> None:
    """A layer's ``short_conv`` is validated up to a limit (``nas.spec``); the decode step must
    run every length up to it (a longer one once failed every decode of such an architecture)."""
    from kernels.conv.decode import MAX_KERNEL
    from nas.spec import LayerSpec

    LayerSpec("attention", 1, None, MAX_KERNEL, 0.0)  # accepted
    with pytest.raises(ValueError, match="short_conv"):
        LayerSpec("attention", 1, None, MAX_KERNEL + 1, 0.0)
