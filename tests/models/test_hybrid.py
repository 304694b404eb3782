"""HybridModel as a whole: causality, any sequence length, readouts, parameter count, seeding, gradients."""

from __future__ import annotations

import random

import pytest
import torch

from nas.latency import count_params
from nas.models import HybridModel, build
from nas.spec import ACTIVATIONS, FEATURE_MAPS, NORMS, ArchSpec, LayerSpec
from nas.tasks import IGNORE_INDEX, Task

V, D = 29, 48  # odd vocabulary, width with odd divisors
ATT = LayerSpec("attention", heads=4)
LIN = LayerSpec("linear_attention", heads=3, feature_map="elu+1", norm="rmsnorm")
LIN_ID = LayerSpec("linear_attention", heads=2, feature_map="identity", activation="silu")
MLP = LayerSpec("none", mlp_ratio=2.0)
EMPTY = LayerSpec("none", mlp_ratio=0)  # no mixer, no MLP: the identity


def conv(layer: LayerSpec, k: int = 4) -> LayerSpec:
    return LayerSpec(**{**layer.__dict__, "short_conv": k})


STACKS = [
    pytest.param((ATT,), id="A"),
    pytest.param((LIN,), id="L"),
    pytest.param((MLP,), id="M"),
    pytest.param((ATT, LIN, MLP), id="A-L-M"),
    pytest.param((LIN_ID, EMPTY, ATT, MLP), id="L-id-empty-A-M"),
    pytest.param((conv(ATT),), id="A-conv"),
    pytest.param((conv(LIN), conv(ATT, 3), MLP), id="Lconv-Aconv3-M"),
    pytest.param((MLP, conv(LIN_ID, 7), EMPTY), id="M-Lidconv7-empty"),
]


def arch_of(layers: tuple[LayerSpec, ...], readout: str = "token", n_out: int = V) -> ArchSpec:
    return ArchSpec(D, layers, V, n_out, readout)


def tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layers", STACKS)
def test_changing_token_t_never_changes_earlier_logits(layers):
    model = build(arch_of(layers), seed=0).eval()
    x = tokens(3, 37)
    with torch.no_grad():
        base = model(x)
        for t in (0, 1, 18, 36):
            x2 = x.clone()
            x2[:, t] = (x2[:, t] + 1 + torch.arange(3)) % V
            out = model(x2)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0, msg=f"token {t} leaked backwards")
            assert not torch.allclose(out[:, t], base[:, t]), "the changed token must change its own logits"


@pytest.mark.parametrize("layers", STACKS)
def test_runs_at_any_length_and_prefixes_agree(layers):
    """Positions are computed at run time: a prefix of a longer input gives the same logits as the
    prefix alone, at lengths far from any training length."""
    model = build(arch_of(layers), seed=1).eval()
    x = tokens(2, 150)
    with torch.no_grad():
        full = model(x)
        assert full.shape == (2, 150, V) and torch.isfinite(full).all()
        for T in (1, 5, 37, 64, 130):
            torch.testing.assert_close(model(x[:, :T]), full[:, :T], atol=1e-5, rtol=1e-5, msg=f"T={T}")


@pytest.mark.parametrize("layers", STACKS[:5])
def test_last_readout_is_the_last_token_logits(layers):
    last = build(arch_of(layers, "last", n_out=7), seed=3).eval()
    token = build(arch_of(layers, "token", n_out=7), seed=3).eval()  # same parameters, same seed
    x = tokens(5, 37)
    with torch.no_grad():
        out = last(x)
        assert out.shape == (5, 7)
        torch.testing.assert_close(out, token(x)[:, -1], atol=1e-6, rtol=1e-6)
        assert last(x[:, :4]).shape == (5, 7)


