"""StoredDecoder (the precision kernels in a decode step) against the torch model decoding at
its stored precision (``HybridModel.stored_precision()``: fp8 KV cache with the prompt's scales,
bf16 state, fp8 weights and per-token inputs).

On CPU every kernel runs under Triton's interpreter in fp32: the torch model prefills T tokens at
its stored precision, ``load`` copies the cache in, and k steps of each give the same logits to
rounding. On a GPU the ``gpu`` test runs bf16 kernels at a context of a few thousand tokens from
one CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from nas.models import StoredDecoder, TritonDecoder, build, to_triton
from nas.models.triton_decode import _padded
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda, requires_interpreter
from tests.models.test_triton_decode import _model, _tokens, replay_equals_eager

STEPS = 3
TOL = {"rtol": 1e-4, "atol": 1e-4}

# every precision field alone and together, on odd and padded head dims (d 32 with 4 heads: head
# dim 8, run as 16; d 48 with 2 heads: 24, run as 32), feature maps with and without z
LAYERS = [
    LayerSpec("attention", 4, None, 4, 2.0, kv_dtype="fp8"),
    LayerSpec("linear_attention", 2, "elu+1", 0, 1.5, "gelu", "rmsnorm", state_dtype="bf16"),
    LayerSpec("linear_attention", 4, "identity", 4, 0.0, state_dtype="bf16"),
    LayerSpec("attention", 2, None, 0, 2.0, "silu", weight_dtype="fp8"),
    LayerSpec("linear_attention", 2, "relu", 4, 1.0, weight_dtype="fp8", state_dtype="bf16"),
    LayerSpec("none", mlp_ratio=2.0, weight_dtype="fp8"),
    LayerSpec("attention", 2, None, 4, 1.0, kv_dtype="fp8", weight_dtype="fp8"),
]
ARCHS = {
    "A kv fp8": (32, LAYERS[:1]),
    "L bf16 state": (32, LAYERS[1:3]),
    "A L M fp8 weights": (32, LAYERS[3:6]),
    "all fields hd24": (48, [LAYERS[6], LAYERS[4], LAYERS[1]]),
}


def _stored(d: int, layers: list[LayerSpec], seed: int = 0):
    """``test_triton_decode``'s scaled model with the precision fields, rounding as it stores."""
    model = _model(d, layers, seed=seed)
    return model.stored_precision()


