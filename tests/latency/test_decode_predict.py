"""The decode step's costs and its prediction: bytes by hand, the fitted model recovered from
rows it generated, calibrated / transferred / roofline predictions, and the fingerprint guard."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
import yaml

from hardware_profiles import load_profile
from nas.latency import CalibrationWarning, cache_memory, decode_work, predict_decode
from nas.latency import _predict as predict_module
from nas.latency._decode import (
    ALIGNED_DECODE_FEATURES,
    DECODE_FEATURES,
    DECODE_KINDS,
    KV_HEAD_DIMS,
    LEGACY_DECODE_FEATURES,
    expand_coefficients,
)
from nas.latency.calibrate_decode import (
    DECODE_SHAPES,
    MIN_ARCHS_PER_KV_CLASS,
    decode_archs,
    decode_section,
    fit_decode,
    kv_groups,
    write_decode,
)
from nas.spec import ArchSpec, LayerSpec

ATTN = LayerSpec("attention", heads=4, short_conv=4)
LIN = LayerSpec("linear_attention", heads=4, feature_map="elu+1", short_conv=4)
ENV = {"date": "2026-12-01", "gpu": "NVIDIA H200"}
# µs per launch, per MiB of weights, of KV cache at head dim 16 / 32 / 64 / 128, of state, per
# unaligned launch and per unaligned MiB of weights
COEF = [2.0, 0.3, 0.9, 0.5, 0.25, 0.2, 1.0, 0.7, 0.4]


def _arch(*layers: LayerSpec, d: int = 256) -> ArchSpec:
    return ArchSpec(d, layers, 8192, 8192)


@pytest.fixture(autouse=True)
def no_shipped_decode_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Predictions here rest on the profiles each test builds, never on a shipped calibration."""
    monkeypatch.setattr(predict_module, "_decode_reference", lambda: None)


def _bare(name: str = "h200"):
    p = load_profile(name)
    return dataclasses.replace(p, calibrated=dataclasses.replace(p.calibrated, decode_model_json=None))


def test_decode_work_bytes_by_hand() -> None:
    arch = _arch(ATTN, LIN, LayerSpec("none", mlp_ratio=2.0))
    w = decode_work(arch, 1000, 2)
    # K and V of 1000 rows x 4 heads x 64 channels, bf16, for 2 sequences; the linear layer's state is separate
    assert w.cache_bytes == 2 * 2 * 1000 * 4 * 64 * 2
    assert w.cache_bytes_by_head_dim == (0, 0, w.cache_bytes, 0)  # head dim 64
    from nas.latency import count_params

    assert w.weight_bytes == (count_params(arch) - 8192 * 256) * 2  # the embedding is gathered, not read
    assert decode_work(arch, 2000, 2).cache_bytes == 2 * w.cache_bytes
    assert decode_work(arch, 2000, 2).state_bytes == w.state_bytes  # states do not grow with the context
    assert decode_work(arch, 1000, 2).launches == decode_work(arch, 9999, 7).launches


def test_the_kv_cache_is_costed_by_the_head_dim_the_kernel_runs() -> None:
    """Each attention layer's cache bytes land in the class of its kernel head dim (24 runs as 32,
    odd or oversized dims in the nearest class), and the classes sum to the whole cache."""
    assert KV_HEAD_DIMS == (16, 32, 64, 128) and len(DECODE_FEATURES) == 5 + len(KV_HEAD_DIMS)
    d = 384
    layers = [LayerSpec("attention", heads=h) for h in (48, 16, 8, 3, 24)]  # head dims 8, 24, 48, 128, 16
    w = decode_work(ArchSpec(d, tuple(layers), 512, 512), 777, 3)
    per_layer = [2 * 777 * 3 * h * p * 2 for h, p in ((48, 16), (16, 32), (8, 64), (3, 128), (24, 16))]
    assert w.cache_bytes_by_head_dim == (per_layer[0] + per_layer[4], per_layer[1], per_layer[2], per_layer[3])
    assert w.cache_bytes == sum(per_layer)
    features = dict(zip(DECODE_FEATURES, w.features(), strict=True))
    assert features["cache_mb_d16"] == pytest.approx((per_layer[0] + per_layer[4]) / 2**20)
    assert expand_coefficients([1.0, 2.0, 3.0, 4.0]) == [1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 0.0, 0.0]
    assert expand_coefficients(COEF[:7]) == [*COEF[:7], 0.0, 0.0]  # before the unaligned rows: unpriced
    assert expand_coefficients(COEF) == COEF
    with pytest.raises(ValueError, match="9 coefficients"):
        expand_coefficients([1.0, 2.0, 3.0])


