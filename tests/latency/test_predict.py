"""FLOP/byte accounting by hand, roofline properties of ``predict``, and ``memory``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hardware_profiles import Calibration, HardwareProfile, load_profile
from nas.latency import (
    DEFAULT_BANDWIDTH_FRACTION,
    DEFAULT_FLOPS_FRACTION,
    STATE_BYTES,
    Latency,
    LatencyShape,
    count_params,
    memory,
    op_costs,
    parse_shape,
    predict,
)
from nas.spec import ArchSpec, LayerSpec

ATTN = LayerSpec("attention", heads=4)
LIN = LayerSpec("linear_attention", heads=4, feature_map="elu+1")


def _arch(*layers: LayerSpec, d: int = 256, readout: str = "token", vocab: int = 1000, n_out: int = 1000) -> ArchSpec:
    return ArchSpec(d, layers, vocab, n_out, readout)


def _op(arch: ArchSpec, shape: LatencyShape, name: str, dtype: str = "bf16"):
    return next(op for op in op_costs(arch, shape, dtype=dtype) if op.name == name)


@pytest.fixture(scope="module")
def h200() -> HardwareProfile:
    """The h200 profile without its kernel model: these tests pin the roofline, which every
    uncalibrated prediction still uses (the calibrated model: test_calibration.py)."""
    profile = load_profile("h200")
    return dataclasses.replace(profile, calibrated=dataclasses.replace(profile.calibrated, kernel_model_json=None))


@pytest.fixture(autouse=True)
def roofline_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No transfer from the shipped calibration either."""
    from nas.latency import _predict

    monkeypatch.setattr(_predict, "_calibrated_reference", lambda: None)


# --- shapes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "batch", "seq"), [("8x1024", 8, 1024), ("1x1", 1, 1), (" 3X63 ", 3, 63)])
def test_parse_shape(text: str, batch: int, seq: int) -> None:
    shape = parse_shape(text)
    assert shape == LatencyShape(batch, seq) and shape.tokens == batch * seq
    assert str(shape) == f"{batch}x{seq}"


@pytest.mark.parametrize(
    "text", ["8x", "x8", "0x5", "5x0", "abc", "8*1024", "", "8x1024x2", "-1x5", "1.5x4", "8 x 1024"]
)
def test_parse_shape_rejects_malformed(text: str) -> None:
    message = r"invalid shape .*: expected BATCHxSEQ_LEN with positive integers, e\.g\. '8x1024'"
    with pytest.raises(ValueError, match=message) as info:
        parse_shape(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("batch", "seq"), [(0, 4), (4, -1), (True, 4), (2.0, 4)])
def test_latency_shape_validates(batch: object, seq: object) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        LatencyShape(batch, seq)  # type: ignore[arg-type]


# --- FLOPs, bytes, kernels, params by hand --------------------------------------------------


def test_matmul_flops_are_2mnk() -> None:
    d, heads, ratio = 96, 3, 2.5
    arch = _arch(LayerSpec("attention", heads=heads, mlp_ratio=ratio), d=d, n_out=17)
    shape = LatencyShape(3, 63)
    m, hidden = 3 * 63, 240
    assert _op(arch, shape, "layers.0.qkv").flops == 2 * m * (3 * d) * d
    assert _op(arch, shape, "layers.0.out").flops == 2 * m * d * d
    assert _op(arch, shape, "layers.0.mlp_up").flops == 2 * m * hidden * d
    assert _op(arch, shape, "layers.0.mlp_down").flops == 2 * m * d * hidden
    assert _op(arch, shape, "head").flops == 2 * m * 17 * d
    last = dataclasses.replace(arch, readout="last")
    assert _op(last, shape, "head").flops == 2 * 3 * 17 * d  # one row per sequence


def test_matmul_bytes_by_hand() -> None:
    d = 64
    arch = _arch(LayerSpec("none", mlp_ratio=4), d=d)
    shape = LatencyShape(2, 10)
    m, hidden = 20, 256
    up = _op(arch, shape, "layers.0.mlp_up", dtype="fp32")  # reads x, W, b; writes y
    assert up.bytes == 4 * (m * d + d * hidden + hidden + m * hidden)
    down = _op(arch, shape, "layers.0.mlp_down", dtype="bf16")  # also reads the residual
    assert down.bytes == 2 * (m * hidden + hidden * d + d + m * d + m * d)


