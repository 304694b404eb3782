"""Storing the KV cache, state and weights narrower: the rounding functions against a plain fp32
reference of the rounded math, the model's forward at its stored precision, and the accuracy a
training reports at it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from nas.models import build
from nas.models.mixers import causal_linear_attention
from nas.models.precision import (
    FP8_MAX,
    StoredLinear,
    bf16,
    fp8_append,
    fp8_per_channel,
    fp8_per_head,
    fp8_per_token,
    linear_attention_stored_state,
)
from nas.spec import ArchSpec, LayerSpec, TrainSpec
from nas.tasks import load_task
from nas.train import evaluate, evaluate_stored, train, train_population
from tests.kernels._support import requires_cuda

# ---------------------------------------------------------------- a reference of the rounded math


def _e4m3(y: float) -> float:
    """``y`` rounded to fp8 e4m3 (finite-only 'fn' variant): 3 mantissa bits, exponent bias 7
    (normals from 2^-6, subnormals in steps of 2^-9), round to nearest even; |y| <= 448 here."""
    if y == 0:
        return 0.0
    a = abs(y)
    exponent = max(math.floor(math.log2(a)), -6)
    step = 2.0 ** (exponent - 3)
    q = round(a / step) * step  # Python's round: half to even, exact on a float32 / a power of two
    assert q <= FP8_MAX
    return math.copysign(q, y)


def _fp8_reference(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The module's scale rule written out in float32: scale = amax / 448 per group (1 for an all-zero
    group), each element stored as e4m3(x / scale), read back as that times the scale."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=axes, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
    scaled = (x / scale).astype(np.float32)
    stored = np.vectorize(_e4m3, otypes=[np.float64])(scaled).astype(np.float32)
    return (stored * scale).astype(np.float32)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 → float32 by the bits: keep the top 16, round to nearest even."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def _wide_range(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values over six decades (fp8's subnormals, normals and the group's amax), both signs, a zero."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 10 ** torch.empty(shape).uniform_(-4, 2, generator=gen)
    x.view(-1)[0] = 0.0
    return x


def test_fp8_per_head_is_the_scale_rule_at_odd_shapes():
    x = _wide_range((2, 3, 5, 7), seed=0)
    x[1, 2] = 0.0  # an all-zero head: scale 1, stored exactly
    got = fp8_per_head(x)
    assert np.array_equal(got.numpy(), _fp8_reference(x.numpy(), (2, 3)))  # bit for bit
    assert torch.equal(got[1, 2], torch.zeros(5, 7))
    # each head's largest magnitude is stored exactly (it maps onto 448); the rest lose bits
    assert torch.equal(got.abs().amax(dim=(2, 3)), x.abs().amax(dim=(2, 3)))
    assert not torch.equal(got, x)


def test_fp8_per_channel_is_the_scale_rule_at_odd_shapes():
    w = _wide_range((11, 13), seed=1)
    got = fp8_per_channel(w)
    assert np.array_equal(got.numpy(), _fp8_reference(w.numpy(), (1,)))
    # one scale per output row: scaling one row leaves the others as they were
    w2 = w.clone()
    w2[3] *= 1000
    assert torch.equal(fp8_per_channel(w2)[4:], got[4:]) and torch.equal(fp8_per_channel(w2)[:3], got[:3])


def test_fp8_per_token_and_the_fp8_linear_are_the_scale_rule_at_odd_shapes():
    """Inputs rounded per row (token) over their last dim; a StoredLinear with fp8 on multiplies
    the rounded input by the rounded weight and adds the bias unrounded (the fp8 matmul's math)."""
    x = _wide_range((2, 5, 13), seed=3)
    x[1, 4] = 0.0  # an all-zero token: scale 1
    got = fp8_per_token(x)
    assert np.array_equal(got.numpy(), _fp8_reference(x.numpy(), (2,)))
    x2 = x.clone()
    x2[0, 1] *= 1000  # one token's scale moves, no other's
    assert torch.equal(fp8_per_token(x2)[1], got[1]) and torch.equal(fp8_per_token(x2)[0, 2:], got[0, 2:])
    layer = StoredLinear(13, 7)
    layer.fp8 = True
    w, b = layer.weight.detach(), layer.bias.detach()
    want = _fp8_reference(x.numpy(), (2,)) @ _fp8_reference(w.numpy(), (1,)).T + b.numpy()
    with torch.no_grad():
        assert np.allclose(layer(x).numpy(), want, rtol=1e-6, atol=1e-6)


def test_bf16_is_round_to_nearest_even():
    x = _wide_range((3, 17), seed=2)
    x[0, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 257.0, 259.0])  # ties: to even mantissa
    got = bf16(x)
    assert np.array_equal(got.numpy(), _bf16_reference(x.numpy()))
    assert got[0, :4].tolist() == [1.0, 1 + 4 * 2**-8, 256.0, 260.0]


