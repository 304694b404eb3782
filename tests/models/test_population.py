"""``Population``: P variants of one architecture stacked into one model compute what each
variant computes alone, for every mixer, norm, conv, readout and odd sizes."""

from __future__ import annotations

import pytest
import torch

from nas.models import Population, build
from nas.spec import ArchSpec, LayerSpec

ARCHS = {
    "attention-conv-layernorm": ArchSpec(
        24, (LayerSpec("attention", heads=3, short_conv=3, mlp_ratio=2.0),), vocab_size=11, n_out=11
    ),
    "linear-elu-rmsnorm": ArchSpec(
        20, (LayerSpec("linear_attention", heads=2, feature_map="elu+1", norm="rmsnorm"),), vocab_size=7, n_out=7
    ),
    "hybrid-identity-relu-mlp-only": ArchSpec(
        18,
        (
            LayerSpec("linear_attention", heads=1, feature_map="identity", short_conv=4, mlp_ratio=0.0),
            LayerSpec("none", mlp_ratio=1.5, activation="silu"),
            LayerSpec("attention", heads=2, activation="relu", norm="rmsnorm"),
            LayerSpec("linear_attention", heads=3, feature_map="relu"),
        ),
        vocab_size=13,
        n_out=13,
    ),
    "readout-last": ArchSpec(16, (LayerSpec("attention", heads=2),), vocab_size=9, n_out=5, readout="last"),
}


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
@pytest.mark.parametrize("P", [1, 3])
def test_each_variant_computes_what_its_model_computes(arch, P):
    models = [build(arch, seed=10 + p) for p in range(P)]
    pop = Population(models)
    B, T = 5, 19  # odd: T is not a multiple of the linear-attention chunk
    x = torch.randint(0, arch.vocab_size, (P * B, T), generator=torch.Generator().manual_seed(0))
    out = pop(x)
    for p, model in enumerate(models):
        torch.testing.assert_close(out[p * B : (p + 1) * B], model(x[p * B : (p + 1) * B]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
def test_gradients_reach_each_variant_from_its_own_rows_only(arch):
    models = [build(arch, seed=p) for p in range(3)]
    pop = Population(models)
    x = torch.randint(0, arch.vocab_size, (3 * 4, 7), generator=torch.Generator().manual_seed(1))
    pop(x)[4:8].sum().backward()  # variant 1's rows
    models[1](x[4:8]).sum().backward()
    for (name, stacked), (_, alone) in zip(pop.net.named_parameters(), models[1].named_parameters(), strict=True):
        assert stacked.shape == (3, *alone.shape), name
        assert stacked.grad[0].abs().max() == 0 and stacked.grad[2].abs().max() == 0, name
        torch.testing.assert_close(stacked.grad[1], alone.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_variant_comes_back_as_its_own_model():
    arch = ARCHS["hybrid-identity-relu-mlp-only"]
    models = [build(arch, seed=p) for p in range(2)]
    pop = Population(models)
    state = torch.random.get_rng_state()
    back = pop.variant(1)
    assert torch.equal(torch.random.get_rng_state(), state)  # rebuilding it draws no random numbers
    for (name, a), (_, b) in zip(back.state_dict().items(), models[1].state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with torch.no_grad():
        next(pop.parameters()).add_(1.0)
    assert torch.equal(next(back.parameters()), next(models[1].parameters()))  # a copy, not a view