def test_attention_flops_by_hand() -> None:
    arch = _arch(ATTN, d=64)
    batch, seq = 2, 63
    pairs = seq * (seq + 1) // 2  # causal: key j <= query i
    assert _op(arch, LatencyShape(batch, seq), "layers.0.attention").flops == 4 * batch * pairs * 64


def test_linear_attention_flops_by_hand() -> None:
    d, heads, seq = 64, 4, 150  # chunks of 64: 64 + 64 + 22
    arch = _arch(LayerSpec("linear_attention", heads=heads, feature_map="relu"), d=d)
    d_head = d // heads
    intra = 4 * d_head * (2 * 64**2 + 22**2)
    inter = 4 * seq * d_head**2
    assert _op(arch, LatencyShape(1, seq), "layers.0.linear_attention").flops == heads * (intra + inter)


def test_attention_grows_quadratically_and_linear_attention_linearly() -> None:
    arch = _arch(ATTN, LIN, d=256)
    short, long = LatencyShape(2, 1024), LatencyShape(2, 4096)
    attn = _op(arch, long, "layers.0.attention").flops / _op(arch, short, "layers.0.attention").flops
    lin = _op(arch, long, "layers.1.linear_attention").flops / _op(arch, short, "layers.1.linear_attention").flops
    assert 15 < attn < 17
    assert lin == pytest.approx(4)


def test_kernel_count_convention() -> None:
    arch = _arch(
        LayerSpec("attention", heads=2),  # 7: norm qkv attn out norm up down
        LayerSpec("none", mlp_ratio=2),  # 3: norm up down
        LayerSpec("linear_attention", heads=2, feature_map="identity", mlp_ratio=0),  # 4
        LayerSpec("none", mlp_ratio=0),  # 0: identity layer
        d=32,
    )
    ops = op_costs(arch, LatencyShape(1, 5))
    assert sum(op.kernels for op in ops) == 1 + 7 + 3 + 4 + 0 + 2  # + embed, final norm, head
    assert [op.name for op in ops][:3] == ["embed", "layers.0.mixer_norm", "layers.0.qkv"]


def test_count_params_by_hand() -> None:
    arch = ArchSpec(
        8,
        (
            LayerSpec("attention", heads=2, mlp_ratio=2),  # layernorm
            LayerSpec("linear_attention", heads=2, feature_map="relu", mlp_ratio=0, norm="rmsnorm"),
            LayerSpec("none", mlp_ratio=1.5, norm="rmsnorm"),
            LayerSpec("none", mlp_ratio=0),  # no params
        ),
        vocab_size=11,
        n_out=3,
    )
    embedding = 11 * 8
    qkv, out = 3 * 8 * 8 + 3 * 8, 8 * 8 + 8
    layer0 = 16 + qkv + out + 16 + (8 * 16 + 16) + (16 * 8 + 8)  # two layernorms, H = 16
    layer1 = 8 + qkv + out  # one rmsnorm, no MLP
    layer2 = 8 + (8 * 12 + 12) + (12 * 8 + 8)  # one rmsnorm, H = round(12)
    final_norm = 16  # last layer's type: layernorm
    head = 8 * 3 + 3
    assert count_params(arch) == embedding + layer0 + layer1 + layer2 + final_norm + head == 1247


# --- predict ------------------------------------------------------------------------------


def test_prediction_record(h200: HardwareProfile) -> None:
    shape = LatencyShape(4, 256)
    latency = predict(_arch(ATTN, LIN), shape, h200)
    assert latency.source == "predicted" and latency.predicted and latency.iqr_ms == 0
    assert latency.device == "h200" and latency.dtype == "bf16" and latency.shape == shape
    assert sum(ms for _, ms in latency.breakdown) == pytest.approx(latency.median_ms)
    assert Latency.from_dict(latency.to_dict()) == latency
    assert latency.to_dict()["shape"] == "4x256"


def test_long_context_linear_attention_beats_attention(h200: HardwareProfile) -> None:
    shape = LatencyShape(4, 16384)
    assert predict(_arch(LIN, LIN), shape, h200).median_ms < predict(_arch(ATTN, ATTN), shape, h200).median_ms