def _stored_state_reference(q, k, v, normalize: bool, rounding) -> np.ndarray:
    """Token by token in float32, one (sequence, head) at a time: S += k vᵀ, z += k, each stored
    through ``rounding``; o = q·S [/ (q·z + EPS)]."""
    from kernels.linear_attention.reference import EPS

    q, k, v = (t.numpy().astype(np.float32) for t in (q, k, v))
    B, H, T, D = q.shape
    out = np.zeros((B, H, T, v.shape[-1]), np.float32)
    for b in range(B):
        for h in range(H):
            state = np.zeros((D, v.shape[-1]), np.float32)
            z = np.zeros(D, np.float32)
            for t in range(T):
                state = rounding(state + np.outer(k[b, h, t], v[b, h, t]).astype(np.float32))
                o = (q[b, h, t][:, None] * state).sum(0)
                if normalize:
                    z = rounding(z + k[b, h, t])
                    o = o / ((q[b, h, t] * z).sum() + np.float32(EPS))
                out[b, h, t] = o
    return out


@pytest.mark.parametrize("normalize", [True, False])
def test_the_bf16_state_is_rounded_after_each_token_s_update(normalize):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.rand(2, 3, 9, 5, generator=gen) * 3 for _ in range(3))  # positive: a feature map's output
    got = linear_attention_stored_state(q, k, v, normalize=normalize, dtype="bf16")
    expect = _stored_state_reference(q, k, v, normalize, _bf16_reference)
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-5, atol=1e-6)  # the dot products sum in another order
    # fp32: the chunked form's math, token by token
    full = linear_attention_stored_state(q, k, v, normalize=normalize, dtype="fp32")
    chunked = causal_linear_attention(q, k, v, normalize=normalize, chunk=4)  # 9 tokens: 3 chunks, one partial
    torch.testing.assert_close(full, chunked, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, full, rtol=1e-6, atol=0)


def test_a_sum_bf16_cannot_hold_changes_the_output():
    """256 + 1 is 257 in fp32 and 256 in bf16 (8 bits of mantissa): the second token's output of
    an unnormalized state reads the difference."""
    k = torch.ones(1, 1, 2, 1)
    v = torch.tensor([256.0, 1.0]).view(1, 1, 2, 1)
    q = torch.ones(1, 1, 2, 1)
    full = linear_attention_stored_state(q, k, v, normalize=False, dtype="fp32")
    stored = linear_attention_stored_state(q, k, v, normalize=False, dtype="bf16")
    assert full[0, 0, :, 0].tolist() == [256.0, 257.0] and stored[0, 0, :, 0].tolist() == [256.0, 256.0]
    with pytest.raises(ValueError, match="'fp8' is not one of"):
        linear_attention_stored_state(q, k, v, normalize=False, dtype="fp8")


def test_an_fp8_weight_too_small_for_its_row_s_scale_flips_an_argmax():
    """A weight below 2^-10 of its row's amax, over 448, is stored as 0: the output it decided ties."""
    layer = StoredLinear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 1e-6]]))
        layer.bias.zero_()
    x = torch.ones(1, 2)
    assert layer(x).argmax().item() == 1
    layer.fp8 = True
    assert layer(x).argmax().item() == 0 and layer(x)[0, 0] == layer(x)[0, 1]
    assert layer.weight[1, 1].item() == pytest.approx(1e-6)  # the parameter itself is never rounded


# ---------------------------------------------------------------- the model and its evaluation

LAYERS = (
    LayerSpec("attention", heads=2, short_conv=3, mlp_ratio=2),
    LayerSpec("linear_attention", heads=3, feature_map="elu+1", mlp_ratio=1.5),
    LayerSpec("none", mlp_ratio=2, norm="rmsnorm"),
)
NARROW = {"kv_dtype": "fp8", "state_dtype": "bf16", "weight_dtype": "fp8"}


def _arch(narrow: bool, readout: str = "token", vocab: int = 16) -> ArchSpec:
    layers = tuple(
        dataclasses.replace(la, **{k: v for k, v in NARROW.items() if la.stores(k)}) if narrow else la for la in LAYERS
    )
    return ArchSpec(30, layers, vocab, vocab, readout)


