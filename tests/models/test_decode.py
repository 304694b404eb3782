"""Torch decoding: ``prefill`` T tokens then k ``step``s gives the forward over T + k tokens.

Every mixer and feature map, short conv 0/1/2/4, both norms, MLP-only blocks, head dims that
are odd or below 16, mixed stacks, T = 1, 7, 37 (and 70: past one linear-attention chunk),
batch 1 and 3. The mixers' weights are scaled up (as tests/models/test_triton_model.py does)
so that each mixer, its rotary phase and its normalizer move the logits by O(1): a cache that
is off by one row, or a state missing a token, fails.
"""

from __future__ import annotations

import copy

import pytest
import torch

from nas.models import DecodeCache, HybridModel, build
from nas.spec import ArchSpec, LayerSpec

VOCAB = 29
STEPS = 5
TOL = {"rtol": 1e-5, "atol": 2e-5}  # fp32: the step and the forward sum the same terms in another order


def _a(heads: int, conv: int = 0, mlp: float = 2.0, norm: str = "layernorm") -> LayerSpec:
    return LayerSpec("attention", heads, None, conv, mlp, "gelu", norm)


def _l(heads: int, fmap: str, conv: int = 0, mlp: float = 2.0, norm: str = "layernorm") -> LayerSpec:
    return LayerSpec("linear_attention", heads, fmap, conv, mlp, "silu", norm)


# name → (d_model, layers)
ARCHS = {
    "A d24h3": (24, [_a(3)]),
    "A d40h5 conv4 rms": (40, [_a(5, 4, norm="rmsnorm")]),
    "A Dh7 conv2 no-MLP": (21, [_a(3, 2, mlp=0.0)]),
    "A d32h1 conv1": (32, [_a(1, 1)]),
    "L identity d24h3": (24, [_l(3, "identity")]),
    "L identity Dh5 conv4 rms": (15, [_l(3, "identity", 4, norm="rmsnorm")]),
    "L elu+1 d40h5": (40, [_l(5, "elu+1", 0, norm="rmsnorm")]),
    "L elu+1 d24h3 conv4": (24, [_l(3, "elu+1", 4)]),
    "L relu Dh7 no-MLP": (21, [_l(3, "relu", 0, mlp=0.0)]),
    "L relu d40h5 conv4 rms": (40, [_l(5, "relu", 4, norm="rmsnorm")]),
    "MLP only": (24, [LayerSpec("none", mlp_ratio=2.0), LayerSpec("none", mlp_ratio=1.5, norm="rmsnorm")]),
    "A L M mixed": (
        24,
        [_a(3, 4), _l(3, "elu+1", 4, norm="rmsnorm"), LayerSpec("none", mlp_ratio=2.0), _l(2, "identity", 0, 0.0)],
    ),
    "L A mixed conv": (40, [_l(5, "relu", 4), _a(5, 4, 0.0, "rmsnorm"), _a(2, 0)]),
}
LENGTHS = [1, 7, 37]


def _model(d: int, layers: list[LayerSpec], *, readout: str = "token", seed: int = 0) -> HybridModel:
    arch = ArchSpec(d, layers, VOCAB, VOCAB if readout == "token" else 5, readout)
    model = build(arch, seed=seed).eval()
    with torch.no_grad():
        for block in model.blocks:
            if block.mixer is not None:
                block.mixer.out.weight.mul_(30.0)
                block.mixer.qkv.weight[: 2 * d].mul_(6.0)  # peaked softmax: scale and rotary phase matter
    return model