def test_padded_heads_cost_weights_not_launches() -> None:
    """Head dim 24 (d 48, 2 heads) runs as 32 with the padding in the weights: the step launches
    what an unpadded layer does, reads the wider qkv / out weights, and its conv window and cache
    are the ``TritonDecoder``'s own buffers, byte for byte."""
    import torch

    from nas.latency import count_params
    from nas.models import TritonDecoder, build, to_triton

    padded = ArchSpec(48, (LayerSpec("attention", heads=2, short_conv=4, mlp_ratio=0.0),), 64, 64)
    plain = ArchSpec(64, (LayerSpec("attention", heads=2, short_conv=4, mlp_ratio=0.0),), 64, 64)
    assert decode_work(padded, 100).launches == decode_work(plain, 100).launches
    extra = (64 - 48) * (4 * 48 + 3 + 3 * 5)  # zero qkv rows + out columns, qkv bias, conv weights + bias
    assert decode_work(padded, 100).weight_bytes == (count_params(padded) - 64 * 48 + extra) * 2
    decoder = TritonDecoder(to_triton(build(padded, seed=0), dtype=torch.bfloat16), batch=3, capacity=100)
    (buf,) = decoder.layers
    c = cache_memory(padded, 100, 3)
    assert c.conv_bytes == buf.conv.numel() * buf.conv.element_size()
    assert c.kv_cache_bytes == (buf.k.numel() + buf.v.numel()) * buf.k.element_size()


def test_fit_recovers_the_coefficients_of_rows_it_generated() -> None:
    true = [2.5, 0.30, 0.8, 0.45, 0.3, 0.22, 0.9, 0.8, 0.5]  # as COEF
    rows = []
    for arch in decode_archs(1, 48):  # every head dim, and unaligned widths, in enough architectures of every fold
        for batch, context in DECODE_SHAPES:
            x = decode_work(arch, context, batch).features()
            rows.append(
                {
                    "arch": arch.to_dict(),
                    "batch": batch,
                    "context": context,
                    "ms": 1e-3 * sum(c * v for c, v in zip(true, x, strict=True)),
                }
            )
    coef, report = fit_decode(rows)
    assert coef == pytest.approx(true, rel=1e-3)
    assert report["interval"] < 1e-3 and report["cv"]["all"]["spearman"] > 0.999
    noisy = [{**r, "ms": r["ms"] * random.Random(i).uniform(0.9, 1.1)} for i, r in enumerate(rows)]
    _, report = fit_decode(noisy)
    assert 0.02 < report["interval"] < 0.25  # the held-out error shows the noise
    with pytest.raises(ValueError, match="need at least"):
        fit_decode(rows[:2])