def random_arch(rng: random.Random) -> ArchSpec:
    d = rng.choice([6, 12, 30, 48])
    heads = [h for h in (1, 2, 3, 4, 6, 12) if d % h == 0]
    layers = []
    for _ in range(rng.randint(1, 5)):
        mixer = rng.choice(["attention", "linear_attention", "none"])
        layers.append(
            LayerSpec(
                mixer,
                heads=rng.choice(heads) if mixer != "none" else 0,
                feature_map=rng.choice(FEATURE_MAPS) if mixer == "linear_attention" else None,
                short_conv=rng.choice([0, 4, rng.randint(1, 16)]) if mixer != "none" else 0,
                # 0 (no MLP), fractional widths that round both ways, and tiny ratios → one hidden unit
                mlp_ratio=rng.choice([0, 0, 0.01, 1 / 3, 0.5, 1.0, 2.5, 4.0]),
                activation=rng.choice(ACTIVATIONS),
                norm=rng.choice(NORMS),
            )
        )
    return ArchSpec(d, tuple(layers), rng.randint(1, 70), rng.randint(1, 40), rng.choice(["token", "last"]))


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"batch{s}")
def test_parameter_count_matches_cost_model(seed):
    rng = random.Random(seed)
    for _ in range(12):
        arch = random_arch(rng)
        model = HybridModel(arch)
        assert sum(p.numel() for p in model.parameters()) == count_params(arch), arch


@pytest.mark.parametrize(
    "layers",
    [
        pytest.param((EMPTY,), id="only-empty"),
        pytest.param((EMPTY, EMPTY, conv(ATT, 16)), id="empty-empty-Aconv16"),
        pytest.param((LayerSpec("none", mlp_ratio=0.001),), id="tiny-mlp-ratio"),
    ],
)
def test_parameter_count_edge_layers(layers):
    arch = arch_of(layers)
    assert sum(p.numel() for p in HybridModel(arch).parameters()) == count_params(arch)


def test_build_is_deterministic_per_seed_and_leaves_global_rng_alone():
    arch = arch_of(STACKS[6].values[0])
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = build(arch, seed=5), build(arch, seed=5), build(arch, seed=6)
    assert torch.equal(torch.rand(3), before), "build(seed=...) must not consume the global generator"
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    differ = [name for name, pa in a.named_parameters() if not torch.equal(pa, dict(c.named_parameters())[name])]
    assert "embed.weight" in differ and "head.weight" in differ and any("qkv.weight" in n for n in differ)


def _task(vocab: int, n_out: int, readout: str) -> Task:
    x = torch.zeros(4, 8, dtype=torch.long)
    y = torch.zeros(4, 8, dtype=torch.long) if readout == "token" else torch.zeros(4, dtype=torch.long)
    return Task("hand", {}, vocab, n_out, readout, x, y, x, y)


@pytest.mark.parametrize(
    "task_args",
    [
        pytest.param((V + 1, V, "token"), id="vocab"),
        pytest.param((V, V - 1, "token"), id="n_out"),
        pytest.param((V, V, "last"), id="readout"),
    ],
)
def test_build_rejects_a_mismatched_task(task_args):
    with pytest.raises(ValueError, match="arch is sized for"):
        build(arch_of((ATT,)), _task(*task_args))


def test_build_accepts_a_matching_task():
    assert isinstance(build(arch_of((ATT,)), _task(V, V, "token")), HybridModel)
    assert isinstance(build(arch_of((ATT,), "last", n_out=3), _task(V, 3, "last")), HybridModel)


@pytest.mark.parametrize("layers", STACKS)
def test_gradient_reaches_every_parameter(layers):
    model = build(arch_of(layers), seed=0)
    x = torch.arange(37).remainder(V).unsqueeze(0).repeat(2, 1)  # every token id appears
    y = tokens(2, 37, seed=1)
    y[:, :3] = IGNORE_INDEX
    _task(V, V, "token").loss(model(x), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name} has a zero/non-finite gradient"


def test_residual_projections_get_the_scaled_init():
    """GPT-2 init: the projections that add into the residual stream (mixer out, MLP down) draw
    N(0, 0.02/sqrt(2·depth)), every other matrix N(0, 0.02); the layout is named by the block."""
    torch.manual_seed(0)
    depth, d = 4, 256
    model = HybridModel(ArchSpec(d, [LayerSpec("attention", heads=4, mlp_ratio=4.0)] * depth, V, V))
    residual = {id(m.weight) for b in model.blocks for m in b.residual_projections()}
    assert len(residual) == 2 * depth
    for block in model.blocks:
        assert block.mlp_up.out_features == 4 * d and block.mlp_down.in_features == 4 * d
    for name, p in model.named_parameters():
        if p.dim() == 2 and not name.startswith("embed"):
            expected = 0.02 / (2 * depth) ** 0.5 if id(p) in residual else 0.02
            assert p.std().item() == pytest.approx(expected, rel=0.05), name
