"""kernels/linear with a norm prologue: ``linear(x, W', b', norm=...)`` normalises x's rows
(RMSNorm / LayerNorm, unit affine) inside the fused kernel's main loop, the norm's own scale and
shift folded into W' and b' once (``reference.fold_norm``); the cuBLAS route runs the norm
kernel first. Interpreter on CPU (odd M, N, K; rows whose mean is far from zero), compiled
kernels on a GPU (``gpu``). Every output buffer starts as NaN, so a skipped element fails.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.linear import configs, linear
from kernels.linear import reference as ref
from kernels.norm import layer_norm, rms_norm
from kernels.norm import reference as norm_ref
from tests.kernels._support import CUDA, DEVICE, requires_cuda, requires_interpreter, spy_norm_launches
from tests.kernels._support import seeded as _gen
from tests.kernels.test_linear import DTYPES, EVERY_CONFIG, ROUTE_TOLERANCES, TOLERANCES, _config_id

NORMS = ["rmsnorm", "layernorm"]


def _rows(M: int, K: int, gen: torch.Generator, offset: float = 20.0) -> torch.Tensor:
    """``[M, K]`` rows of spread 1-4 around per-row means up to ±``offset`` spreads: a residual
    stream's rows are rarely centred, which is what LayerNorm's statistics must survive."""
    spread = 1 + 3 * torch.rand(M, 1, generator=gen)
    return (torch.randn(M, K, generator=gen) + offset * torch.randn(M, 1, generator=gen)) * spread


def _case(M, K, N, dtype, device, gen, *, residual=True, offset=20.0):
    x = _rows(M, K, gen, offset)
    w = torch.randn(N, K, generator=gen) / K**0.5
    b = torch.randn(N, generator=gen)
    r = torch.randn(M, N, generator=gen) if residual else None
    return tuple(None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, b, r))


def _check(x, w, b, r, norm, activation, dtype, *, config=None, tolerances=TOLERANCES, **kw):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    y = linear(x, w, b, activation=activation, residual=r, norm=norm, out=out, config=config, **kw)
    expected = ref.linear(x, w, b, activation=activation, residual=r, norm=norm)
    rtol, atol, rel = tolerances[dtype]
    actual, expected = y.float().cpu(), expected.float().cpu()
    assert torch.isfinite(actual).all(), "an output element was not written (NaN poison left)"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * expected.abs().max().item())
    assert ((actual - expected).norm() / expected.norm()).item() < rel


# ---------------------------------------------------------------------------------------------
# The contract: a norm then a linear equals the unit norm then the folded linear.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", NORMS)
def test_folding_the_norms_affine_into_the_linear_keeps_the_modules_result(kind: str) -> None:
    gen = _gen("fold", kind)
    K, N = 48, 40
    norm = nn.LayerNorm(K) if kind == "layernorm" else nn.RMSNorm(K, eps=1e-5)
    layer = nn.Linear(K, N)
    with torch.no_grad():  # a scale and shift far from the (1, 0) they start at
        norm.weight.copy_(torch.randn(K, generator=gen))
        if kind == "layernorm":
            norm.bias.copy_(torch.randn(K, generator=gen))
    x = _rows(37, K, gen)
    w, b = ref.fold_norm(norm.weight, getattr(norm, "bias", None), layer.weight, layer.bias)
    with torch.no_grad():
        expected = layer(norm(x))
    torch.testing.assert_close(ref.linear(x, w, b, norm=kind, norm_eps=norm.eps), expected, rtol=1e-4, atol=1e-4)


def test_fold_makes_a_bias_only_from_a_shift() -> None:
    w = torch.randn(5, 3)
    assert ref.fold_norm(torch.ones(3), None, w, None)[1] is None
    _, b = ref.fold_norm(torch.ones(3), torch.tensor([1.0, 2.0, 3.0]), w, None)
    torch.testing.assert_close(b, w @ torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("kind", NORMS)
def test_norm_kernels_run_with_unit_affine(kind: str) -> None:
    """The norm kernel without weight (and bias): the cuBLAS route's norm before the matmul."""
    x = _rows(19, 40, _gen("unit", kind)).to(DEVICE)
    if kind == "rmsnorm":
        got, expected = rms_norm(x, None), norm_ref.rms_norm(x, None)
    else:
        got, expected = layer_norm(x, None, None), norm_ref.layer_norm(x, None, None)
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Interpreter: both kernels, both norms, ragged K (LayerNorm's masked tail), bf16 and fp32.
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("kernel", ["pointer", "tma"])
@pytest.mark.parametrize("K", [50, 56])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_prologue(dtype, norm, K, kernel) -> None:
    """M = 37 and N = 40 ragged against the 16-wide tiles; K = 50 leaves a masked K step (and
    keeps the TMA config on the pointer kernel: its rows are not 16-byte aligned), K = 56 is even
    in fp32 rows for the TMA kernel."""
    config = configs.INTERPRETER_TMA if kernel == "tma" else configs.INTERPRETER
    inputs = _case(37, K, 40, dtype, DEVICE, _gen("prologue", dtype, norm, K, kernel))
    _check(*inputs, norm, "gelu", dtype, config=config)


@requires_interpreter
@pytest.mark.parametrize("kernel", ["pointer", "tma"])
def test_interpreter_layernorm_survives_a_mean_far_from_zero(kernel) -> None:
    """Rows whose mean is ~300 spreads (fp32): the variance taken as E[x²] − mean² keeps only
    ~2⁻²⁴·300² of it, a 0.7 % error in the output (measured with the shift removed); shifted by
    the row's first element the output stays within 5e-5 of a float64 reference. What is left
    is x·Wᵀ − mean·Σw, which loses ~2⁻²⁴·|mean|/std of the result: fine for 16-bit outputs."""
    config = configs.INTERPRETER_TMA if kernel == "tma" else configs.INTERPRETER
    x, w, b, _ = _case(37, 56, 40, torch.float32, DEVICE, _gen("far", kernel), residual=False, offset=300.0)
    y = linear(x, w, b, norm="layernorm", config=config)
    exact = ref.linear(x.double(), w.double(), b.double(), norm="layernorm")
    assert ((y.double() - exact).norm() / exact.norm()).item() < 2e-4
    assert ((y.double() - exact).abs().max() / exact.abs().max()).item() < 2e-4


@requires_interpreter
@pytest.mark.parametrize("kernel", ["pointer", "tma"])
@pytest.mark.parametrize("norm", NORMS)
def test_interpreter_eps_and_strided_rows(norm, kernel) -> None:
    """Rows of spread ~1e-3 with ``norm_eps`` 1e-2 (eps dominates the variance: dropping it, or
    passing the default instead, changes the output many times over), read through a row-strided
    view (stride 64 for K = 56: the TMA kernel's own load of the statistics must follow it)."""
    config = configs.INTERPRETER_TMA if kernel == "tma" else configs.INTERPRETER
    gen = _gen("eps", norm, kernel)
    big = _rows(37, 64, gen, offset=3.0) * 1e-3
    x = big[:, :56]
    w = torch.randn(40, 56, generator=gen) / 56**0.5
    b = torch.randn(40, generator=gen)
    y = linear(x, w, b, norm=norm, norm_eps=1e-2, config=config)
    expected = ref.linear(x, w, b, norm=norm, norm_eps=1e-2)
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert not torch.allclose(expected, ref.linear(x, w, b, norm=norm), rtol=1e-2, atol=1e-2)


@requires_interpreter
@pytest.mark.parametrize("norm", NORMS)
def test_long_k_runs_the_norm_as_its_own_launch(norm, monkeypatch) -> None:
    """Past ``fuses_norm`` (K 200 > NORM_FUSED_MAX_K) the norm kernel runs first and the fused
    kernel without its prologue; at K 96 the fused kernel takes it (no norm launch)."""
    import kernels.linear.triton as lt

    launches = spy_norm_launches(monkeypatch)
    for K, expect in ((200, 1), (96, 0)):
        assert configs.fuses_norm(configs.m_bucket(37), K) == (expect == 0)
        x, w, b, r = _case(37, K, 40, torch.float32, DEVICE, _gen("long-k", norm, K))
        _check(x, w, b, r, norm, "gelu", torch.float32, tolerances={torch.float32: (2e-5, 2e-5, 2e-5)})
        assert len(launches) == expect and lt.last_route() == "triton", (K, launches)
        launches.clear()


@requires_interpreter
@pytest.mark.parametrize("norm", NORMS)
def test_forcing_the_fused_route_fuses_the_norm_at_any_k(norm, monkeypatch) -> None:
    """``set_route("triton")`` runs the norm inside the fused kernel even past ``fuses_norm``
    (K 200): no norm launch of its own, the same result."""
    import kernels.linear.triton as lt

    launches = spy_norm_launches(monkeypatch)
    assert not configs.fuses_norm(configs.m_bucket(37), 200)
    lt.set_route("triton")
    try:
        x, w, b, r = _case(37, 200, 40, torch.float32, DEVICE, _gen("forced-fused", norm))
        _check(x, w, b, r, norm, "gelu", torch.float32, tolerances={torch.float32: (2e-5, 2e-5, 2e-5)})
        assert lt.last_route() == "triton"
    finally:
        lt.set_route(None)
    assert launches == [], launches


@requires_interpreter
def test_weight_sums_given_or_computed_agree() -> None:
    x, w, b, r = _case(21, 48, 24, torch.float32, DEVICE, _gen("sums"))
    given = linear(x, w, b, residual=r, norm="layernorm", weight_sums=ref.weight_sums(w))
    torch.testing.assert_close(given, linear(x, w, b, residual=r, norm="layernorm"), rtol=0, atol=0)
    wrong = ref.weight_sums(w) + 1  # the kernel does read what it is given
    assert not torch.allclose(given, linear(x, w, b, residual=r, norm="layernorm", weight_sums=wrong))
    strided = torch.stack([ref.weight_sums(w), torch.zeros(24)], 1)[:, 0]  # stride 2: read as given
    torch.testing.assert_close(linear(x, w, b, residual=r, norm="layernorm", weight_sums=strided), given)


@requires_interpreter
@pytest.mark.parametrize("config", EVERY_CONFIG)
def test_every_config_with_the_prologue(config) -> None:
    """Every tiling a tuner may be handed (or a sweep may pick), with the LayerNorm prologue
    (the heavier of the two): M = 37, N = 40, K = 56."""
    inputs = _case(37, 56, 40, torch.float32, DEVICE, _gen("every-norm", config))
    _check(*inputs, "layernorm", "silu", torch.float32, config=config)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cublas_route_runs_the_norm_kernel_first(dtype, norm, monkeypatch) -> None:
    import kernels.linear.triton as lt

    calls = spy_norm_launches(monkeypatch)
    lt.set_route("cublas")
    try:
        inputs = _case(37, 48, 40, dtype, DEVICE, _gen("cublas-norm", dtype, norm))
        _check(*inputs, norm, "gelu", dtype, tolerances=ROUTE_TOLERANCES)
        assert lt.last_route() == "cublas"
    finally:
        lt.set_route(None)
    assert len(calls) == 1, "the cuBLAS route did not run the norm kernel once"


def test_bad_norm_arguments_name_the_field() -> None:
    x, w = torch.randn(4, 8, device=DEVICE), torch.randn(6, 8, device=DEVICE)
    with pytest.raises(ValueError, match="norm must be one of"):
        linear(x, w, norm="batchnorm")
    with pytest.raises(ValueError, match=r"weight_sums must be fp32 \[6\]"):
        linear(x, w, norm="layernorm", weight_sums=torch.zeros(5, device=DEVICE))
    with pytest.raises(ValueError, match=r"weight_sums must be fp32 \[6\]"):
        linear(x, w, norm="layernorm", weight_sums=torch.zeros(6, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match="weight_sums is read only with norm='layernorm'"):
        linear(x, w, norm="rmsnorm", weight_sums=torch.zeros(6, device=DEVICE))


def test_route_rule_with_a_norm() -> None:
    """With a norm the fused kernel takes K up to NORM_FUSED_MAX_K while x has fewer than
    NORM_FUSED_MAX_X elements, whatever else the rule says but K % 16 ≠ 0 (rows the fused kernel
    loads without vectors: the norm's launch, then cuBLAS); elsewhere (longer K, more rows) the
    rule without the norm decides; rows that are not 16-byte aligned never go to cuBLAS."""
    limit = configs.NORM_FUSED_MAX_X
    shapes = [(768, 128, None), (5120, 112, "gelu"), (1024, 128, "relu"), (4096, 96, "gelu"), (288, 96, None)]
    for cap in ((9, 0), (8, 0)):
        for n, k, act in shapes:
            below = configs.m_bucket(-(-limit // k)) // 2  # the largest bucket under the limit
            assert below * k < limit <= 2 * below * k
            if cap == (9, 0):  # without a norm every one of these goes to cuBLAS there
                assert configs.prefers_cublas(cap, below, n, k, act, False), (n, k, act)
            assert not configs.prefers_cublas(cap, below, n, k, act, False, norm=True), (n, k, act)
            assert configs.prefers_cublas(cap, 2 * below, n, k, act, False, norm=True) == configs.prefers_cublas(
                cap, 2 * below, n, k, act, False
            )
        for m in (16, 256, 4096):  # K past NORM_FUSED_MAX_K: the norm changes nothing
            for n, k, act in ((768, 256, None), (808, 200, "gelu"), (1536, 512, None)):
                assert configs.prefers_cublas(cap, m, n, k, act, False, norm=True) == configs.prefers_cublas(
                    cap, m, n, k, act, False
                )
    for cap in ((9, 0), (8, 0)):
        for m, k in ((16, 24), (256, 120), (4096, 72)):  # under both fusing limits, K % 16 = 8
            assert configs.fuses_norm(m, k) and configs.prefers_cublas(cap, m, 512, k, "gelu", False, norm=True)
            assert not configs.norm_in_kernel(cap, m, 512, k, "gelu"), (cap, m, k)
            assert configs.norm_in_kernel(cap, m, 512, k + 8, "gelu"), (cap, m, k + 8)
    assert configs.prefers_cublas((9, 0), 256, 1536, 512, None, False, norm=True), "long K: norm + cuBLAS"
    assert not configs.prefers_cublas((9, 0), 16384, 5003, 512, None, False, norm=True), "unaligned rows"


def test_a_wide_readout_runs_cublas_after_the_norm_on_sm90():
    """A plain output (no activation, no residual) of N ≥ NORM_FUSED_WIDE_N, or of M bucket × N ≥
    CUBLAS_GELU_MIN_OUTPUT with N ≥ CUBLAS_MIN_N, takes cuBLAS with the norm as its own launch on
    sm_90 even under the norm-fusing limits; a narrower one, one with an epilogue to fuse, and any
    other GPU keep the norm in the fused kernel."""
    wide, n_min, out_min = configs.NORM_FUSED_WIDE_N, configs.CUBLAS_MIN_N, configs.CUBLAS_GELU_MIN_OUTPUT
    for m in (1, 8, 32, 256, 4096):
        for k in (16, 48, 64, 96, 128):
            if not configs.fuses_norm(m, k):
                continue
            for n in (wide, 50272, n_min, 8192, n_min - 8, 1000):
                plain = n >= wide or (n >= n_min and m * n >= out_min)
                assert configs.norm_in_kernel((9, 0), m, n, k, None) != plain, (m, n, k)
                assert configs.norm_in_kernel((8, 0), m, n, k, None), (m, n, k)
                assert configs.norm_in_kernel((9, 0), m, n, k, None, residual=True), (m, n, k)
                assert configs.norm_in_kernel((9, 0), m, n, k, "silu"), (m, n, k)
    assert not configs.norm_in_kernel((9, 0), 4096, 4096, 64, None)  # 2^24 outputs: the boundary is cuBLAS's
    assert configs.norm_in_kernel((9, 0), 2048, 4096, 64, None)


# ---------------------------------------------------------------------------------------------
# GPU: the compiled kernels, bf16, both kernels and the tuned path.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("config", [pytest.param(c, id=_config_id(c)) for c in dict.fromkeys(configs.ALL)])
@pytest.mark.parametrize("norm", NORMS)
def test_gpu_every_tuner_config(norm, config) -> None:
    """Every tiling a tuner may be handed, with the prologue: M 1000, K 384 (16-byte rows, so TMA
    tilings run their kernel), N 808, bias, GELU, residual. The largest tilings went wrong here
    (and the 64×128 one at larger M) while the row sums came from the dot's tile."""
    inputs = _case(1000, 384, 808, torch.bfloat16, CUDA, _gen("gpu-cfg", norm, config))
    _check(*inputs, norm, "gelu", torch.bfloat16, config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    "M,K,N", [(256, 96, 288), (333, 200, 808), (1024, 512, 1536), (2053, 384, 1024), (4096, 128, 512), (16384, 96, 288)]
)
@pytest.mark.parametrize("norm", NORMS)
def test_gpu_default_route(norm, M, K, N) -> None:
    """The route and tiling chosen per shape (the fused kernel at short K and small x, the rule
    elsewhere), no activation and no residual: what the model's qkv projection and head run;
    (333, 200, 808): K rows not 16-divisible, (16384, 96): past NORM_FUSED_MAX_X."""
    import kernels.linear.triton as lt

    x, w, b, _ = _case(M, K, N, torch.bfloat16, CUDA, _gen("gpu-route", norm, M, K, N), residual=False)
    cublas = configs.prefers_cublas(
        torch.cuda.get_device_capability(), configs.m_bucket(M), N, K, None, False, norm=True
    )
    _check(x, w, b, None, norm, None, torch.bfloat16, tolerances=ROUTE_TOLERANCES if cublas else TOLERANCES)
    assert lt.last_route() == ("cublas" if cublas else "triton")
