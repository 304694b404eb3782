"""kernels/linear_attention/step_bf16: the decode step over a bf16 state against the torch math of
the stored state (each sum in fp32 from the stored value, rounded to bf16 when stored), token by
token, and a chain of steps against ``nas.models.precision.linear_attention_stored_state`` (what
the accuracy objective scores a ``state_dtype: bf16`` candidate with).

Without CUDA the kernel runs under Triton's interpreter at small odd shapes, with every column
split the interpreter's launch allows; the ``gpu`` tests run every launch ``step_config`` may
choose at real sizes and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from kernels.linear_attention import configs
from kernels.linear_attention import reference as ref
from kernels.linear_attention.configs import StepConfig
from kernels.linear_attention.step_bf16 import linear_attention_step_bf16
from tests.kernels._support import CPU, CUDA, assert_rel_close, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

FEATURES = [pytest.param(name, id=name) for name in ref.FEATURE_MAPS]


def _stored_step(q, k, v, state, z, feature_map: str) -> torch.Tensor:
    """The torch math of one step over a bf16 state, in place: what the kernel must store and return."""
    B, H, D = q.shape
    qf, kf = ref.feature(q.float(), feature_map), ref.feature(k.float(), feature_map)
    if not ref.normalizes(feature_map):
        qf = qf * D**-0.5
    state.copy_((state.float() + kf.unsqueeze(-1) * v.float().unsqueeze(-2)).to(torch.bfloat16))
    out = (qf.unsqueeze(-1) * state.float()).sum(-2)
    if z is not None:
        z.copy_((z.float() + kf).to(torch.bfloat16))
    if ref.normalizes(feature_map):
        out = out / ((qf * z.float()).sum(-1, keepdim=True) + ref.EPS)
    return out.reshape(B, H * D)


def _inputs(B: int, H: int, D: int, T: int, dtype, device, key: tuple):
    gen = _gen(*key)
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(device, dtype) for _ in "qkv")
    state = (torch.randn(B, H, D, D, generator=gen) * 0.1).to(device, torch.bfloat16)
    z = (torch.rand(B, H, D, generator=gen) + 1.0).to(device, torch.bfloat16)
    return q, k, v, state, z


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize(("B", "H", "D"), [(1, 1, 16), (3, 2, 32), (2, 3, 64)])
def test_each_step_stores_and_reads_the_rounded_state(B: int, H: int, D: int, feature_map: str) -> None:
    """Five steps, each column split of the interpreter's launch: the stored state and z equal
    the torch math's bit for bit (fp32 sums rounded to bf16), the output to fp32 round-off."""
    for block_v in sorted({16, D // 2, D} - {0}):
        if D % block_v or block_v < 16:
            continue
        q, k, v, state, z = _inputs(B, H, D, 5, torch.float32, CPU, ("step-bf16", B, H, D, feature_map))
        want_state, want_z = state.clone(), z.clone()
        uses_z = ref.normalizes(feature_map)
        for t in range(5):
            got = linear_attention_step_bf16(
                q[:, :, t],
                k[:, :, t],
                v[:, :, t],
                state,
                z if uses_z else None,
                feature_map=feature_map,
                config=StepConfig(block_v, 4),
            )
            want = _stored_step(q[:, :, t], k[:, :, t], v[:, :, t], want_state, want_z if uses_z else None, feature_map)
            assert torch.equal(state.view(torch.int16), want_state.view(torch.int16)), (t, block_v)
            if uses_z:
                assert torch.equal(z.view(torch.int16), want_z.view(torch.int16)), (t, block_v)
            assert_rel_close(got, want, 1e-5)


@requires_interpreter
@pytest.mark.parametrize("feature_map", ["identity", "elu+1"])
def test_a_chain_of_steps_is_what_the_accuracy_objective_scores(feature_map: str) -> None:
    """From a zero state, T steps of the kernel give ``linear_attention_stored_state(..., "bf16")``
    on the same features (the objective's reference of a bf16 state) to fp32 round-off."""
    from nas.models.precision import linear_attention_stored_state

    B, H, T, D = 2, 3, 9, 32
    q, k, v, _, _ = _inputs(B, H, D, T, torch.float32, CPU, ("chain-bf16", feature_map))
    state = torch.zeros(B, H, D, D, dtype=torch.bfloat16)
    z = torch.zeros(B, H, D, dtype=torch.bfloat16)
    uses_z = ref.normalizes(feature_map)
    got = torch.stack(
        [
            linear_attention_step_bf16(
                q[:, :, t], k[:, :, t], v[:, :, t], state, z if uses_z else None, feature_map=feature_map
            )
            for t in range(T)
        ],
        1,
    )  # [B, T, H·D]
    qf, kf = ref.feature(q, feature_map), ref.feature(k, feature_map)
    if not uses_z:
        qf = qf * D**-0.5
    want = linear_attention_stored_state(qf, kf, v, normalize=uses_z, dtype="bf16")  # [B, H, T, D]
    assert_rel_close(got, want.permute(0, 2, 1, 3).reshape(B, T, H * D), 1e-5)
    fp32 = linear_attention_stored_state(qf, kf, v, normalize=uses_z, dtype="fp32")
    assert not torch.allclose(want, fp32, rtol=0, atol=0)  # the rounding is there to be matched


@requires_interpreter
def test_bad_inputs_are_named() -> None:
    q, k, v, state, z = _inputs(2, 2, 16, 1, torch.float32, CPU, ("bad-bf16",))
    q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]
    with pytest.raises(ValueError, match=r"state must be contiguous bf16"):
        linear_attention_step_bf16(q, k, v, state.float(), z, feature_map="elu+1")
    with pytest.raises(ValueError, match=r"z must be contiguous bf16"):
        linear_attention_step_bf16(q, k, v, state, z.float(), feature_map="elu+1")
    with pytest.raises(ValueError, match="normalized: z"):
        linear_attention_step_bf16(q, k, v, state, None, feature_map="elu+1")
    with pytest.raises(ValueError, match="feature_map must be one of"):
        linear_attention_step_bf16(q, k, v, state, z, feature_map="tanh")


# ---------------------------------------------------------------------------------------------
# GPU: every launch step_config may choose, compiled, at real sizes; and a CUDA graph.
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", ["identity", "elu+1"])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_gpu_bf16_state_every_config(D: int, feature_map: str) -> None:
    B, H = 16, 8
    for config in configs.step_configs(D):
        q, k, v, state, z = _inputs(B, H, D, 3, torch.bfloat16, CUDA, ("gpu-bf16", D, feature_map, config))
        want_state, want_z = state.clone(), z.clone()
        for t in range(3):
            got = linear_attention_step_bf16(
                q[:, :, t], k[:, :, t], v[:, :, t], state, z, feature_map=feature_map, config=config
            )
            want = _stored_step(q[:, :, t], k[:, :, t], v[:, :, t], want_state, want_z, feature_map)
            # one bf16 rounding apart at most where the fp32 sums differ in their last bit
            assert_rel_close(state.float(), want_state.float(), 1e-2)
            assert_rel_close(got, want, 2e-2)


@pytest.mark.gpu
@requires_cuda
def test_gpu_bf16_state_step_replayed_from_a_cuda_graph() -> None:
    B, H, D, feature_map = 4, 8, 64, "elu+1"
    q, k, v, state, z = _inputs(B, H, D, 8, torch.bfloat16, CUDA, ("graph-bf16",))
    qt, kt, vt = (torch.empty_like(t[:, :, 0]) for t in (q, k, v))
    want_state, want_z = state.clone(), z.clone()
    linear_attention_step_bf16(qt, kt, vt, state.clone(), z.clone(), feature_map=feature_map)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_attention_step_bf16(qt, kt, vt, state, z, feature_map=feature_map)
    for t in range(8):
        for dst, src in ((qt, q), (kt, k), (vt, v)):
            dst.copy_(src[:, :, t])
        graph.replay()
        want = _stored_step(q[:, :, t], k[:, :, t], v[:, :, t], want_state, want_z, feature_map)
        assert_rel_close(out, want, 2e-2)