def _scaled(model):
    """Block weights large enough that the blocks, not the embedding, decide the logits."""
    with torch.no_grad():
        for block in model.blocks:
            for linear in block.linears():
                linear.weight.mul_(25)
    return model


def test_at_full_precision_the_stored_forward_is_the_forward():
    model = _scaled(build(_arch(False), seed=0)).eval()
    tokens = torch.randint(0, 16, (3, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(tokens)
        assert torch.equal(model.stored_precision()(tokens), plain)


@pytest.mark.parametrize("field", ["kv_dtype", "state_dtype", "weight_dtype"])
def test_each_narrower_field_changes_the_logits_and_only_while_on(field):
    full = _arch(False)
    layers = tuple(dataclasses.replace(la, **{field: NARROW[field]}) if la.stores(field) else la for la in LAYERS)
    narrow = dataclasses.replace(full, layers=layers)
    model = _scaled(build(narrow, seed=0)).eval()
    reference = build(full).eval()
    reference.load_state_dict(model.state_dict())  # the same weights, nothing to round
    tokens = torch.randint(0, 16, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(tokens)
        assert torch.equal(plain, reference(tokens))
        stored = model.stored_precision()(tokens)
        assert not torch.allclose(stored, plain, rtol=0, atol=1e-4)
        assert torch.equal(model.stored_precision(False)(tokens), plain)  # off again: the model's own


def _narrowed(fields: dict[str, str]) -> ArchSpec:
    layers = tuple(dataclasses.replace(la, **{k: v for k, v in fields.items() if la.stores(k)}) for la in LAYERS)
    return dataclasses.replace(_arch(False), layers=layers)


@pytest.mark.parametrize(
    "fields", [{"state_dtype": "bf16"}, {"weight_dtype": "fp8"}, {"state_dtype": "bf16", "weight_dtype": "fp8"}]
)
def test_decoding_at_the_stored_precision_follows_its_forward(fields):
    """With the state in bf16 and the weights in fp8, a token-by-token decode rounds where the
    stored forward does (the same recurrence, each token's row quantized on its own): prefill T,
    then steps, equal the stored forward over T + steps; at the model's own precision they differ."""
    model = _scaled(build(_narrowed(fields), seed=0)).eval().stored_precision()
    tokens = torch.randint(0, 16, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(tokens)
        logits, cache = model.prefill(tokens[:, :7], capacity=11)
        steps = torch.stack([model.step(tokens[:, t], cache) for t in range(7, 11)], dim=1)
    torch.testing.assert_close(logits, want[:, :7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(steps, want[:, 7:], rtol=1e-4, atol=1e-4)
    if "state_dtype" in fields:
        assert cache.layers[1].state.dtype == torch.bfloat16 and cache.layers[1].z.dtype == torch.bfloat16
    with torch.no_grad():
        plain = model.stored_precision(False)(tokens)
    assert not torch.allclose(plain[:, 7:], steps, rtol=0, atol=1e-4)


def test_an_fp8_kv_cache_keeps_the_prompt_s_scales_and_saturates_past_them():
    """The prefill stores the keys and values the forward rotated as ``fp8_cache`` does (one scale
    per sequence and head, from the prompt); each step appends its row with those scales
    (``fp8_append``, saturating at ±448), and attends over the rows read back with them."""
    from kernels.attention.decode_fp8 import fp8_cache
    from nas.models.precision import fp8_append, stored_rows

    model = _scaled(build(_narrowed({"kv_dtype": "fp8"}), seed=1)).eval().stored_precision()
    tokens = torch.randint(0, 16, (3, 9), generator=torch.Generator().manual_seed(4))
    attention = model.blocks[0].mixer
    with torch.no_grad():
        _, keys, values, _ = attention._mix(model.blocks[0].norm1(model.embed(tokens)))  # rotated, unrounded
        _, cache = model.prefill(tokens[:, :5], capacity=9)
        layer = cache.layers[0]
        for rows, stored, scale in ((keys, layer.k, layer.k_scale), (values, layer.v, layer.v_scale)):
            want, want_scale = fp8_cache(rows[:, :, :5], capacity=9)
            assert stored.dtype == want.dtype and torch.equal(stored[:, :, :5].float(), want[:, :, :5].float())
            assert torch.equal(scale, want_scale)
        for t in range(5, 9):
            model.step(tokens[:, t], cache)
        for rows, stored, scale in ((keys, layer.k, layer.k_scale), (values, layer.v, layer.v_scale)):
            appended = fp8_append(rows[:, :, 5:].transpose(1, 2), scale[:, None].expand(-1, 4, -1)).transpose(1, 2)
            assert torch.equal(stored[:, :, 5:].float(), appended.float())
            assert stored.float().abs().max() <= FP8_MAX
        assert stored_rows(layer.k, layer.k_scale, torch.float32).shape == (3, 2, 9, 15)


def test_fp8_append_divides_by_the_fixed_scale_and_saturates():
    x = torch.tensor([[[1.0, -3.0, 1000.0, 0.01, 1e-5]]])  # [B1, H1, D5]
    scale = torch.tensor([[1.0 / 64]])
    got = fp8_append(x, scale).float()[0, 0].tolist()
    scaled = [float(np.float32(v) * np.float32(64.0)) for v in x.view(-1).tolist()]
    want = [_e4m3(y) if abs(y) <= FP8_MAX else math.copysign(FP8_MAX, y) for y in scaled]
    assert got == want and got[2] == FP8_MAX  # 64000 saturates to 448


def test_the_accuracy_at_the_stored_precision_differs_where_rounding_flips_predictions():
    """A task whose targets are the full-precision model's own predictions: 1.0 at full precision;
    fp8 KV cache and weights and a bf16 state flip some of them. At full precision there is no
    second score."""
    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=16,n_test=48")
    model = _scaled(build(_arch(True), task, seed=0)).eval()
    with torch.no_grad():  # every position scored, its target the model's own prediction
        task = dataclasses.replace(task, y_test=model(task.x_test.long()).argmax(-1).to(task.y_test.dtype))
    full, _ = evaluate(model, task, torch.device("cpu"))
    (stored,) = evaluate_stored(model, task, torch.device("cpu"))
    assert full == 1.0 and stored < 1.0
    assert not model.at_stored_precision  # left as it was
    same = build(_arch(False), task).eval()
    same.load_state_dict(model.state_dict())
    assert evaluate_stored(same, task, torch.device("cpu")) is None


def test_a_training_reports_the_accuracy_at_its_precision_and_at_full_beside_it():
    """train and train_population score at the stored precision and keep the full-precision
    accuracy of the same models beside it; at full precision that second number is None and the
    accuracy is the plain evaluation's. The dtypes do not change the training: the same seed
    trains the same weights."""
    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=64,n_test=32")
    spec = TrainSpec(lr=1e-2, steps=4, batch_size=8, seeds=2, lr_multipliers=(1.0,), seed=3)
    narrow = train_population(_arch(True), task, spec, device="cpu")
    full = train_population(_arch(False), task, spec, device="cpu")
    assert full.full_precision_accuracy is None
    assert narrow.full_precision_accuracy == full.accuracy  # the same models, at their own precision
    state = full.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in narrow.model.state_dict().items())
    stored = [evaluate_stored(m, task, torch.device("cpu"))[0] for m in (narrow.model,)]
    assert narrow.kept[2] == stored[0]  # the kept variant's own accuracy is at the stored precision
    single = dataclasses.replace(spec, seeds=1)
    model = build(_arch(True), task, seed=single.seed)
    result = train(model, task, single, device="cpu")
    assert result.full_precision_accuracy == evaluate(model, task, torch.device("cpu"))[0]
    assert result.accuracy == evaluate_stored(model, task, torch.device("cpu"))[0]


@pytest.mark.gpu
@requires_cuda
def test_gpu_stored_accuracy_equals_the_cpu_s_within_what_bf16_moves_full_precision():
    """The accuracy at the stored precision is the same rounding on either device: on the GPU
    (bf16 autocast, as the trainer evaluates) it may differ from the CPU's (fp32) only by what bf16
    moves at full precision on the same rows, plus 2 points. Targets are the CPU full-precision
    model's own predictions, so every flipped prediction counts."""
    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=16,n_test=256")
    model = _scaled(build(_arch(True), task, seed=0)).eval()
    with torch.no_grad():
        task = dataclasses.replace(task, y_test=model(task.x_test.long()).argmax(-1).to(task.y_test.dtype))
    cpu = torch.device("cpu")
    (stored_cpu,) = evaluate_stored(model, task, cpu)
    gpu = torch.device("cuda")
    model, task = model.to(gpu), task.to(gpu)
    full_gpu, _ = evaluate(model, task, gpu)
    (stored_gpu,) = evaluate_stored(model, task, gpu)
    assert stored_cpu < 1.0  # the rounding flips some predictions: the comparison can fail
    assert full_gpu >= 0.9  # bf16 alone must not move the full-precision predictions far: else the bound says little
    assert abs(stored_gpu - stored_cpu) <= (1.0 - full_gpu) + 0.02, (stored_cpu, stored_gpu, full_gpu)