def test_attention_time_grows_faster_than_linear_attention(h200: HardwareProfile) -> None:
    arch = _arch(ATTN, LIN, d=512)
    short = dict(predict(arch, LatencyShape(8, 4096), h200).breakdown)
    long = dict(predict(arch, LatencyShape(8, 16384), h200).breakdown)
    assert long["layers.0.attention"] / short["layers.0.attention"] > 12
    assert long["layers.1.linear_attention"] / short["layers.1.linear_attention"] < 5


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16"])
def test_more_layers_and_wider_are_slower(h200: HardwareProfile, dtype: str) -> None:
    shape = LatencyShape(8, 1024)
    base = predict(_arch(ATTN, LIN, d=256), shape, h200, dtype=dtype).median_ms
    assert predict(_arch(ATTN, LIN, ATTN, d=256), shape, h200, dtype=dtype).median_ms > base
    assert predict(_arch(ATTN, LIN, d=512), shape, h200, dtype=dtype).median_ms > base


def test_faster_gpu_predicts_lower(h200: HardwareProfile) -> None:
    arch, shape = _arch(ATTN, ATTN, d=1024), LatencyShape(16, 2048)
    h200_ms = predict(arch, shape, h200).median_ms
    assert h200_ms < predict(arch, shape, load_profile("h100_sxm")).median_ms
    assert h200_ms * 4 < predict(arch, shape, load_profile("l4")).median_ms


def test_tiny_shape_is_launch_bound(h200: HardwareProfile) -> None:
    arch = _arch(ATTN, LIN, LayerSpec("none"), d=32, vocab=16, n_out=16)
    shape = LatencyShape(1, 8)
    launches = sum(op.kernels for op in op_costs(arch, shape))
    expected_ms = launches * h200.launch_overhead_us * 1e-3
    assert predict(arch, shape, h200).median_ms == pytest.approx(expected_ms, rel=0.02)


def test_calibration_replaces_the_defaults(h200: HardwareProfile) -> None:
    base = dataclasses.replace(h200, calibrated=Calibration())  # the documented defaults

    def ratio(arch: ArchSpec, shape: LatencyShape, calibrated: Calibration) -> float:
        slower = dataclasses.replace(h200, calibrated=calibrated)
        return predict(arch, shape, slower).median_ms / predict(arch, shape, base).median_ms

    compute_bound = (_arch(ATTN, d=2048), LatencyShape(16, 4096))
    launch_bound = (_arch(ATTN, d=32, vocab=16, n_out=16), LatencyShape(1, 4))
    memory_bound = (_arch(LayerSpec("none", mlp_ratio=0), d=1024, n_out=8), LatencyShape(16, 4096))
    half_flops = Calibration(flops_fractions=(("bf16", DEFAULT_FLOPS_FRACTION / 2),))
    double_launch = Calibration(launch_overhead_us=2 * h200.launch_overhead_us)
    half_bandwidth = Calibration(bandwidth_fraction=DEFAULT_BANDWIDTH_FRACTION / 2)
    assert ratio(*compute_bound, half_flops) == pytest.approx(2, rel=0.05)
    assert ratio(*launch_bound, double_launch) == pytest.approx(2, rel=0.05)
    assert ratio(*memory_bound, half_bandwidth) == pytest.approx(2, rel=0.05)


def test_unknown_dtype_is_rejected(h200: HardwareProfile) -> None:
    with pytest.raises(ValueError, match=r"dtype 'fp8' is not one of \['fp32', 'tf32', 'bf16', 'fp16'\]"):
        predict(_arch(ATTN), LatencyShape(1, 8), h200, dtype="fp8")


# --- memory -------------------------------------------------------------------------------


def test_memory_by_hand() -> None:
    d = 128
    arch = _arch(ATTN, LIN, LayerSpec("linear_attention", heads=2, feature_map="relu"), ATTN, d=d)
    batch, seq = 3, 100
    estimate = memory(arch, LatencyShape(batch, seq), dtype="bf16")
    assert estimate.params == count_params(arch) and estimate.weight_bytes == 2 * estimate.params
    assert estimate.kv_cache_bytes == 2 * (2 * seq * d) * batch * 2  # 2 attention layers, bf16
    state = (4 * 32**2 + 2 * 64**2) * batch * STATE_BYTES  # heads · Dh² per layer
    assert estimate.recurrent_state_bytes == state
    # Peak activation: residual + q,k,v + rotated q,k (the SDPA route) + o of the attention op,
    # or the [B·T, V] logits.
    tokens = batch * seq
    assert estimate.peak_activation_bytes == 2 * max(7 * tokens * d, tokens * (d + 1000))
    total = estimate.weight_bytes + estimate.peak_activation_bytes + estimate.kv_cache_bytes + state
    assert estimate.total_mb == pytest.approx(total / 2**20)
    assert memory(arch, LatencyShape(batch, seq), dtype="fp32").kv_cache_bytes == 2 * estimate.kv_cache_bytes


