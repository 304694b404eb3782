"""``measure_decode``: a measured decoding step on the GPU (checked, graph-replayed, cached by
context and batch), and what it refuses anywhere."""

from __future__ import annotations

import pytest
import torch

from kernels.errors import KernelMismatchError
from nas.latency import LatencyCache, cache_key, decode_fingerprint, measure_decode
from nas.models import build
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda, requires_interpreter

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


STORED = ArchSpec(
    32,
    [
        LayerSpec("attention", 2, None, 4, 2.0, kv_dtype="fp8", weight_dtype="fp8"),
        LayerSpec("linear_attention", 2, "elu+1", 0, 1.0, state_dtype="bf16"),
    ],
    64,
    64,
)


@requires_interpreter
@pytest.mark.parametrize("arch", [STORED.at_full_precision(), STORED], ids=["full", "stored"])
def test_the_check_decodes_as_stored_and_leaves_the_model_as_it_was(arch, monkeypatch):
    """``_checked`` (the step check before a decode is timed), run on the CPU under the
    interpreter in fp32: it picks ``StoredDecoder`` below full precision (``TritonDecoder`` else),
    compares it with the torch model decoding at its stored precision, and restores the model's
    own setting, also when the check fails."""
    from nas.latency._measure_decode import _checked
    from nas.models import StoredDecoder, TritonDecoder
    from nas.models.triton_decode_stored import StoredDecoder as Stored

    model = build(arch, seed=0).eval()
    with pytest.warns(UserWarning, match="CUDA"):  # no CUDA here: autocast off, fp32 throughout
        make = _checked(model, 2, torch.device("cpu"), torch.float32)
    decoder = make(2, 40)
    assert type(decoder) is (TritonDecoder if arch.full_precision else StoredDecoder) and decoder.capacity == 40
    assert not model.at_stored_precision
    if not arch.full_precision:
        original = Stored.step
        monkeypatch.setattr(Stored, "step", lambda self, tokens: original(self, tokens) * 1.2)
        model.stored_precision()
        with pytest.warns(UserWarning, match="CUDA"), pytest.raises(KernelMismatchError, match="step 0 differs"):
            _checked(model, 2, torch.device("cpu"), torch.float32)
        assert model.at_stored_precision  # as it was before the check


def test_a_stored_precision_is_keyed_apart_from_the_full_one():
    from nas.latency import stored_decode_fingerprint
    from nas.spec import arch_hash

    assert stored_decode_fingerprint() != decode_fingerprint()
    assert arch_hash(HYBRID) == arch_hash(HYBRID.at_full_precision())  # full precision: the keys it had
    assert arch_hash(STORED) != arch_hash(STORED.at_full_precision())


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


@pytest.mark.gpu
@requires_cuda
def test_measure_decode_at_a_stored_precision_times_the_stored_decoder(tmp_path):
    """Below full precision the step timed is ``StoredDecoder``'s, keyed by the whole architecture
    and ``stored_decode_fingerprint``: never the full-precision measurement of the same stack."""
    from nas.latency import stored_decode_fingerprint

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9 or newer")
    cache = LatencyCache(tmp_path / "lat.json")
    wide = ArchSpec(128, [la for la in STORED.layers] * 2, 256, 256)
    stored = measure_decode(build(wide, seed=0), 8, 4096, cache=cache)
    full = measure_decode(build(wide.at_full_precision(), seed=0), 8, 4096, cache=cache)
    assert stored.source == full.source == "measured" and stored != full
    assert dict(stored.versions)["kernels"] == stored_decode_fingerprint()
    assert dict(full.versions)["kernels"] == decode_fingerprint()
    assert "unpriced precision" not in dict(stored.notes)
    assert measure_decode(build(wide, seed=1), 8, 4096, cache=cache) == stored  # cached, by arch
