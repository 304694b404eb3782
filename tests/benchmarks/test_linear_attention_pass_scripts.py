"""The two-pass benchmark scripts call the library's passes with its current signatures: their
forward (``linear_attention_pass_variants._forward``) and their pass-apart timing
(``linear_attention_two_pass._passes``, its timer replaced by one call of each function) run under
Triton's interpreter on the CPU and match the fp32 reference. A script left behind by a change to
the passes fails here, not on the GPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks import linear_attention_pass_variants as variants
from benchmarks import linear_attention_two_pass as two_pass
from benchmarks.default_peers import _views
from kernels.linear_attention import configs
from kernels.linear_attention import reference as ref
from kernels.linear_attention import triton as la

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's CPU path")


def _qkv(B: int, L: int, H: int, D: int) -> torch.Tensor:
    return torch.randn(B, L, 3 * H * D, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("B,H,L,D", [(1, 2, 37, 32), (2, 1, 50, 16)])
def test_the_pass_variants_forward_matches_the_reference(B, H, L, D):
    qkv = _qkv(B, L, H, D)
    plan = la.two_pass_plan(qkv.device, B * H, L, D, configs.TWO_PASS_INTERPRETER)
    assert plan.groups > 1, "odd lengths over groups of 2 chunks: the carry is on the path"
    got = variants._forward(qkv, H, plan)
    q, k, v = (t.float() for t in _views(qkv, H))
    expected = ref.linear_attention(q, k, v, feature_map="identity").reshape(B, L, H * D)
    assert ((got - expected).norm() / expected.norm()).item() < 1e-4


def test_the_passes_timed_apart_run_both_passes(monkeypatch):
    B, H, L, D = 1, 2, 37, 32
    copies = [_qkv(B, L, H, D)]
    ran = []

    def once(fns):
        for fn in fns:
            ran.append(fn())
        return {"median_us": 0.0}

    monkeypatch.setattr(two_pass, "_time", once)
    out = two_pass._passes(copies, H, configs.TWO_PASS_INTERPRETER)
    assert out["groups"] > 1 and len(ran) == 2
    states, _, totals = ran[0]  # pass 1's buffers: the state before every chunk, the groups' carry
    chunk = configs.TWO_PASS_INTERPRETER.chunk
    assert states.shape == (B * H, -(-L // chunk), D, D)
    assert totals.shape[:2] == (B * H, out["groups"]) and torch.isfinite(totals).all()


def test_a_bad_shape_for_the_pass_variants_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        variants.main(["--shapes", "16,8,2048"])
    assert exc.value.code == 2 and "invalid shape '16,8,2048'" in capsys.readouterr().err