def test_a_head_dim_few_architectures_have_shares_its_neighbours_cost() -> None:
    """KV classes seen in fewer than MIN_ARCHS_PER_KV_CLASS architectures are pooled with the
    nearest class that has enough (the larger on a tie), or all together: never fitted free (0)."""
    assert MIN_ARCHS_PER_KV_CLASS == 3

    def rows_with(counts: list[int]) -> tuple[list[list[float]], list[str]]:
        X, archs = [], []
        for k, n in enumerate(counts):
            for a in range(n):
                x = [1.0] * len(DECODE_FEATURES)
                x[2 : 2 + len(KV_HEAD_DIMS)] = [1.0 if j == k else 0.0 for j in range(len(KV_HEAD_DIMS))]
                X.append(x)
                archs.append(f"{k}-{a}")
        return X, archs

    assert kv_groups(*rows_with([3, 3, 3, 3])) == [[0], [1], [2], [3]]
    assert kv_groups(*rows_with([0, 5, 1, 4])) == [[0, 1], [2, 3]]  # D64 ties between D32 and D128: D128
    assert kv_groups(*rows_with([2, 2, 2, 2])) == [[0, 1, 2, 3]]
    # noise-free rows of 6 architectures (no head dim in 3 of them): one KV cost, not a free class
    true = [2.5, 0.30, 0.8, 0.45, 0.3, 0.22, 0.9, 0.8, 0.5]
    rows = []
    for arch in decode_archs(2, 6):
        for batch, context in DECODE_SHAPES:
            x = decode_work(arch, context, batch).features()
            ms = 1e-3 * sum(c * v for c, v in zip(true, x, strict=True))
            rows.append({"arch": arch.to_dict(), "batch": batch, "context": context, "ms": ms})
    coef, _ = fit_decode(rows)
    kv = coef[2 : 2 + len(KV_HEAD_DIMS)]
    assert min(kv) > 0.1 and max(kv) == pytest.approx(min(kv))


def test_the_profile_loader_knows_the_decode_models_lengths() -> None:
    import hardware_profiles

    assert set(hardware_profiles._DECODE_MODEL_LENGTHS) == {
        len(DECODE_FEATURES),
        len(ALIGNED_DECODE_FEATURES),
        len(LEGACY_DECODE_FEATURES),
    }


def _calibrated(tmp_path, coef, interval=0.1, fingerprint=None):
    section = decode_section(coef, {"interval": interval, "rows": 180, "cv": {}}, ENV)
    if fingerprint is not None:
        section["kernels_fingerprint"] = fingerprint
    return load_profile(str(write_decode(_bare(), section, tmp_path / "h200.yaml")))


def test_a_calibrated_prediction_is_the_fitted_sum_and_says_so(tmp_path) -> None:
    coef = COEF
    profile = _calibrated(tmp_path, coef)
    assert profile.calibrated.decode_model["coefficients"] == coef
    assert profile.calibrated.kernel_model_json is not None  # the forward's calibration was kept
    arch = _arch(ATTN, LIN, LIN, LIN, LayerSpec("attention", heads=16))  # head dims 64 and 16
    lat = predict_decode(arch, 4, 32768, profile)
    expected = sum(c * x for c, x in zip(coef, decode_work(arch, 32768, 4).features(), strict=True)) * 1e-3
    assert lat.median_ms == pytest.approx(expected) and lat.kind == "decode"
    assert [name for name, _ in lat.breakdown] == list(DECODE_FEATURES)
    assert (lat.shape.batch, lat.shape.seq_len, lat.interval) == (4, 32768, 0.1)
    assert lat.label() == "predicted (h200, calibrated 2026-12-01, ±10 %)"
    back = type(lat).from_dict(json.loads(json.dumps(lat.to_dict())))
    assert back == lat


def test_a_profile_with_one_kv_cost_predicts_as_it_did(tmp_path) -> None:
    """A decode model written before the cache was split by head dim (4 coefficients) still
    loads and predicts its own sum: its one cache cost at every head dim."""
    legacy = [2.0, 0.3, 0.25, 1.0]
    profile = _calibrated(tmp_path, legacy)
    arch = _arch(ATTN, LIN, LayerSpec("attention", heads=16))
    w = decode_work(arch, 8192, 2)
    lat = predict_decode(arch, 2, 8192, profile)
    by_legacy_feature = (w.launches, w.weight_bytes / 2**20, w.cache_bytes / 2**20, w.state_bytes / 2**20)
    assert len(legacy) == len(LEGACY_DECODE_FEATURES)
    assert lat.median_ms == pytest.approx(sum(c * x for c, x in zip(legacy, by_legacy_feature, strict=True)) * 1e-3)
    assert [name for name, _ in lat.breakdown] == list(DECODE_FEATURES)