@requires_interpreter
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("T", [1, 9], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("name", list(ARCHS))
def test_steps_equal_the_torch_model_s_stored_steps(name, T, B):
    model = _stored(*ARCHS[name])
    tokens = _tokens(B, T + STEPS, seed=T * 10 + B)
    _, cache = model.prefill(tokens[:, :T], capacity=T + STEPS + 2)
    decoder = StoredDecoder(to_triton(model, dtype=torch.float32, fold_norms=False), batch=B, capacity=T + STEPS + 2)
    decoder.load(cache)
    for t in range(T, T + STEPS):
        got = decoder.step(tokens[:, t])
        want = model.step(tokens[:, t], cache)
        torch.testing.assert_close(got, want, **TOL)
    n = T + STEPS
    for buf, layer in zip(decoder.layers, cache.layers, strict=True):  # the stored caches advanced alike
        if buf.k_scale is not None:
            assert torch.equal(buf.k_scale, layer.k_scale) and torch.equal(buf.v_scale, layer.v_scale)
            assert buf.k.dtype == layer.k.dtype == torch.float8_e4m3fn
            for mine, theirs in ((buf.k, layer.k), (buf.v, layer.v)):
                want = _padded(theirs[:, :, :n].float(), mine.shape[-1], "attention")
                assert torch.equal(mine[:, :, :n].float(), want)
        if buf.state is not None and buf.state.dtype == torch.bfloat16:
            D = layer.state.shape[-1]
            torch.testing.assert_close(buf.state[:, :, :D, :D].float(), layer.state.float(), rtol=2**-7, atol=1e-6)


@requires_interpreter
def test_at_full_precision_it_is_the_plain_decoder():
    d, layers = 32, [LayerSpec("attention", 4, None, 4, 2.0), LayerSpec("linear_attention", 2, "elu+1", 0, 1.0)]
    model = _model(d, layers)
    tokens = _tokens(2, 6, seed=5)
    _, cache = model.prefill(tokens[:, :4], capacity=8)
    tm = to_triton(model, dtype=torch.float32)
    plain, stored = TritonDecoder(tm, batch=2, capacity=8), StoredDecoder(tm, batch=2, capacity=8)
    plain.load(cache)
    stored.load(cache)
    for t in (4, 5):
        assert torch.equal(stored.step(tokens[:, t]), plain.step(tokens[:, t]))
    assert stored.nbytes() == plain.nbytes()


@requires_interpreter
def test_buffers_are_stored_narrower_and_loads_are_checked():
    d, layers = ARCHS["all fields hd24"]
    model = _stored(d, layers)
    tm = to_triton(model, dtype=torch.float32, fold_norms=False)
    decoder = StoredDecoder(tm, batch=2, capacity=10)
    att, lin, lin2 = decoder.layers
    assert att.k.dtype == att.v.dtype == torch.float8_e4m3fn and att.k.shape == (2, 2, 10, 32)
    assert att.k_scale.shape == att.v_scale.shape == (2, 2) and att.k_scale.dtype == torch.float32
    assert lin.state.dtype == lin.z.dtype == torch.bfloat16 and lin2.state.dtype == torch.bfloat16
    full = TritonDecoder(to_triton(model.stored_precision(False), dtype=torch.float32), batch=2, capacity=10)
    # KV half the bytes (+ 4 bytes a scale), states half: against the full-precision buffers
    kv_full = sum(b.k.numel() * 2 * 4 for b in full.layers if b.k is not None)
    kv_stored = sum(b.k.numel() * 2 + 2 * b.k_scale.numel() * 4 for b in decoder.layers if b.k is not None)
    state_full = sum((b.state.numel() + b.z.numel()) * 4 for b in full.layers if b.state is not None)
    assert full.nbytes() - decoder.nbytes() == (kv_full - kv_stored) + state_full // 2
    assert decoder.fp8[0] is not None and decoder.fp8[0].qkv[0].dtype == torch.float8_e4m3fn
    assert decoder.fp8[2] is None  # no fp8 weights in the third block

    _, plain_cache = model.stored_precision(False).prefill(_tokens(2, 4, seed=1), capacity=10)
    with pytest.raises(
        ValueError, match=r"layer 0 \(attention\): cache field 'k' is torch.float32, the decoder stores"
    ):
        decoder.load(plain_cache)
    model.stored_precision()
    # a bf16 KV cache (kv_dtype bf16) loads from an fp32 prefill, cast, as TritonDecoder's does
    only_state = _stored(48, [LayerSpec("attention", 2, None, 0, 1.0), LAYERS[1]])
    _, cache = only_state.prefill(_tokens(2, 4, seed=2), capacity=10)
    bf16_kv = StoredDecoder(to_triton(only_state, dtype=torch.bfloat16, fold_norms=False), batch=2, capacity=10)
    bf16_kv.load(cache)
    assert bf16_kv.layers[0].k.dtype == torch.bfloat16 and bf16_kv.layers[1].state.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"fold_norms=False"):
        StoredDecoder(to_triton(model, dtype=torch.float32), batch=2, capacity=10)
    with pytest.raises(TypeError, match=r"takes a TritonModel, got HybridModel: StoredDecoder\(to_triton"):
        StoredDecoder(model, 1, 8)

    att.k_scale.fill_(3.0)
    decoder.fill_random(7, generator=torch.Generator().manual_seed(0))
    assert att.k[:, :, :7].float().abs().sum() > 0 and not att.k[:, :, 7:].float().any()
    assert (att.k_scale == 1).all() and (att.v_scale == 1).all()  # the rows read back as drawn
    assert lin.state.float().abs().sum() > 0


def _gpu_model():
    d = 128
    layers = [
        LayerSpec("attention", 2, None, 4, 4.0, kv_dtype="fp8", weight_dtype="fp8"),
        LayerSpec("linear_attention", 2, "elu+1", 4, 4.0, state_dtype="bf16"),
        LayerSpec("attention", 8, None, 0, 2.0, "silu", "rmsnorm", kv_dtype="fp8"),  # head dim 16
        LayerSpec("linear_attention", 16, "identity", 0, 0.0, state_dtype="bf16", weight_dtype="fp8"),
        LayerSpec("none", mlp_ratio=4.0, weight_dtype="fp8"),
    ]
    return build(ArchSpec(d, layers, 512, 512), seed=0).cuda().eval().stored_precision()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("B", [1, 8], ids=lambda b: f"B{b}")
def test_gpu_graph_replay_matches_the_torch_model_s_stored_steps(B):
    """A prompt of 3000 tokens prefilled by the torch model at its stored precision (bf16
    autocast), then 8 tokens, each one a replay of the captured step, against the torch step
    (the bound of ``measure_decode``'s check)."""
    from nas.latency._measure import MISMATCH_LIMIT

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9 or newer")
    model = _gpu_model()
    T, k = 3000, 8
    tokens = _tokens(B, T + k, seed=B, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, cache = model.prefill(tokens[:, :T], capacity=T + k)
    decoder = StoredDecoder(to_triton(model, fold_norms=False), batch=B, capacity=T + k)
    decoder.load(cache)
    static = tokens[:, T].clone()
    replay = decoder.capture(static)
    for t in range(T, T + k):
        static.copy_(tokens[:, t])
        got = replay().float()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            expected = model.step(tokens[:, t], cache).float()
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel < MISMATCH_LIMIT, (t, rel)


@pytest.mark.gpu
@requires_cuda
def test_gpu_eager_step_equals_replay_after_fill_random():
    """What ``measure_decode`` times: a cache filled at random at a long context, one step captured
    and replayed, against the eager step from the same cache (``TritonDecoder``'s test)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9 or newer")
    replay_equals_eager(StoredDecoder, to_triton(_gpu_model(), fold_norms=False), B=8, C=8192)