def _tokens(B: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def _decode(model: HybridModel, tokens: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor, DecodeCache]:
    """Prefill ``tokens[:, :T]``, then step through the rest: the prefill's logits ``[B, T, n]``,
    the steps' ``[B, k, n]`` and the cache."""
    logits, cache = model.prefill(tokens[:, :T], capacity=tokens.shape[1])
    steps = [model.step(tokens[:, t], cache) for t in range(T, tokens.shape[1])]
    return logits, torch.stack(steps, dim=1), cache


@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("name", list(ARCHS))
def test_prefill_then_steps_equal_the_forward(name, T, B):
    d, layers = ARCHS[name]
    model = _model(d, layers)
    tokens = _tokens(B, T + STEPS, seed=T * 10 + B)
    with torch.no_grad():
        expected = model(tokens)  # [B, T + k, n]
    logits, steps, cache = _decode(model, tokens, T)
    assert cache.length == cache.capacity == T + STEPS
    torch.testing.assert_close(logits, expected[:, :T], **TOL)
    torch.testing.assert_close(steps, expected[:, T:], **TOL)


@pytest.mark.parametrize("name", ["L elu+1 d24h3 conv4", "L identity d24h3", "A L M mixed"])
def test_decoding_past_a_linear_attention_chunk(name):
    """70 prompt tokens: the forward's chunked form carries a state across its 64-token chunks."""
    d, layers = ARCHS[name]
    model = _model(d, layers, seed=3)
    tokens = _tokens(2, 70 + STEPS, seed=70)
    with torch.no_grad():
        expected = model(tokens)
    logits, steps, _ = _decode(model, tokens, 70)
    torch.testing.assert_close(logits, expected[:, :70], **TOL)
    torch.testing.assert_close(steps, expected[:, 70:], **TOL)


def test_cache_shapes_and_dtypes():
    d, layers = ARCHS["A L M mixed"]  # attention h3 conv4, linear elu+1 conv4, none, linear identity
    model = _model(d, layers)
    _, cache = model.prefill(_tokens(3, 7, seed=1), capacity=11)
    assert (cache.length, cache.capacity) == (7, 11)
    att, lin, none, ident = cache.layers
    assert att.conv.shape == (3, 3, 3 * d) and att.k.shape == att.v.shape == (3, 3, 11, 8)
    assert att.state is None and att.z is None
    assert not att.k[:, :, 7:].any() and not att.v[:, :, 7:].any()  # rows past the prompt are empty
    assert lin.k is None and lin.state.shape == (3, 3, 8, 8) and lin.z.shape == (3, 3, 8)
    assert lin.state.dtype == lin.z.dtype == torch.float32
    assert all(getattr(none, f) is None for f in ("conv", "k", "v", "state", "z")) and none.nbytes() == 0
    assert ident.conv is None and ident.z is None and ident.state.shape == (3, 2, 12, 12)
    assert cache.nbytes() == 4 * (3 * 3 * 3 * d + 2 * 3 * 3 * 11 * 8 + 3 * 3 * 3 * d + 3 * 3 * 72 + 3 * 2 * 144)


def test_short_prompt_conv_state_is_zero_before_the_start():
    model = _model(*ARCHS["A d40h5 conv4 rms"])
    _, cache = model.prefill(_tokens(2, 1, seed=2), capacity=4)
    conv = cache.layers[0].conv  # [B, 3, 3d]: two rows before the start, then the prompt's projection
    assert not conv[:, :2].any() and conv[:, 2].abs().sum() > 0


@pytest.mark.parametrize(
    ("name", "layer", "field"),
    [
        ("A L M mixed", 0, "k"),
        ("A L M mixed", 0, "v"),
        ("A L M mixed", 0, "conv"),
        ("A L M mixed", 1, "state"),
        ("A L M mixed", 1, "z"),
        ("A L M mixed", 3, "state"),
    ],
)
def test_the_step_reads_its_cache(name, layer, field):
    """A negated cache field gives other logits, so the equality tests above can fail."""
    model = _model(*ARCHS[name])
    tokens = _tokens(2, 8, seed=4)
    _, cache = model.prefill(tokens[:, :7], capacity=8)
    mutated = copy.deepcopy(cache)
    getattr(mutated.layers[layer], field).neg_()
    change = (model.step(tokens[:, 7], mutated) - model.step(tokens[:, 7], cache)).abs().max().item()
    assert change > 20 * TOL["atol"], change  # well outside the tolerance the equality tests allow


def test_capacity_errors():
    model = _model(*ARCHS["A d24h3"])
    tokens = _tokens(2, 6, seed=6)
    with pytest.raises(ValueError, match="capacity must be >= the prompt's 6 tokens, got 5"):
        model.prefill(tokens, capacity=5)
    _, cache = model.prefill(tokens)  # capacity defaults to T: full at once
    with pytest.raises(ValueError, match=r"cache is full \(capacity 6 tokens\)"):
        model.step(tokens[:, 0], cache)
    _, cache = model.prefill(tokens, capacity=7)
    model.step(tokens[:, 0], cache)
    with pytest.raises(ValueError, match="capacity 7"):
        model.step(tokens[:, 1], cache)
    assert cache.length == 7  # the refused step consumed nothing
    with pytest.raises(ValueError, match="T >= 1"):
        model.prefill(tokens[:, :0], capacity=4)


def test_last_readout_does_not_generate():
    d, layers = ARCHS["A L M mixed"]
    model = _model(d, layers, readout="last")
    tokens = _tokens(2, 6, seed=7)
    with pytest.raises(ValueError, match="prefill: readout 'last'.*needs readout 'token'"):
        model.prefill(tokens)
    _, cache = _model(d, layers).prefill(tokens, capacity=8)
    with pytest.raises(ValueError, match="step: readout 'last'"):
        model.step(tokens[:, 0], cache)


def test_training_forward_is_untouched_by_decoding():
    """prefill runs under no_grad and leaves the model's forward and gradients as they were."""
    model = _model(*ARCHS["L A mixed conv"])
    tokens = _tokens(2, 9, seed=8)
    before = model(tokens)
    model.prefill(tokens, capacity=12)
    after = model(tokens)
    assert after.requires_grad
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_linear_attention_state_stays_fp32_under_autocast():
    """Training on a GPU runs under bf16 autocast; the recurrent state must not be rounded to it."""
    model = _model(*ARCHS["L elu+1 d24h3 conv4"])
    tokens = _tokens(2, 9, seed=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, cache = model.prefill(tokens[:, :8], capacity=9)
        logits = model.step(tokens[:, 8], cache)
    assert cache.layers[0].state.dtype == cache.layers[0].z.dtype == torch.float32
    with torch.no_grad():
        expected = model(tokens)[:, 8]
    torch.testing.assert_close(logits.float(), expected, rtol=5e-2, atol=5e-2)  # bf16 matmuls