def test_transfer_scales_bytes_by_bandwidth_and_widens(tmp_path) -> None:
    coef = COEF
    source = _calibrated(tmp_path, coef)
    l4 = _bare("l4")
    arch = _arch(ATTN, LIN)
    here, there = predict_decode(arch, 1, 8192, source), predict_decode(arch, 1, 8192, l4, reference=source)
    ratio = source.bandwidth_bytes_per_s / l4.bandwidth_bytes_per_s
    cache_ms = dict(there.breakdown)["cache_mb_d64"] / dict(here.breakdown)["cache_mb_d64"]
    assert cache_ms == pytest.approx(ratio) and there.median_ms > here.median_ms
    assert there.interval >= 0.25 and there.label().startswith("predicted (transferred from h200")


def test_uncalibrated_roofline_and_ordering_at_long_context() -> None:
    profile = _bare()
    lat = {
        name: predict_decode(_arch(*layers), 1, 32768, profile, reference=None)
        for name, layers in (("attention", (ATTN,) * 8), ("3:1", (LIN, LIN, LIN, ATTN) * 2), ("linear", (LIN,) * 8))
    }
    assert all(v.basis == "uncalibrated" and v.interval > 0.5 for v in lat.values())
    # one step reads the KV cache of every attention layer: 8, 2 and 0 of them
    assert lat["attention"].median_ms > lat["3:1"].median_ms > lat["linear"].median_ms
    assert cache_memory(_arch(ATTN), 32768).kv_cache_bytes == 2 * 32768 * 256 * 2


def test_decode_kernels_other_than_the_calibrated_ones_widen_the_interval(tmp_path) -> None:
    profile = _calibrated(tmp_path, COEF, interval=0.1, fingerprint="000000000000")
    predict_module._warn_fingerprint.cache_clear()
    with pytest.warns(CalibrationWarning, match="000000000000"):
        lat = predict_decode(_arch(ATTN), 1, 4096, profile)
    assert lat.interval == pytest.approx(0.2) and "kernels_fingerprint" in dict(lat.notes)


def test_a_profile_with_a_bad_decode_model_is_refused(tmp_path) -> None:
    from hardware_profiles import ProfileError

    text = tmp_path / "x.yaml"
    data = yaml.safe_load(open(load_profile("h200").path))
    data["calibrated"]["decode_model"] = {"coefficients": [1, -2], "interval": 0.1}
    text.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="decode_model.coefficients"):
        load_profile(str(text))
    data["calibrated"]["decode_model"] = {"coefficients": [1, 2, 3, 4, 5], "interval": 0.1}
    text.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="must hold 9 numbers .* 7 .* or 4 .*got 5"):
        load_profile(str(text))


