"""TritonDecoder (decode kernels only) against the torch model it was built from.

On CPU every kernel runs under Triton's interpreter (tests/conftest.py) in fp32: the torch
model prefills T tokens, ``load`` copies its cache in, and k Triton steps give the torch forward
over T + k tokens to rounding. On a GPU the ``gpu`` tests run bf16 kernels at a context of a few
thousand tokens and replay the step captured in one CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from nas.models import HybridModel, TritonDecoder, build, to_triton
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda, requires_interpreter

VOCAB = 29
STEPS = 3
TOL = {"rtol": 1e-4, "atol": 1e-4}  # fp32, as tests/models/test_triton_model.py

# name → (d_model, layers); d=32 with 4 heads is head dim 8, run zero-padded as 16
ARCHS = {
    "A conv4 MLP": (32, [LayerSpec("attention", 2, None, 4, 2.0)]),
    "A hd8 rms": (32, [LayerSpec("attention", 4, None, 0, 0.0, "gelu", "rmsnorm")]),
    "A hd8 conv4": (32, [LayerSpec("attention", 4, None, 4, 1.0)]),
    "L identity": (32, [LayerSpec("linear_attention", 2, "identity", 0, 2.0, "relu", "rmsnorm")]),
    "L identity hd8 conv4": (32, [LayerSpec("linear_attention", 4, "identity", 4, 0.0)]),
    "L elu+1 hd8": (32, [LayerSpec("linear_attention", 4, "elu+1", 0, 2.0, "silu", "rmsnorm")]),
    "L elu+1 conv4": (32, [LayerSpec("linear_attention", 2, "elu+1", 4, 0.0)]),
    "L elu+1 hd8 conv4": (32, [LayerSpec("linear_attention", 4, "elu+1", 4, 0.0)]),  # −∞ keys via the conv bias
    "A L hd24 conv4": (  # head dim 24 run as 32: rotary halves of 12 channels
        48,
        [LayerSpec("attention", 2, None, 4, 0.0), LayerSpec("linear_attention", 2, "identity", 4, 1.0)],
    ),
    "L relu conv4": (32, [LayerSpec("linear_attention", 2, "relu", 4, 0.0)]),
    "L relu hd8 rms": (32, [LayerSpec("linear_attention", 4, "relu", 0, 1.0, "gelu", "rmsnorm")]),
    "A L M mixed": (
        32,
        [
            LayerSpec("attention", 4, None, 4, 0.0, "relu"),
            LayerSpec("linear_attention", 2, "elu+1", 4, 1.5, "gelu", "rmsnorm"),
            LayerSpec("none", mlp_ratio=2.0, activation="silu"),
        ],
    ),
}


def _model(d: int, layers: list[LayerSpec], *, readout: str = "token", seed: int = 0) -> HybridModel:
    """Mixers scaled up (as tests/models/test_decode.py) so that each one moves the logits by O(1);
    norm scales and shifts away from (1, 0), which TritonModel folds into the linears after them
    (the decoder then runs unit-affine norms before its row kernels)."""
    model = build(ArchSpec(d, layers, VOCAB, VOCAB if readout == "token" else 5, readout), seed=seed).eval()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for block in model.blocks:
            if block.mixer is not None:
                block.mixer.out.weight.mul_(30.0)
                block.mixer.qkv.weight[: 2 * d].mul_(6.0)
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))
    return model


def _tokens(B: int, T: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed)).to(device)


@requires_interpreter
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("T", [1, 7, 37], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("name", list(ARCHS))
def test_steps_after_a_torch_prefill_equal_the_forward(name, T, B):
    model = _model(*ARCHS[name])
    tokens = _tokens(B, T + STEPS, seed=T * 10 + B)
    with torch.no_grad():
        expected = model(tokens)  # [B, T + k, n]
    _, cache = model.prefill(tokens[:, :T])
    decoder = TritonDecoder(to_triton(model, dtype=torch.float32), batch=B, capacity=T + STEPS + 2)
    decoder.load(cache)
    got = torch.stack([decoder.step(tokens[:, t]) for t in range(T, T + STEPS)], dim=1)
    torch.testing.assert_close(got, expected[:, T:], **TOL)
    assert decoder.positions.tolist() == [T + STEPS] * B and decoder.length == T + STEPS


@requires_interpreter
def test_a_full_cache_refuses_a_step():
    model = _model(*ARCHS["A L M mixed"], seed=2)
    tokens = _tokens(2, 3, seed=9)
    _, cache = model.prefill(tokens[:, :2])
    decoder = TritonDecoder(to_triton(model, dtype=torch.float32), batch=2, capacity=3)
    decoder.load(cache)
    decoder.step(tokens[:, 2])
    with pytest.raises(ValueError, match=r"cache is full \(capacity 3 tokens\)"):
        decoder.step(tokens[:, 0])
    assert decoder.positions.tolist() == [3, 3]  # the refused step touched nothing


def test_buffers_and_fill_random():
    d, layers = ARCHS["A L M mixed"]
    tm = to_triton(_model(d, layers), dtype=torch.float32)
    decoder = TritonDecoder(tm, batch=3, capacity=20)
    att, lin, none = decoder.layers
    # head dim 8 run as 16: the conv window holds the padded heads' 3·H·P channels
    assert att.conv.shape == (3, 3, 3 * 4 * 16) and att.k.shape == att.v.shape == (3, 4, 20, 16)
    assert att.rope[0].shape[0] >= 20 and att.rope[0].shape[1] == 8
    assert lin.state.shape == (3, 2, 16, 16) and lin.z.shape == (3, 2, 16) and lin.state.dtype == torch.float32
    assert none.conv is none.k is none.state is none.z is None
    assert decoder.positions.dtype == torch.int32 and decoder.positions.tolist() == [0, 0, 0]

    decoder.fill_random(12, generator=torch.Generator().manual_seed(0))
    assert decoder.positions.tolist() == [12] * 3 and decoder.length == 12
    k = att.k.view(3, 4, 20, 2, 8)  # head dim 8 padded to 16: channels [0, 4) and [8, 12) hold the model's
    assert k[:, :, :12, :, :4].abs().min() > 0 and not k[:, :, :12, :, 4:].any() and not att.k[:, :, 12:].any()
    assert lin.state.abs().sum() > 0 and (lin.z >= 12).all()  # head dim 16: nothing padded
    with pytest.raises(ValueError, match="length must be in"):
        decoder.fill_random(21)


def test_load_and_construction_errors():
    d, layers = ARCHS["A L M mixed"]
    model = _model(d, layers)
    tm = to_triton(model, dtype=torch.float32)
    _, cache = model.prefill(_tokens(2, 6, seed=1))
    with pytest.raises(ValueError, match="has batch 2, the decoder 3"):
        TritonDecoder(tm, batch=3, capacity=8).load(cache)
    with pytest.raises(ValueError, match="holds 6 tokens, more than capacity 5"):
        TritonDecoder(tm, batch=2, capacity=5).load(cache)
    other = _model(*ARCHS["L elu+1 hd8"])
    _, wrong = other.prefill(_tokens(2, 6, seed=1))
    with pytest.raises(ValueError, match="1 layers, the model 3"):
        TritonDecoder(tm, batch=2, capacity=8).load(wrong)
    with pytest.raises(ValueError, match="readout 'last'"):
        TritonDecoder(to_triton(_model(d, layers, readout="last"), dtype=torch.float32), batch=2, capacity=8)
    with pytest.raises(ValueError, match=r"tokens must be \[B\] = \[2\]"):
        TritonDecoder(tm, batch=2, capacity=8).step(torch.zeros(3, dtype=torch.int64))


def _gpu_model() -> HybridModel:
    d = 128
    layers = [
        LayerSpec("attention", 2, None, 4, 4.0),
        LayerSpec("linear_attention", 2, "elu+1", 4, 4.0),
        LayerSpec("attention", 8, None, 0, 2.0, "silu", "rmsnorm"),  # head dim 16
        LayerSpec("linear_attention", 16, "identity", 0, 0.0),  # head dim 8, padded to 16
        LayerSpec("none", mlp_ratio=4.0),
    ]
    return build(ArchSpec(d, layers, 512, 512), seed=0).cuda().eval()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("B", [1, 4], ids=lambda b: f"B{b}")
def test_gpu_bf16_graph_replay_matches_torch_steps(B):
    """A prompt of 3000 tokens prefilled by the torch model, then 8 tokens: each one a replay of
    the captured step, against the torch model's fp32 step (bf16 bound as the forward's test)."""
    model = _gpu_model()
    T, k = 3000, 8
    tokens = _tokens(B, T + k, seed=B, device="cuda")
    _, cache = model.prefill(tokens[:, :T], capacity=T + k)
    decoder = TritonDecoder(to_triton(model), batch=B, capacity=T + k)
    decoder.load(cache)
    static = tokens[:, T].clone()
    replay = decoder.capture(static)
    assert decoder.positions.tolist() == [T] * B  # capturing consumed no token
    for t in range(T, T + k):
        static.copy_(tokens[:, t])
        got = replay().float()
        expected = model.step(tokens[:, t], cache).float()
        rel = ((got - expected).norm() / expected.norm()).item()
        assert rel < 3e-2, (t, rel)
    assert decoder.positions.tolist() == [T + k] * B
    with pytest.raises(ValueError, match="cache is full"):
        replay()


@pytest.mark.gpu
@requires_cuda
def test_gpu_eager_step_equals_replay_after_fill_random():
    """A captured step replays what the eager step computes, from the same randomly filled cache.
    Not bit for bit: ``linear_rows`` adds its split-K partials with fp32 atomics, so their order,
    and with it the last bit of a bf16 logit, can differ between two runs (seen on the H200: 1 ulp,
    2^-8, on a quarter of the logits). A step at the wrong cache position or with a stale state
    misses by far more than these bounds."""
    replay_equals_eager(TritonDecoder, to_triton(_gpu_model()), B=2, C=4096)


def replay_equals_eager(decoder_class, tm, B: int, C: int) -> None:
    """Two decoders of ``tm`` filled alike at random to C - 4 tokens: three steps replayed from
    one's captured graph equal the other's eager steps (the bounds of the test above)."""
    eager, graphed = decoder_class(tm, batch=B, capacity=C), decoder_class(tm, batch=B, capacity=C)
    for decoder in (eager, graphed):
        decoder.fill_random(C - 4, generator=torch.Generator("cuda").manual_seed(1))
    static = torch.zeros(B, dtype=torch.int64, device="cuda")
    replay = graphed.capture(static)
    for t in range(3):
        static.fill_(t + 1)
        got, want = replay().float(), eager.step(static.clone()).float()
        assert ((got - want).norm() / want.norm()).item() < 4e-3
        torch.testing.assert_close(got, want, rtol=2**-6, atol=2**-5 * want.abs().max().item())
    assert eager.positions.tolist() == graphed.positions.tolist() == [C - 1] * B
