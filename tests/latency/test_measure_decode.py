"""``measure_decode``: a measured decoding step on the GPU (checked, graph-replayed, cached by
context and batch), and what it refuses anywhere."""

from __future__ import annotations

import pytest
import torch

from kernels.errors import KernelMismatchError
from nas.latency import LatencyCache, cache_key, decode_fingerprint, measure_decode
from nas.models import build
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda

HYBRID = ArchSpec(
    128,
    [
        LayerSpec("linear_attention", 2, "elu+1", 4, 2.0),
        LayerSpec("linear_attention", 4, "identity", 0, 0.0),
        LayerSpec("linear_attention", 2, "relu", 4, 2.0),
        LayerSpec("attention", 4, None, 4, 4.0),
        LayerSpec("attention", 16, None, 0, 2.0),  # head dim 8: zero-padded to the kernels' 16
    ],
    256,
    256,
)


def test_measure_decode_needs_a_gpu_and_a_generating_model():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            measure_decode(build(HYBRID, seed=0), 1, 1024)
    last = ArchSpec(64, [LayerSpec("attention", 2)], 32, 4, "last")
    with pytest.raises((ValueError, RuntimeError), match="does not generate|needs a CUDA device"):
        measure_decode(build(last, seed=0), 1, 1024, device="cuda" if torch.cuda.is_available() else None)


def test_decode_cache_key_is_not_a_forward_key():
    key = cache_key("abc", "decode 1x4096", "bf16", "GPU", "2.13", "3.9", decode_fingerprint())
    assert key.split("|")[1] == "decode 1x4096" and key.endswith(decode_fingerprint())


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("batch, context", [(1, 4097), (4, 1000)])
def test_measure_decode_on_gpu_is_measured_cached_and_grows_with_the_cache(tmp_path, batch, context):
    cache = LatencyCache(tmp_path / "lat.json")
    lat = measure_decode(build(HYBRID, seed=0), batch, context, cache=cache)
    assert lat.kind == "decode" and lat.source == "measured" and lat.median_ms > 0
    assert (lat.shape.batch, lat.shape.seq_len) == (batch, context)
    assert lat.iqr_ms <= 0.05 * lat.median_ms or dict(lat.notes).get("remeasured") == "yes"
    assert measure_decode(build(HYBRID, seed=1), batch, context, cache=cache) == lat  # by arch, not weights
    attention = ArchSpec(128, [LayerSpec("attention", 2, None, 4, 2.0)] * 6, 256, 256)
    short = measure_decode(build(attention, seed=0), batch, 1024, cache=cache)
    long = measure_decode(build(attention, seed=0), batch, 65536, cache=cache)
    assert long.median_ms > short.median_ms  # 64x the KV cache to read


@pytest.mark.gpu
@requires_cuda
def test_measure_decode_refuses_a_decoder_that_disagrees_with_the_model(tmp_path, monkeypatch):
    from nas.models import triton_decode

    original = triton_decode.TritonDecoder.step

    def wrong(self, tokens):
        return original(self, tokens) * 1.5

    monkeypatch.setattr(triton_decode.TritonDecoder, "step", wrong)
    with pytest.raises(KernelMismatchError, match="decode step 0 differs"):
        measure_decode(build(HYBRID, seed=0), 1, 2048, cache=LatencyCache(tmp_path / "lat.json"))