def test_past_the_checked_shapes_the_interval_widens_and_says_so() -> None:
    """The forward's interval was checked up to 1024-token sequences and 16K tokens, the decode
    model's up to its largest checked context: beyond them the label says extrapolated and the
    interval doubles at the edge, and grows by one more base interval per doubling past it;
    inside them nothing changes."""
    from nas.latency import EXTRAPOLATION_WIDENING, EXTRAPOLATION_WIDENING_PER_DOUBLING, predict
    from nas.latency._shape import parse_shape

    def widening(ratio: float) -> float:
        return EXTRAPOLATION_WIDENING + EXTRAPOLATION_WIDENING_PER_DOUBLING * math.log2(ratio)

    profile = load_profile("h100_sxm")  # calibrated on these kernels
    arch = _arch(ATTN)
    inside, longer, more = (predict(arch, parse_shape(s), profile) for s in ("8x1024", "1x4096", "33x512"))
    assert "extrapolated" not in inside.label() and not dict(inside.notes)
    assert inside.interval == pytest.approx(profile.calibrated.interval)  # inside: the calibration's own
    for lat, ratio in ((longer, 4), (more, 33 / 32)):
        assert "extrapolated" in lat.label() and "checked shapes" in dict(lat.notes)["extrapolated"]
        assert lat.interval == pytest.approx(widening(ratio) * inside.interval)
    checked = max(int(k) for k in profile.calibrated.decode_model["check"] if k.isdigit())
    near, far = predict_decode(arch, 1, checked, profile), predict_decode(arch, 1, 2 * checked, profile)
    assert "extrapolated" not in near.label() and "extrapolated" in far.label()
    assert far.interval == pytest.approx(widening(2) * near.interval)


def test_the_interval_grows_with_the_distance_past_the_checked_shapes() -> None:
    """A 4096x1048576 forward (2^18 times the checked tokens) was labelled ±27 %, as a 32K prefill
    just past the checks: the further past, the wider, in the forward and in decode."""
    from nas.latency import predict
    from nas.latency._shape import parse_shape

    profile = load_profile("h100_sxm")  # calibrated on these kernels
    arch = _arch(ATTN)
    shapes = ("1x2048", "1x32768", "4096x1048576")
    intervals = [predict(arch, parse_shape(s), profile).interval for s in shapes]
    assert intervals == sorted(intervals) and intervals[-1] > 2 * intervals[1] > 4 * profile.calibrated.interval
    checked = max(int(k) for k in profile.calibrated.decode_model["check"] if k.isdigit())
    decode = [predict_decode(arch, 4096, c, profile).interval for c in (2 * checked, 1_048_576)]
    assert decode[1] > 1.5 * decode[0]


def test_a_width_off_a_multiple_of_16_prices_its_norms_and_linears_again() -> None:
    """At d % 16 ≠ 0 every norm and linear of the step (two for the head, three per mixer and
    per MLP, one more per d-row quantize of fp8 weights) and all the weights they read are the
    unaligned features; at d % 16 = 0 there are none, and nothing else of the step changes. A
    calibrated model prices them, a transfer scales them like launches and bytes, the
    uncalibrated model adds nothing for them."""
    layers = (LayerSpec("attention", heads=2, short_conv=4, mlp_ratio=2.0), LayerSpec("none", mlp_ratio=1.5))
    odd, even = ArchSpec(72, layers, 1000, 1000), ArchSpec(80, layers, 1000, 1000)
    w_odd, w_even = decode_work(odd, 512, 2), decode_work(even, 512, 2)
    assert (w_even.unaligned_launches, w_even.unaligned_weight_bytes) == (0, 0)
    assert w_odd.unaligned_launches == 2 + 3 + 3 + 3
    assert w_odd.unaligned_weight_bytes == w_odd.weight_bytes > 0
    assert w_odd.launches == w_even.launches
    features = dict(zip(DECODE_FEATURES, w_odd.features(), strict=True))
    assert features["unaligned_launches"] == 11 and features["unaligned_weight_mb"] == w_odd.weight_bytes / 2**20
    fp8 = ArchSpec(72, tuple(dataclasses.replace(layer, weight_dtype="fp8") for layer in layers), 1000, 1000)
    assert decode_work(fp8, 512, 2).unaligned_launches == 11 + 3  # a quantize of d-wide rows per block, head none
    assert DECODE_KINDS[-2:] == ("launch", "bytes") and len(DECODE_KINDS) == len(DECODE_FEATURES)
    uncalibrated = predict_decode(odd, 2, 512, load_profile("l4"), reference=None)
    assert dict(uncalibrated.breakdown)["unaligned_launches"] == 0.0