def test_memory_counts_the_two_pass_states_where_the_rule_takes_them(monkeypatch) -> None:
    """The buffers between the two passes — what ``_two_pass_states`` allocates for sm_90's launch
    planned at the estimate's SM count (bf16 states [B·H, ⌈T/chunk⌉, D, D]; with pass 1 in groups
    their fp32 totals [B·H, groups, row]; for a normalized map also z [B·H, ⌈T/chunk⌉, D] fp32) —
    are live at the mixer's op where sm_90's rule takes the two passes, for every map, on top of
    the fused route's 5 streams; not where it takes the fused kernel or the prefix forward. The
    bytes are those of the tensors the kernel really allocates (run in fp32 under the
    interpreter: 4-byte states, so the bf16 count is that less 2 bytes a state)."""
    from kernels.linear_attention import configs
    from kernels.linear_attention import triton as la
    from nas.latency import _costs

    D, heads, length = 64, 2, 4097 + 37
    d = heads * D
    plan = configs.two_pass_plan(heads, length, D, configs.TWO_PASS_HOPPER[D][0], _costs._TWO_PASS_SMS)
    assert plan.groups > 1
    k, v = torch.randn(2, 1, heads, length, D).unbind(0)
    shape = LatencyShape(1, length)
    counted = {}
    for fm in ("identity", "elu+1"):
        assert configs.forward_route((9, 0), heads, length, D, fm) == "two_pass"
        buffers = la._two_pass_states(k, v, plan, fm)
        assert buffers[0].dtype == torch.float32 and buffers[2] is not buffers[0]
        unique = {id(b): b for b in buffers}.values()
        allocated = sum(b.numel() * b.element_size() for b in unique)
        counted[fm] = allocated - 2 * buffers[0].numel()  # the same states in bf16
        layer = LayerSpec("linear_attention", heads=heads, feature_map=fm, mlp_ratio=0.0)
        arch = _arch(layer, d=d, vocab=8, n_out=8)  # vocab 8 and no MLP: the mixer's op sets the peak
        with_states = memory(arch, shape, dtype="bf16").peak_activation_bytes
        with monkeypatch.context() as m:
            m.setattr(_costs, "_two_pass_states", lambda *args: 0)
            without = memory(arch, shape, dtype="bf16").peak_activation_bytes
        assert with_states - without == counted[fm], fm
    assert counted["identity"] == 2 * heads * plan.chunks * D * D + 4 * heads * plan.groups * D * D
    assert counted["elu+1"] - counted["identity"] == 4 * heads * (plan.chunks * D + plan.groups * 256)
    identity = LayerSpec("linear_attention", heads=heads, feature_map="identity", mlp_ratio=0.0)
    fused = LatencyShape(128 // heads, 2048)  # the fused route at D = 16 (not measured there): no states
    narrow = heads * 16
    short = LatencyShape(1, 256)  # the prefix forward: no states either
    for arch_d, where in ((narrow, fused), (d, short)):
        assert configs.forward_route((9, 0), where.batch * heads, where.seq_len, arch_d // heads, "identity") != (
            "two_pass"
        )
        arch = _arch(identity, d=arch_d, vocab=8, n_out=8)
        base = memory(arch, where).peak_activation_bytes
        with monkeypatch.context() as m:
            m.setattr(_costs, "_two_pass_states", lambda *args: 0)
            assert memory(arch, where).peak_activation_bytes == base


def test_memory_of_mlp_only_model_has_no_cache() -> None:
    estimate = memory(_arch(LayerSpec("none"), d=64), LatencyShape(2, 32))
    assert estimate.kv_cache_bytes == estimate.recurrent_state_bytes == 0
    assert set(estimate.to_dict()) == {
        "params",
        "weight_bytes",
        "peak_activation_bytes",
        "kv_cache_bytes",
        "recurrent_state_bytes",
        "total_mb",
    }
