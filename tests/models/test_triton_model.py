"""TritonModel (kernels only) against the torch HybridModel it was built from.

On CPU every kernel runs under Triton's interpreter (tests/conftest.py), in fp32, so the two
forwards agree to rounding; on a GPU the ``gpu`` test compares bf16 kernels with the torch model
and replays the captured CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from nas.latency import KernelCompileError
from nas.models import build, to_triton
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda, requires_interpreter, spy_norm_launches

ARCHS = {
    "A-conv+MLP": [LayerSpec("attention", 2, None, 4, 2.0)],
    "L-elu-conv": [LayerSpec("linear_attention", 1, "elu+1", 4, 0.0, "silu", "rmsnorm")],
    "A L M mixed": [
        LayerSpec("attention", 2, None, 0, 2.0, "relu"),
        LayerSpec("linear_attention", 2, "identity", 4, 1.5, "gelu", "rmsnorm"),
        LayerSpec("none", mlp_ratio=2.0, activation="silu"),
    ],
    "L-relu": [LayerSpec("linear_attention", 2, "relu", 0, 2.0)],
    # head dims 8 (zero-padded to the kernels' 16) and 16 in one model: rotary tables per head dim
    "A hd8 + A hd16": [LayerSpec("attention", 4, None, 4, 0.0), LayerSpec("attention", 2, None, 0, 2.0)],
    "L hd8 elu+1": [LayerSpec("linear_attention", 4, "elu+1", 4, 0.0)],
    "L hd8 identity + relu": [
        LayerSpec("linear_attention", 4, "identity", 0, 0.0),
        LayerSpec("linear_attention", 4, "relu", 4, 2.0),
    ],
    # the other side of each fold: the identity map's q scale on the conv, elu+1's −∞ keys on
    # the projection's bias
    "L hd8 identity conv + elu+1": [
        LayerSpec("linear_attention", 4, "identity", 4, 0.0),
        LayerSpec("linear_attention", 4, "elu+1", 0, 1.0),
    ],
}
# head dim 24 run as 32 (d 48, 2 heads): rotary halves of 12 channels, P/D not a power of two
WIDE = {
    "A L hd24": [LayerSpec("attention", 2, None, 4, 0.0), LayerSpec("linear_attention", 2, "elu+1", 0, 1.0)],
    "L hd24 identity conv": [LayerSpec("linear_attention", 2, "identity", 4, 1.0)],
}


def _arch(layers: list[LayerSpec], readout: str = "token", d: int = 32) -> ArchSpec:
    return ArchSpec(d, layers, 29, 29 if readout == "token" else 5, readout)


@requires_interpreter
@pytest.mark.parametrize("name", list(ARCHS))
def test_interpreted_kernels_match_the_torch_model(name):
    model = build(_arch(ARCHS[name]), seed=1).eval()
    tokens = torch.randint(0, 29, (2, 37), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(tokens)
    got = to_triton(model, dtype=torch.float32)(tokens)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@requires_interpreter
@pytest.mark.parametrize("name", list(WIDE))
def test_head_dim_24_runs_as_32(name):
    model = build(_arch(WIDE[name], d=48), seed=6).eval()
    tokens = torch.randint(0, 29, (2, 37), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = model(tokens)
    tm = to_triton(model, dtype=torch.float32)
    assert all(blk.qkv[0].shape == (3 * 2 * 32, 48) and blk.out[0].shape == (48, 2 * 32) for blk in tm.blocks)
    torch.testing.assert_close(tm(tokens), expected, rtol=1e-4, atol=1e-4)


@requires_interpreter
def test_padding_is_in_the_weights_not_the_forward(monkeypatch):
    """A padded head dim costs the forward no torch copies: each mixer kernel reads the very
    tensor the projection (or the short conv after it) wrote, already ``[B, T, 3·H·P]``."""
    import kernels.attention.triton as fa
    import kernels.conv as conv
    import kernels.linear as lin
    import kernels.linear_attention.triton as la

    written, seen = set(), []

    def producer(real):
        def call(*args, **kw):
            out = real(*args, **kw)
            written.add(out.data_ptr())
            return out

        return call

    def mixer(real):
        def call(qkv, heads, **kw):
            seen.append((tuple(qkv.shape), qkv.data_ptr() in written))
            return real(qkv, heads, **kw)

        return call

    monkeypatch.setattr(lin, "linear", producer(lin.linear))
    monkeypatch.setattr(conv, "causal_depthwise_conv", producer(conv.causal_depthwise_conv))
    monkeypatch.setattr(fa, "flash_attention_qkv", mixer(fa.flash_attention_qkv))
    monkeypatch.setattr(la, "linear_attention_qkv", mixer(la.linear_attention_qkv))
    model = build(_arch(WIDE["A L hd24"], d=48), seed=6).eval()
    to_triton(model, dtype=torch.float32)(torch.randint(0, 29, (2, 5)))
    assert seen == [((2, 5, 3 * 2 * 32), True)] * 2


@requires_interpreter
@pytest.mark.parametrize("name", [n for n in ARCHS if "hd8" in n])
def test_padded_head_dims_give_the_mixers_output(name):
    """Head dim 8 runs zero-padded to 16. A fresh model's mixer adds little to the logits and
    its softmax is nearly uniform, so the out projection and the q/k rows are scaled up here: a
    wrong padding (φ(0) = 1 leaking into the elu+1 normaliser, rotary pairs split across the
    pad, the padded head dim's softmax scale) then moves the logits by O(1)."""
    model = build(_arch(ARCHS[name]), seed=4).eval()
    with torch.no_grad():
        for block in model.blocks:
            if block.mixer is not None:
                block.mixer.out.weight.mul_(30.0)
                block.mixer.qkv.weight[: 2 * model.arch.d_model].mul_(6.0)  # peaked softmax: scale and rotary matter
    tokens = torch.randint(0, 29, (2, 37), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(tokens)
    got = to_triton(model, dtype=torch.float32)(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@requires_interpreter
def test_last_readout_and_other_lengths():
    model = build(_arch(ARCHS["A L M mixed"], readout="last"), seed=2).eval()
    tm = to_triton(model, dtype=torch.float32)
    for T in (5, 40):
        tokens = torch.randint(0, 29, (3, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            torch.testing.assert_close(tm(tokens), model(tokens), rtol=1e-4, atol=1e-4)


@requires_interpreter
@pytest.mark.parametrize("readout", ["token", "last"])
def test_hidden_and_readout_widths_are_padded_in_the_weights(readout, monkeypatch):
    """An MLP hidden width of 27 (ratio 0.85 of d 32) and 29 or 5 outputs run as 32 and 16
    columns of zero weights: every linear the forward launches has K a multiple of 16 and N of
    8 (the residual width 32 is), the result is the torch model's, and the logits are n_out wide."""
    import kernels.linear as lin
    from kernels.linear.configs import FEATURE_ALIGN

    layers = [LayerSpec("attention", 2, None, 4, 0.85), LayerSpec("none", mlp_ratio=1.3, activation="silu")]
    model = _random_norms(build(_arch(layers, readout=readout), seed=13).eval(), seed=14)
    tm = to_triton(model, dtype=torch.float32)
    n_out = model.arch.n_out
    assert [b.up[0].shape for b in tm.blocks] == [(32, 32), (48, 32)]  # 27 → 32, round(41.6) = 42 → 48
    assert [b.down[0].shape for b in tm.blocks] == [(32, 32), (32, 48)]
    assert tm.head[0].shape == (-(-n_out // FEATURE_ALIGN) * FEATURE_ALIGN, 32)
    shapes = []
    real = lin.linear

    def spy(x, weight, *args, **kw):
        shapes.append(tuple(weight.shape))
        return real(x, weight, *args, **kw)

    monkeypatch.setattr(lin, "linear", spy)
    tokens = torch.randint(0, 29, (2, 19), generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        expected = model(tokens)
    got = tm(tokens)
    assert got.shape == expected.shape and got.shape[-1] == n_out
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert len(shapes) == 7 and all(k % 16 == 0 and n % 8 == 0 for n, k in shapes), shapes


def _random_norms(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every norm's scale (and LayerNorm's shift) drawn away from the (1, 0) a model starts
    with, so a scale or shift the fold dropped or misplaced changes the output; eps 0.25, so an
    eps the linear was not handed changes it too."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm):
                m.eps = 0.25
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=gen))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=gen))
    return model


@requires_interpreter
@pytest.mark.parametrize("name", ["L hd8 elu+1", "L hd8 identity conv + elu+1", "A hd8 + A hd16"])
def test_folded_norms_with_padded_heads(name):
    """The fold happens before the heads are padded: padded qkv rows stay zero (or −∞ for
    elu+1's keys), the identity map's q scale applies to the folded rows."""
    model = _random_norms(build(_arch(ARCHS[name]), seed=8).eval(), seed=9)
    tokens = torch.randint(0, 29, (2, 21), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        expected = model(tokens)
    torch.testing.assert_close(to_triton(model, dtype=torch.float32)(tokens), expected, rtol=1e-4, atol=1e-4)


def test_layernorm_sums_are_of_the_weights_as_cast():
    """LayerNorm's prologue subtracts mean·Σₖ W: the sums must be of the bf16 weight the matmul
    reads, not of the fp32 one it was cast from (the two differ by the rounding)."""
    from kernels.linear.reference import weight_sums

    model = _random_norms(build(_arch(ARCHS["A-conv+MLP"]), seed=11).eval(), seed=12)  # layernorm
    tm = to_triton(model, dtype=torch.bfloat16)
    blk = tm.blocks[0]
    for weight, sums in ((blk.qkv[0], blk.qkv_sums), (blk.up[0], blk.up_sums), (tm.head[0], tm.head_sums)):
        assert sums is not None and sums.dtype == torch.float32
        assert torch.equal(sums, weight_sums(weight))
    unrounded = model.blocks[0].mlp_up.weight.detach().float() * model.blocks[0].norm2.weight.detach().float()
    assert not torch.equal(blk.up_sums, unrounded.sum(1))


@requires_interpreter
@pytest.mark.parametrize("readout", ["token", "last"])
def test_norms_fold_into_the_linears_after_them(readout, monkeypatch):
    """Both norm kinds, with scales and shifts away from (1, 0): the folded forward (no norm
    launch: each linear gathers its row statistics) and the unfolded one (a launch per norm)
    both give the torch model's output; so does the fold where the linears take the cuBLAS
    route (a unit-affine norm launch before each)."""
    import kernels.linear.triton as lt

    model = _random_norms(build(_arch(ARCHS["A L M mixed"], readout=readout), seed=4).eval(), seed=5)
    tokens = torch.randint(0, 29, (2, 21), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = model(tokens)
    launches = spy_norm_launches(monkeypatch)
    folded = to_triton(model, dtype=torch.float32)
    torch.testing.assert_close(folded(tokens), expected, rtol=1e-4, atol=1e-4)
    assert launches == [], "a folded norm still ran its own kernel"
    unfolded = to_triton(model, dtype=torch.float32, fold_norms=False)
    torch.testing.assert_close(unfolded(tokens), expected, rtol=1e-4, atol=1e-4)
    assert len(launches) == 6  # norm1 + norm2 of the first two blocks, norm2 of the third, final
    lt.set_route("cublas")
    try:
        torch.testing.assert_close(folded(tokens), expected, rtol=1e-4, atol=1e-4)
    finally:
        lt.set_route(None)
    assert len(launches) == 6 + 6


@pytest.mark.parametrize(("d", "heads", "mixer"), [(256, 1, "attention"), (30, 2, "linear_attention")])
def test_unsupported_head_dim_is_a_kernel_error(d, heads, mixer):
    """Above the largest kernel head dim (128), or odd (no rotary halves to pad): a KernelCompileError."""
    model = build(_arch([LayerSpec(mixer, heads, "relu" if mixer != "attention" else None, 0, 1.0)], d=d))
    with pytest.raises(KernelCompileError, match=f"head dim {d // heads} has no {mixer} kernel"):
        to_triton(model)


@pytest.mark.gpu
@requires_cuda
def test_gpu_bf16_matches_and_graph_replays():
    model = (
        build(
            ArchSpec(
                128,
                [
                    LayerSpec("attention", 2, None, 4, 4.0),
                    LayerSpec("linear_attention", 2, "elu+1", 4, 4.0),
                    LayerSpec("none", mlp_ratio=4.0),
                ],
                512,
                512,
            ),
            seed=0,
        )
        .cuda()
        .eval()
    )
    tokens = torch.randint(0, 512, (8, 512), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        expected = model(tokens).float()
    tm = to_triton(model)
    eager = tm(tokens).float()
    rel = ((eager - expected).norm() / expected.norm()).item()
    assert rel < 3e-2, rel
    replay = tm.capture(tokens)
    torch.testing.assert_close(replay().float(), eager, rtol=0, atol=0)
    tokens.copy_(torch.randint(0, 512, tokens.shape, device="cuda"))
    assert not torch.equal(replay().float(), eager)  # the replay reads the refilled buffer
