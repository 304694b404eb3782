"""kernels/linear_attention/triton: the chunked forward and the decode step against
kernels.linear_attention.reference, each other, and the torch model's LinearAttention.

Without CUDA the kernels run under Triton's interpreter on CPU tensors: TRITON_INTERPRET must be
set before ``kernels.linear_attention.triton`` decorates them (tests/conftest.py does). With CUDA
the interpreter tests are skipped and the ``gpu`` tests run real sizes in bf16/fp16. Every forward
writes into a NaN-filled buffer from fresh random inputs."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch

from kernels.linear_attention import ChunkConfig, configs
from kernels.linear_attention import reference as ref
from kernels.linear_attention import triton as la
from nas.models.mixers import FEATURE_MAP_FNS, LinearAttention, causal_linear_attention
from nas.spec import FEATURE_MAPS as SPEC_FEATURE_MAPS
from tests.kernels import _support as support
from tests.kernels._support import CPU, CUDA, Shape, requires_cuda, requires_interpreter

# Relative Frobenius error bound per dtype: fp32 in the interpreter is exact math up to rounding;
# on the GPU φ(q), φ(k), the scores and v enter the matmuls rounded to bf16/fp16, φ(q)·S is tf32.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
FEATURES = [pytest.param(name, id=name) for name in ref.FEATURE_MAPS]
CONTRACT_FEATURES = ["identity", "elu+1"]  # the unnormalized and a normalized map (relu differs only in φ)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    support.assert_rel_close(actual, expected, TOLERANCES[dtype])


def _check(shape: Shape, dtype: torch.dtype, device: torch.device, *, feature_map: str, config=None) -> None:
    """``linear_attention_qkv`` (``config``: a ChunkConfig, or the autotuner's) on a fresh
    projection against the reference."""
    kernel = partial(la.linear_attention_qkv, feature_map=feature_map, config=config)
    expected = partial(ref.linear_attention, feature_map=feature_map)
    support.check_qkv_kernel(kernel, expected, shape, dtype, device, TOLERANCES[dtype])


# Every config the autotuner may be handed, with its head dim: the per-GPU tables and the
# interpreter's (split 2) at each supported head dim.
_ANYWHERE = (*configs.DEFAULT, *configs.INTERPRETER)
EVERY_CONFIG = support.config_params(
    [(D, c) for D, cs in configs.HOPPER.items() for c in cs]
    + [(D, c) for D in configs.SUPPORTED_HEAD_DIMS for c in _ANYWHERE],
    lambda c: f"c{c.chunk}v{c.block_v}w{c.num_warps}s{c.num_stages}x{c.split}",
)


def _decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, z: torch.Tensor, feature_map: str
) -> torch.Tensor:
    """``linear_attention_step`` once per token of ``[B, H, T, D]`` → ``[B, T, H·D]``."""
    steps = [
        la.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state, z, feature_map=feature_map)
        for t in range(q.shape[2])
    ]
    return torch.stack(steps, dim=1)


# Every two-pass config the GPU tables name, and the interpreter's, at each supported head dim.
TWO_PASS_CONFIGS = support.config_params(
    [(D, c) for D, cs in configs.TWO_PASS_HOPPER.items() for c in cs]
    + [(D, configs.TWO_PASS_INTERPRETER) for D in configs.SUPPORTED_HEAD_DIMS],
    lambda c: (
        f"c{c.chunk}k{c.block_k}v{c.block_v}w{c.num_warps}s{c.num_stages}"
        + (f"-p1w{c.states_warps}s{c.states_stages}" if c.states_warps or c.states_stages else "")
    ),
)


# On a GPU: the configs the GPU accepts (block_v ≥ min(64, D); narrower column blocks are refused
# there, see test_gpu_two_pass_rejects_narrow_column_blocks): the sm_90 table, and the
# interpreter's at D = 16.
GPU_TWO_PASS_CONFIGS = support.config_params(
    [(D, c) for D, cs in configs.TWO_PASS_HOPPER.items() for c in cs]
    + [(D, configs.TWO_PASS_INTERPRETER) for D in configs.SUPPORTED_HEAD_DIMS if 16 >= min(64, D)],
    lambda c: f"c{c.chunk}k{c.block_k}v{c.block_v}w{c.num_warps}s{c.num_stages}",
)


# Every prefix config the GPU tables name, and the interpreter's, at each supported head dim.
PREFIX_CONFIGS = support.config_params(
    [(D, c) for D, cs in configs.PREFIX_HOPPER.items() for c in cs]
    + [(D, configs.PREFIX_INTERPRETER) for D in configs.SUPPORTED_HEAD_DIMS],
    lambda c: f"c{c.chunk}v{c.block_v}w{c.num_warps}s{c.num_stages}",
)
GPU_PREFIX_CONFIGS = support.config_params(
    [(D, c) for D, cs in configs.PREFIX_HOPPER.items() for c in cs]
    + [(D, configs.PREFIX_INTERPRETER) for D in configs.SUPPORTED_HEAD_DIMS if 16 >= min(64, D)],
    lambda c: f"c{c.chunk}v{c.block_v}w{c.num_warps}s{c.num_stages}",
)


@pytest.fixture
def route():
    """``set_route`` for one test, undone after it."""
    yield la
    la.set_route(None)


# ---------------------------------------------------------------------------------------------
# Interpreter: T = 37 is two full 16-token chunks and a 5-token tail; D = 32 splits V across two
# programs (block_v 16).
# ---------------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize("D", [16, 32])
def test_matches_reference_on_qkv_views(D: int, feature_map: str) -> None:
    _check((2, 37, 3, D), torch.float32, CPU, feature_map=feature_map)


@requires_interpreter
@pytest.mark.parametrize("D,config", TWO_PASS_CONFIGS)
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
def test_two_pass_every_config(D: int, config, feature_map: str) -> None:
    """The two passes with each config, at an odd length (T = 150: a masked last chunk at every
    chunk size), against the reference: the identity map and a normalized one (z beside S)."""
    _check((2, _contract_length(D, config), 2, D), torch.float32, CPU, feature_map=feature_map, config=config)


def _contract_length(D: int, config) -> int:
    """T = 150 (a masked last chunk at every chunk size); the interpreter's 16-wide tiles at D ≥ 64
    run over 40 tokens (three chunks, a masked tail, two groups of the two passes, so the carry
    too), the same code in a fraction of the interpreter's time (its 8 × 8 state blocks made
    those cases 25-37 s each of the suite)."""
    return 40 if config.block_v == 16 and D >= 64 else 150


@requires_interpreter
@pytest.mark.parametrize("D,config", PREFIX_CONFIGS)
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
def test_prefix_every_config(D: int, config, feature_map: str) -> None:
    """The one-launch prefix forward with each config, at an odd length (T = 150: a masked last
    chunk at every chunk size, prefix loops of 2-9 chunks), against the reference: the identity
    map and a normalized one (z summed beside S)."""
    _check((2, _contract_length(D, config), 2, D), torch.float32, CPU, feature_map=feature_map, config=config)


@requires_interpreter
@pytest.mark.parametrize("T", [1, 16, 17, 37, 64])
@pytest.mark.parametrize("D", [16, 32])
@pytest.mark.parametrize("forced", ["two_pass", "prefix"])
def test_forced_route_matches_reference(route, forced: str, D: int, T: int) -> None:
    """``set_route("two_pass" | "prefix")``: every map takes it (one chunk, a chunk and one token,
    a ragged tail after two full chunks, four full chunks; 2 × 2 state blocks and two value blocks
    at D = 32); ``return_state`` keeps the fused kernel, with the same results."""
    route.set_route(forced)
    for feature_map in ref.FEATURE_MAPS:
        _check((2, T, 3, D), torch.float32, CPU, feature_map=feature_map)
        assert route.last_route() == forced
    q, k, v = (torch.randn(1, 2, T, D) for _ in range(3))
    o, _, _ = la.linear_attention(q, k, v, feature_map="identity", return_state=True)
    _assert_close(o, ref.linear_attention(q, k, v, feature_map="identity"), torch.float32)
    assert route.last_route() == "fused"


@requires_interpreter
def test_prefix_sums_every_chunk_before_its_own() -> None:
    """A value spike in the first chunk only (k = v = 0 elsewhere, q = 1): every later chunk's
    output is q·S with S the spike's kᵀv, so a prefix loop that skipped or doubled a chunk, or a
    program that took another chunk's index, shows; the two passes agree to rounding."""
    B, H, T, D = 1, 2, 16 * 5 + 3, 16
    q = torch.ones(B, H, T, D)
    k = torch.zeros(B, H, T, D)
    v = torch.zeros(B, H, T, D)
    k[:, :, 3], v[:, :, 3] = 1.0, torch.arange(D, dtype=torch.float32)
    o = la.linear_attention(q, k, v, feature_map="identity", config=configs.PREFIX_INTERPRETER)
    expected = ref.linear_attention(q, k, v, feature_map="identity")
    _assert_close(o, expected, torch.float32)
    assert torch.allclose(o[0, 16:, :D], (D**-0.5 * D * torch.arange(D, dtype=torch.float32)).expand(T - 16, D))
    two = la.linear_attention(q, k, v, feature_map="identity", config=configs.TWO_PASS_INTERPRETER)
    _assert_close(o, two, torch.float32)


def test_forward_route_rule() -> None:
    """``forward_route`` on sm_90 at D 32-128, every map: the prefix forward exactly for walks
    within the map's table (chunks, and B·H·chunks²), else the two passes; the fused kernel off
    sm_90 and at D 16 for every map."""
    cap = (9, 0)
    for fm in ref.FEATURE_MAPS:
        table = configs.PREFIX_IDENTITY if fm == "identity" else configs.PREFIX_NORMALIZED
        for D in (32, 64, 128):
            for bh, T in ((1, 1), (4, 256), (16, 1000), (128, 333), (128, 2048), (128, 4096), (2, 8192)):
                got = configs.forward_route(cap, bh, T, D, fm)
                chunks = -(-T // 64)
                short = D in table and chunks <= table[D][0] and bh * chunks**2 <= table[D][1]
                assert got == ("prefix" if short else "two_pass"), (fm, bh, T, D)
            for other in ((8, 0), (10, 0)):
                assert configs.forward_route(other, 1, 256, D, fm) == "fused"
        assert configs.forward_route(cap, 1, 256, 16, fm) == "fused"
    assert configs.forward_route(cap, 128, 2048, 32, "identity") == "two_pass"
    assert configs.forward_route(cap, 128, 2048, 32, "relu") == "two_pass"
    for D, (chunks, work) in configs.PREFIX_IDENTITY.items():  # each bound is the edge
        bh = max(1, work // chunks**2)
        assert configs.forward_route(cap, bh, 64 * chunks, D, "identity") == "prefix"
        assert configs.forward_route(cap, bh, 64 * chunks + 1, D, "identity") == "two_pass"
        assert configs.forward_route(cap, work + 1, 64, D, "identity") == "two_pass"


def test_forward_route_against_the_measured_rows() -> None:
    """Every row of the H200 sweep (bf16, 44 shapes × 3 maps, each route forced, 2026-12-03): the
    route the rules pick (the prefix forward with its table's first config) is within 15 % of the
    fastest route measured there, and within 3.5 % at all but three rows. The two rows the fused
    kernel won then (identity, D 32, B·H 128 over ≥ 2048 tokens) were timed again once pass 1
    prefetched k (linear_attention_pass_variants_h200_kt.json): the route's two passes at the
    plan's depth now beat the fused time of this sweep (the fused kernel is unchanged since)."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parent / "data"
    rows = json.loads((results / "linear_attention_routes_h200.json").read_text())["results"]
    again = json.loads((results / "linear_attention_pass_variants_h200_kt.json").read_text())["results"]
    again = {(r["B"], r["H"], r["L"], r["D"]): r for r in again}
    assert len(rows) == 132
    ratios, retimed = [], 0
    for r in rows:
        B, H, L, D, fm = r["B"], r["H"], r["L"], r["D"], r["feature_map"]
        timed = {k: v["us"]["median_us"] for k, v in r["variants"].items() if v["ok"]}
        route = configs.forward_route((9, 0), B * H, L, D, fm)
        if route == "two_pass" and min(timed, key=timed.get) == "fused":
            variants = again[(B, H, L, D)]["variants"]
            assert variants["pass1_w4s4"]["ok"] and configs.TWO_PASS_DEEP_STAGES == 4
            assert variants["pass1_w4s4"]["us"]["median_us"] < 0.8 * timed["fused"], (B, H, L, D)
            retimed += 1
            continue
        c = configs.PREFIX_HOPPER[D][0]
        name = f"prefix_c{c.chunk}v{c.block_v}w{c.num_warps}s{c.num_stages}" if route == "prefix" else route
        assert name in timed, (B, H, L, D, fm, name)
        ratios.append(timed[name] / min(timed.values()))
        assert ratios[-1] <= 1.15, f"B{B} H{H} L{L} D{D} {fm}: the rules' route took {ratios[-1]:.2f}x the best"
    assert sum(x > 1.035 for x in ratios) <= 3
    assert retimed == 2


def test_prefix_config_refuses_return_state() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="PrefixConfig runs without return_state only"):
        la.linear_attention(q, q, q, feature_map="identity", return_state=True, config=configs.PREFIX_INTERPRETER)
    with pytest.raises(ValueError, match="power of two"):
        configs.PrefixConfig(48, 16, 4, 1)


def _as_if_on(monkeypatch, sms: int) -> None:
    """Plan the two passes as on a GPU with ``sms`` SMs (the interpreter's own count is 1)."""
    monkeypatch.setattr(la, "two_pass_plan", lambda device, bh, T, D, cfg: configs.two_pass_plan(bh, T, D, cfg, sms))


@requires_interpreter
@pytest.mark.parametrize("group", [1, 2, 3, 5, None])
def test_two_pass_groups_carry_the_state_between_them(monkeypatch, group) -> None:
    """Pass 1 in groups of ``group`` chunks (None: ``two_pass_group``'s rule, planned for 132 SMs,
    where B·H = 2 splits into one chunk per group) with the carry scan between the passes: T = 301
    is 19 chunks of 16 (the last ragged), so group 1 gives 19 groups, more than one scan step of
    CARRY_BLOCK_G, and 3 and 5 leave a short last group."""
    _as_if_on(monkeypatch, 132)
    config = dataclasses.replace(configs.TWO_PASS_INTERPRETER, group=group)
    plan = la.two_pass_plan(CPU, 2, 301, 16, config)
    assert plan.chunks == 19 and plan.group * (plan.groups - 1) < 19 <= plan.group * plan.groups
    if group in (1, None):
        assert plan.groups > configs.CARRY_BLOCK_G
    for feature_map in CONTRACT_FEATURES:  # a normalized map carries z in the totals' extra tile
        _check((1, 301, 2, 16), torch.float32, CPU, feature_map=feature_map, config=config)


@requires_interpreter
def test_two_pass_carry_keeps_a_small_prefix_beside_a_huge_group() -> None:
    """A group whose sum is ~10⁷ times the one before it: the next group still sees that earlier
    prefix to fp32 precision. T = 48 is 3 chunks of 16, one per group; tokens 17-31 scaled by 3e3,
    so token 16 (the first of group 1, its state = group 0's total alone) must match the float64
    reference as closely as the unscaled rows (an exclusive scan as prefix + x - x lost it)."""
    D, T = 16, 48
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
    k[:, :, 17:32] *= 3e3
    v[:, :, 17:32] *= 3e3
    config = dataclasses.replace(configs.TWO_PASS_INTERPRETER, group=1)
    assert la.two_pass_plan(CPU, 1, T, D, config).groups == 3
    got = la.linear_attention(q, k, v, feature_map="identity", config=config)  # [1, T, D]
    want = ref.linear_attention(q.double(), k.double(), v.double(), feature_map="identity").reshape(1, T, D)
    row_err = (got.double() - want).abs().amax(-1)[0]  # per token
    scale = want[0, :16].abs().amax()  # the size of group 0's outputs, which row 16 is like
    assert row_err[:17].max() <= 1e-5 * scale, row_err[:17]
    big = (got.double() - want)[0, 32:].norm() / want[0, 32:].norm()
    assert big <= 1e-5, big  # group 2 after the huge group: right relative to its own size


def test_two_pass_group_fills_the_gpu_and_covers_every_chunk() -> None:
    """``two_pass_group``: all chunks in one group once the state blocks keep at least
    TWO_PASS_GROUP_BELOW of a program per SM busy; below that, the largest group whose grid still
    holds TWO_PASS_STATE_PROGRAMS_PER_SM programs per SM (one chunk per group when none does)."""
    sms, per_sm = 132, configs.TWO_PASS_STATE_PROGRAMS_PER_SM
    target, busy = per_sm * sms, configs.TWO_PASS_GROUP_BELOW * sms
    assert configs.two_pass_group(target, 65, sms) == 65
    assert configs.two_pass_group(8, 65, sms) == 2  # B·H = 4, 2 blocks each: 33 groups of 2
    short = configs.TWO_PASS_ONE_GROUP_UP_TO
    assert configs.two_pass_group(1, short, sms) == short
    assert configs.two_pass_group(1, short + 1, sms) == 1
    for blocks in (1, 4, 8, 64, 65, 66, 100, 263, 264):
        for chunks in (1, 2, short, short + 1, 16, 33, 65, 1000):
            group = configs.two_pass_group(blocks, chunks, sms)
            assert 1 <= group <= chunks, (blocks, chunks, group)
            if blocks >= busy or chunks <= short:
                assert group == chunks, (blocks, chunks, group)
                continue
            fills = blocks * -(-chunks // group) >= target
            assert fills or group == 1, (blocks, chunks, group)
            if group < chunks:  # a larger group would leave SMs idle
                assert blocks * -(-chunks // (group + 1)) < target, (blocks, chunks, group)


def test_deep_pass_1_is_the_fastest_depth_measured_at_every_sparse_grid() -> None:
    """The H200 pass-variant rows (linear_attention_pass_variants_h200_kt.json: pass 1 with k
    transposed, 4 warps at 2, 3 or 4 stages, whole forwards): wherever the plan's grid is sparse
    enough for TWO_PASS_DEEP_STAGES, that depth was the fastest of the three, within 2 %; where
    it is not (512 programs), pass 2's depth beat it."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "data/linear_attention_pass_variants_h200_kt.json"
    rows = json.loads(path.read_text())["results"]
    assert len(rows) == 12
    sparse = 0
    for r in rows:
        B, H, L, D = r["B"], r["H"], r["L"], r["D"]
        route = configs.TWO_PASS_HOPPER[D][0]
        us = {k: v["us"]["median_us"] for k, v in r["variants"].items() if v["ok"]}
        by_depth = {route.num_stages: us["route"], 3: us["pass1_w4s3"], 4: us["pass1_w4s4"]}
        old = configs.two_pass_plan(B * H, L, D, route, 132)
        assert {"group": old.group, "groups": old.groups, "chunks": old.chunks} == r["plan"], (B, H, L, D)
        programs = B * H * (D // old.config.block_k) * (D // old.config.block_v) * old.groups
        deep = programs <= configs.TWO_PASS_DEEP_UP_TO * 132
        depth = configs.TWO_PASS_DEEP_STAGES if deep else route.num_stages
        assert old.states_stages == depth, (B, H, L, D)
        assert by_depth[depth] <= 1.02 * min(by_depth.values()), (B, H, L, D, by_depth)
        sparse += deep
    assert sparse == 11


def test_two_pass_plan_deepens_pass_1_only_on_a_sparse_grid() -> None:
    """Pass 1's pipeline depth, with the config's states_stages left to the rule: 4 stages while its
    grid (state blocks × groups) holds at most TWO_PASS_DEEP_UP_TO programs per SM, pass 2's
    num_stages above that; a config's own states_stages always wins."""
    sms, route = 132, configs.TWO_PASS_HOPPER[128][0]
    assert route.states_stages is None and route.num_stages != configs.TWO_PASS_DEEP_STAGES
    up_to = configs.TWO_PASS_DEEP_UP_TO * sms
    for bh in (1, 4, 32, 99, 100, 128, 512):
        plan = configs.two_pass_plan(bh, 2048, 128, route, sms)
        programs = bh * 4 * plan.groups  # 2 × 2 state blocks of 64 at D = 128
        want = configs.TWO_PASS_DEEP_STAGES if programs <= up_to else route.num_stages
        assert plan.states_stages == want, (bh, programs, plan)
    assert configs.two_pass_plan(32, 2048, 128, route, sms).states_stages == configs.TWO_PASS_DEEP_STAGES  # 128
    assert configs.two_pass_plan(128, 2048, 128, route, sms).states_stages == route.num_stages  # 512 programs
    assert configs.two_pass_plan(4, 2048, 128, route, sms).states_stages == route.num_stages  # 16 blocks × 32 groups
    forced = dataclasses.replace(route, states_stages=3)
    assert configs.two_pass_plan(512, 2048, 128, forced, sms).states_stages == 3


def test_pass_1_launches_at_the_plans_depth(monkeypatch) -> None:
    """``_two_pass_states`` launches pass 1 with the plan's pipeline depth (here the rule's 4
    stages on a sparse grid), not the config's num_stages."""
    seen: dict = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs, grid=grid)

    monkeypatch.setattr(la, "_two_pass_states_kernel", Recorder())
    config = dataclasses.replace(configs.TWO_PASS_INTERPRETER, group=None)
    plan = configs.two_pass_plan(1, 64, 16, config, 132)  # 4 chunks in one group, 1 program
    assert plan.states_stages == configs.TWO_PASS_DEEP_STAGES != config.num_stages
    k, v = torch.randn(2, 1, 1, 64, 16).unbind(0)
    la._two_pass_states(k, v, plan, "identity")
    assert seen["num_stages"] == plan.states_stages and seen["grid"] == (1, 1, 1)


def test_pass_1_keeps_a_chunks_offsets_in_32_bits() -> None:
    """Pass 1 addresses a chunk's rows as 32-bit offsets from its first: a token stride whose
    chunk of rows passes 2³¹ elements is made contiguous first (meta tensors: no memory)."""
    near = torch.empty_strided((1, 2, 3, 16), (0, 16, (2**31 - 1) // 64, 1), device="meta")
    assert la._walkable(near, 64) is near
    far = torch.empty_strided((1, 2, 3, 16), (0, 16, 2**31 // 64, 1), device="meta")
    made = la._walkable(far, 64)
    assert made is not far and made.stride(2) == 16 and made.is_contiguous()


def test_two_pass_config_rejects_a_bad_group() -> None:
    with pytest.raises(ValueError, match="group"):
        configs.TwoPassConfig(64, 64, 64, 4, 2, group=0)


def test_two_pass_rule_branches() -> None:
    """Two passes on sm_90 at every measured head dim and shape (the fused kernel's last shapes,
    D 32 at B·H ≥ 128 over ≥ 2048 tokens, went once pass 1 prefetched k); never off sm_90, never
    at D 16."""
    for D in (32, 64, 128):
        assert configs.prefers_two_pass((9, 0), D), D
        for cap in ((8, 0), (8, 9), (10, 0)):
            assert not configs.prefers_two_pass(cap, D), (cap, D)
        for bh, length in ((1, 1), (128, 2048), (127, 2047), (512, 8192), (4, 1 << 16)):  # the route, every shape
            assert configs.forward_route((9, 0), bh, length, D, "identity") != "fused", (bh, length, D)
            assert configs.forward_route((8, 0), bh, length, D, "identity") == "fused", (bh, length, D)
    assert not configs.prefers_two_pass((9, 0), 16), "D 16 was not measured"


def test_two_pass_rule_against_the_measured_rows() -> None:
    """Every row of the H200 sweep (bf16, 27 shapes, 2026-12-03, before pass 1 prefetched k; the
    fused kernel forced, and the route's two-pass launch both in the groups ``two_pass_group`` gave
    when measured and in one group): the route the rules pick — two passes now, in the plan's groups
    for 132 SMs — was within 10 % of the fastest of them even with the slower pass 1."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "data/linear_attention_two_pass_h200_focus.json"
    rows = json.loads(path.read_text())["results"]
    assert len(rows) == 27
    for r in rows:
        B, H, L, D = r["B"], r["H"], r["L"], r["D"]
        route = configs.TWO_PASS_HOPPER[D][0]
        launch = [0 if x is None else x for x in dataclasses.astuple(route)][:-1]  # all but the group
        measured = {t["groups"]: t["us"]["median_us"] for t in r["two_pass"] if t["config"][:-1] == launch and t["ok"]}
        plan = configs.two_pass_plan(B * H, L, D, route, 132)
        assert plan.groups in measured, (r["B"], r["H"], r["L"], D, plan, measured)
        fused = r["fused_us"]["median_us"]
        chosen = measured[plan.groups] if configs.prefers_two_pass((9, 0), D) else fused
        best = min(fused, *measured.values())
        assert chosen <= 1.10 * best, f"B{B} H{H} L{L} D{D}: the rules' route took {chosen / best:.2f}x the best"


def test_two_pass_config_refuses_return_state() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="without return_state only"):
        la.linear_attention(q, q, q, feature_map="relu", return_state=True, config=configs.TWO_PASS_INTERPRETER)
    with pytest.raises(ValueError, match="route must be None or one of"):
        la.set_route("chunked")


@requires_interpreter
@pytest.mark.parametrize("T", [1, 16, 48])
def test_lengths_contiguous_layout(T: int) -> None:
    """[B, H, T, D] contiguous tensors; lengths inside one chunk and at chunk edges."""
    B, H, D = 1, 2, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    out = la.linear_attention(q, k, v, feature_map="elu+1", out=support.poisoned(B, T, H, D, torch.float32, CPU))
    _assert_close(out, ref.linear_attention(q, k, v, feature_map="elu+1"), torch.float32)


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
def test_matches_model_chunked_form(feature_map: str) -> None:
    """The kernel computes nas.models.mixers.causal_linear_attention of the mapped q, k."""
    B, T, H, D = 2, 37, 3, 32
    q, k, v = support.head_views(support.random_qkv(B, T, H, D, torch.float32, CPU), H)
    phi = FEATURE_MAP_FNS[feature_map]
    normalize = feature_map != "identity"
    qf = phi(q) if normalize else phi(q) * D**-0.5
    expected = causal_linear_attention(qf, phi(k), v, normalize=normalize).transpose(1, 2).reshape(B, T, H * D)
    _assert_close(la.linear_attention(q, k, v, feature_map=feature_map), expected, torch.float32)


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
def test_linear_attention_mixer_end_to_end(feature_map: str) -> None:
    """LinearAttention's forward with its qkv projection, this kernel and its out projection."""
    torch.manual_seed(0)
    B, T, H, D = 2, 37, 2, 16
    mixer = LinearAttention(H * D, H, feature_map, short_conv=0)
    x = torch.randn(B, T, H * D)
    with torch.no_grad():
        actual = mixer.out(la.linear_attention_qkv(mixer.qkv(x), H, feature_map=feature_map))
        _assert_close(actual, mixer(x), torch.float32)


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
def test_decode_steps_equal_chunked_forward(feature_map: str) -> None:
    """T decode steps from a zero state give the forward's outputs and its final state."""
    B, T, H, D = 2, 37, 2, 16
    q, k, v = support.head_views(support.random_qkv(B, T, H, D, torch.float32, CPU), H)
    out, state_T, z_T = la.linear_attention(q, k, v, feature_map=feature_map, return_state=True)
    state, z = torch.zeros(B, H, D, D), torch.zeros(B, H, D)
    _assert_close(_decode(q, k, v, state, z, feature_map), out, torch.float32)
    torch.testing.assert_close(state, state_T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(z, z_T, rtol=1e-5, atol=1e-5)


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize("split", [1, 2, 3, 8])
def test_sequence_split_matches_reference(split: int, feature_map: str) -> None:
    """Segments walked in parallel from their prefix sums give the unsplit result and the final
    state: T = 53 is three full 16-token chunks and a 5-token tail; split 3 gives segments of 1, 1
    and 2 chunks (the tail in the last), split 8 more segments than chunks (the empty ones exit)."""
    B, T, H, D = 2, 53, 2, 32
    q, k, v = support.head_views(support.random_qkv(B, T, H, D, torch.float32, CPU), H)
    config = la.ChunkConfig(16, 16, 4, 1, split=split)
    out, state, z = la.linear_attention(
        q,
        k,
        v,
        feature_map=feature_map,
        return_state=True,
        config=config,
        out=support.poisoned(B, T, H, D, torch.float32, CPU),
    )
    _assert_close(out, ref.linear_attention(q, k, v, feature_map=feature_map), torch.float32)
    state_ref, z_ref = torch.zeros(B, H, D, D), torch.zeros(B, H, D)
    for t in range(T):  # the recurrence's state after the last token
        ref.step(q[:, :, t], k[:, :, t], v[:, :, t], state_ref, z_ref, feature_map=feature_map)
    torch.testing.assert_close(state, state_ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(z, z_ref, rtol=1e-5, atol=1e-4)


@requires_interpreter
def test_step_matches_reference_step() -> None:
    B, H, D = 2, 3, 32
    state, z = torch.randn(B, H, D, D), torch.rand(B, H, D) * 5
    state_ref, z_ref = state.clone(), z.clone()
    q, k, v = (torch.randn(B, H, D) for _ in range(3))
    out = la.linear_attention_step(q, k, v, state, z, feature_map="relu")
    _assert_close(out, ref.step(q, k, v, state_ref, z_ref, feature_map="relu"), torch.float32)
    torch.testing.assert_close(state, state_ref)
    torch.testing.assert_close(z, z_ref)


@requires_interpreter
@pytest.mark.parametrize(
    "config", [None, configs.TWO_PASS_INTERPRETER, configs.PREFIX_INTERPRETER], ids=["fused", "two_pass", "prefix"]
)
def test_fp16_in_interpreter(config) -> None:
    """Half precision through the same code paths, every route (the two passes and the prefix
    forward keep their states fp32 for fp16). (bf16 is left to the GPU tests: the Triton 3.9
    interpreter's bf16 ``tl.dot`` multiplies raw bit patterns.)"""
    _check((2, 37, 3, 32), torch.float16, CPU, feature_map="elu+1", config=config)


@requires_interpreter
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
@pytest.mark.parametrize("D,config", EVERY_CONFIG)
def test_every_config(D: int, config: ChunkConfig, feature_map: str) -> None:
    """The contract over every config: each tiling, run as given, at an odd length (T = 150: two
    full 64-token chunks and a tail; nine 16-token chunks and a tail), unnormalized and normalized."""
    _check((1, 150, 2, D), torch.float32, CPU, feature_map=feature_map, config=config)


def test_feature_maps_agree_with_the_spec() -> None:
    """nas.spec keeps its own names (it must import no torch): they are this op's feature maps."""
    assert SPEC_FEATURE_MAPS == ref.FEATURE_MAPS == tuple(FEATURE_MAP_FNS)


@pytest.mark.parametrize("D", [8, 24, 48, 256])
def test_unsupported_head_dim_raises(D: int) -> None:
    q = torch.randn(1, 2, 5, D)
    with pytest.raises(ValueError, match=f"head dim D={D} .*allowed: 16, 32, 64, 128"):
        la.linear_attention(q, q, q, feature_map="relu")


def test_bad_inputs_raise() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="feature_map must be one of identity, elu\\+1, relu"):
        la.linear_attention(q, q, q, feature_map="softmax")
    with pytest.raises(ValueError, match="share one"):
        la.linear_attention(q, q[:, :1], q, feature_map="relu")
    with pytest.raises(ValueError, match="out must be"):
        la.linear_attention(q, q, q, feature_map="relu", out=torch.empty(1, 5, 16, dtype=torch.float16))
    t = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="state must be"):
        la.linear_attention_step(t, t, t, torch.zeros(1, 2, 16, 16, dtype=torch.float16), None, feature_map="identity")
    with pytest.raises(ValueError, match="z .* is required"):
        la.linear_attention_step(t, t, t, torch.zeros(1, 2, 16, 16), None, feature_map="elu+1")


# ---------------------------------------------------------------------------------------------
# GPU: real lengths, bf16 and fp16, against the fp32 reference on the same device.
# ---------------------------------------------------------------------------------------------

# (D, T, dtype): H = 16 and lengths that are multiples of 16 share compiled kernels with the
# benchmark; 1000 ends in a partial chunk; fp16 at one length keeps the compile count down.
GPU_CASES = support.qkv_cases(
    [
        (64, 4096, torch.bfloat16),
        (128, 4096, torch.bfloat16),
        (64, 1000, torch.bfloat16),
        (64, 4096, torch.float16),
        (16, 1000, torch.bfloat16),
        (32, 1000, torch.bfloat16),
    ]
)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D,config", GPU_TWO_PASS_CONFIGS)
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
def test_gpu_two_pass_every_config(D: int, config, dtype: torch.dtype, feature_map: str) -> None:
    """Each two-pass config compiled and run at a ragged length (bf16 states for bf16, fp32 for
    fp16), for the identity map and a normalized one."""
    _check((2, 1000, 5, D), dtype, CUDA, feature_map=feature_map, config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("group", [1, 3, None])
@pytest.mark.parametrize("D", [32, 64, 128])
def test_gpu_two_pass_groups(D: int, group, dtype: torch.dtype) -> None:
    """Pass 1 in groups with the carry scan on the GPU (the route's launch; groups of 1 and 3
    chunks and the rule's, which splits B·H = 2 over 4097 tokens into many groups)."""
    config = dataclasses.replace(configs.TWO_PASS_HOPPER[D][0], group=group)
    plan = la.two_pass_plan(CUDA, 2, 4097, D, config)
    assert plan.groups > 1
    for feature_map in CONTRACT_FEATURES:
        _check((1, 4097, 2, D), dtype, CUDA, feature_map=feature_map, config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("D", [32, 64, 128])
def test_gpu_default_route_follows_the_rule(route, D: int) -> None:
    """Without a forced route, bf16 takes the route ``configs.forward_route`` names for each map
    (a shape on each side of 2048 tokens at B·H = 128, the fused kernel's threshold at D 32 until
    2026-12-04), fp16 the fused kernel; every result matches the reference."""
    heads, length = 128, 2048  # a full grid over long rows (D 32 took the fused kernel there until 2026-12-04)
    cap = torch.cuda.get_device_capability()
    for T in (length - 1, length + 37):
        for fm in ("identity", "elu+1"):
            _check((8, T, heads // 8, D), torch.bfloat16, CUDA, feature_map=fm)
            assert route.last_route() == configs.forward_route(cap, heads, T, D, fm)
        _check((8, T, heads // 8, D), torch.float16, CUDA, feature_map="identity")
        assert route.last_route() == "fused"


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D,config", GPU_PREFIX_CONFIGS)
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
def test_gpu_prefix_every_config(D: int, config, dtype: torch.dtype, feature_map: str) -> None:
    """Each prefix config compiled and run at a ragged length (16 chunks, a masked tail; bf16
    state for bf16, fp32 for fp16), and over one chunk, for the identity map and a normalized one."""
    _check((2, 1000, 5, D), dtype, CUDA, feature_map=feature_map, config=config)
    _check((3, 37, 2, D), dtype, CUDA, feature_map=feature_map, config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("D", [32, 64, 128])
def test_gpu_default_route_takes_the_prefix_rule(route, D: int) -> None:
    """bf16 at short walks on small grids and at a long one, every map: the route
    ``configs.forward_route`` names (the prefix forward among them), and the reference's result."""
    cap = torch.cuda.get_device_capability()
    seen = set()
    for B, T, H in ((1, 256, 4), (2, 1000, 5), (1, 4097, 2)):
        for fm in ref.FEATURE_MAPS:
            _check((B, T, H, D), torch.bfloat16, CUDA, feature_map=fm)
            assert route.last_route() == configs.forward_route(cap, B * H, T, D, fm), (B, T, H, D, fm)
            seen.add(route.last_route())
    assert "prefix" in seen and "two_pass" in seen


@pytest.mark.gpu
@requires_cuda
def test_gpu_two_pass_rejects_narrow_column_blocks() -> None:
    """32-column blocks at D ≥ 64 (wrong outputs or an illegal address on the H200): refused."""
    qkv = torch.randn(1, 100, 3 * 2 * 64, device=CUDA, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block_v"):
        la.linear_attention_qkv(qkv, 2, feature_map="identity", config=configs.TwoPassConfig(64, 64, 32, 4, 2))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize("D,T,dtype", GPU_CASES)
def test_gpu_matches_reference(D: int, T: int, dtype: torch.dtype, feature_map: str) -> None:
    _check((1, T, 16, D), dtype, CUDA, feature_map=feature_map)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", CONTRACT_FEATURES)
@pytest.mark.parametrize("D,config", EVERY_CONFIG)
def test_gpu_every_config(D: int, config: ChunkConfig, feature_map: str) -> None:
    """Each tiling compiled and run in bf16 at a ragged length."""
    _check((1, 1000, 16, D), torch.bfloat16, CUDA, feature_map=feature_map, config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", FEATURES)
def test_gpu_prefill_then_decode(feature_map: str) -> None:
    """Forward over the first 1000 tokens with its state, then 24 decode steps, equal the forward
    over all 1024 tokens."""
    B, T, H, D, prefix = 2, 1024, 16, 64, 1000
    q, k, v = support.head_views(support.random_qkv(B, T, H, D, torch.bfloat16, CUDA), H)
    full = la.linear_attention(q, k, v, feature_map=feature_map)
    _, state, z = la.linear_attention(
        q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], feature_map=feature_map, return_state=True
    )
    decoded = _decode(q[:, :, prefix:], k[:, :, prefix:], v[:, :, prefix:], state, z, feature_map)
    _assert_close(decoded, full[:, prefix:], torch.bfloat16)


def test_split_fills_idle_sms_only() -> None:
    """The sequence split doubles while the grid stays within SPLIT_PROGRAMS_PER_SM programs per
    SM, never gives a segment no chunk, and stops at MAX_SPLIT."""
    from kernels.linear_attention.configs import MAX_SPLIT, SPLIT_PROGRAMS_PER_SM, split_for

    sms = 132
    assert split_for(4, 4, sms) == 4  # B1 H4 D32 L256: four programs, four chunks
    assert split_for(64, 8, sms) == 4  # B8 H8 D32 L512
    assert split_for(256, 64, sms) == 1  # B8 H16 D64: the grid already fills the SMs
    assert split_for(1, 1000, sms) == MAX_SPLIT
    for programs in (1, 3, 50, 131, 264, 265):
        for chunks in (1, 2, 5, 64):
            s = split_for(programs, chunks, sms)
            assert s >= 1 and s & (s - 1) == 0 and s <= max(1, chunks)
            assert s == 1 or programs * s <= SPLIT_PROGRAMS_PER_SM * sms
            # the kernel's balanced partition then leaves no segment without a chunk
            assert all((i + 1) * chunks // s > i * chunks // s for i in range(s))


# ---------------------------------------------------------------------------------------------
# The decode step over every launch configs.step_config may choose: each head's state columns
# split over D / block_v programs, z advanced once per step by the last of them (a ticket).
# ---------------------------------------------------------------------------------------------

STEP_CASES = [
    pytest.param(D, c, id=f"D{D}-v{c.block_v}w{c.num_warps}")
    for D in configs.SUPPORTED_HEAD_DIMS
    for c in dict.fromkeys([*configs.step_configs(D), configs.step_config(CPU, 1, D, 1)])
]


def _steps_against_forward(
    B: int, T: int, H: int, D: int, dtype: torch.dtype, device, feature_map: str, config
) -> None:
    """T steps from a zero state: state, z and outputs equal the fp32 recurrence on the same
    inputs (``reference.step``: the kernel's own precision), the outputs also the chunked
    forward's (which rounds φ(k) to the input dtype for its matmuls); the tickets are zero again
    after every step."""
    q, k, v = support.head_views(support.random_qkv(B, T, H, D, dtype, device), H)
    out = la.linear_attention(q, k, v, feature_map=feature_map)
    state, z = torch.zeros(B, H, D, D, device=device), torch.zeros(B, H, D, device=device)
    state_ref, z_ref = state.clone(), z.clone()
    steps, steps_ref = [], []
    for t in range(T):
        qt, kt, vt = q[:, :, t], k[:, :, t], v[:, :, t]
        steps.append(la.linear_attention_step(qt, kt, vt, state, z, feature_map=feature_map, config=config))
        steps_ref.append(ref.step(qt.float(), kt.float(), vt.float(), state_ref, z_ref, feature_map=feature_map))
    assert not la._step_tickets(torch.device(device), B * H).any()  # noqa: SLF001 - re-armed for the next launch
    support.assert_rel_close(state, state_ref, 1e-5)
    support.assert_rel_close(z, z_ref, 1e-5)
    _assert_close(torch.stack(steps, dim=1), torch.stack(steps_ref, dim=1), dtype)
    _assert_close(torch.stack(steps, dim=1), out, dtype)


@requires_interpreter
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize("D,config", [p for p in STEP_CASES if p.values[0] <= 32])
def test_steps_split_over_programs_equal_the_forward(D: int, config, feature_map: str) -> None:
    """Odd batch and heads (B 3, H 5), an odd 13 steps, every feature map, each split."""
    _steps_against_forward(3, 13, 5, D, torch.float32, CPU, feature_map, config)


@requires_interpreter
@pytest.mark.parametrize("feature_map", ["identity", "elu+1"])
def test_steps_in_narrow_column_blocks_equal_the_forward(feature_map: str) -> None:
    """4-column blocks, narrower than any the chooser takes (8 programs a head at D = 32, the z
    ticket shared by all of them; 8 columns are among STEP_CASES), give the same steps."""
    _steps_against_forward(2, 9, 3, 32, torch.float32, CPU, feature_map, configs.StepConfig(4, 4))


def test_step_config_fills_the_gpu_and_divides_the_head_dim() -> None:
    """The widest block that still gives 2 programs per SM, else the narrowest: B1 H8 D128 splits
    each head 16 ways (128 programs of 8 columns, 8 warps: the H200's fastest there), B256 H16
    D64 keeps whole 64-column tiles."""
    cuda = torch.device("cuda")
    assert configs.step_config(cuda, 8, 128, 132) == configs.StepConfig(8, 8)
    assert configs.step_config(cuda, 8, 64, 132) == configs.StepConfig(8, 4)
    assert configs.step_config(cuda, 256 * 16, 64, 132) == configs.StepConfig(64, 4)
    assert configs.step_config(cuda, 64, 64, 132).block_v == 8  # 64·64/16 = 256 < 264 programs: 8 columns
    assert configs.step_config(cuda, 66, 64, 132).block_v == 16
    assert configs.step_config(cuda, 132, 64, 132).block_v == 32  # 132·2 = 264 programs
    for heads in (1, 7, 64, 1000, 4096):
        for D in configs.SUPPORTED_HEAD_DIMS:
            c = configs.step_config(cuda, heads, D, 132)
            assert D % c.block_v == 0 and c in configs.step_configs(D)
            assert configs.step_config(cuda, heads, D, 132) == c  # one launch per shape (graph capture)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", FEATURES)
@pytest.mark.parametrize("D,config", STEP_CASES)
def test_gpu_steps_every_config(D: int, config, feature_map: str) -> None:
    """Each launch the step may choose, compiled and run in bf16 over 40 steps (z and S shared by
    up to 8 programs per head: a racing z update would drift at once)."""
    _steps_against_forward(2, 40, 8, D, torch.bfloat16, CUDA, feature_map, config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("feature_map", ["identity", "elu+1"])
def test_gpu_step_replayed_from_a_cuda_graph(feature_map: str) -> None:
    """A captured step (B1 H8 D128: the 8-way split) replayed 16 times equals 16 eager steps."""
    B, H, D = 1, 8, 128
    q, k, v = (torch.randn(B, H, D, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    state, z = torch.zeros(B, H, D, D, device=CUDA), torch.zeros(B, H, D, device=CUDA)
    state_e, z_e = state.clone(), z.clone()
    la.linear_attention_step(q, k, v, state_e, z_e, feature_map=feature_map)  # compile, tickets made
    state_e.zero_()
    z_e.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = la.linear_attention_step(q, k, v, state, z, feature_map=feature_map)
    state.zero_()
    z.zero_()
    for _ in range(16):
        graph.replay()
        expected = la.linear_attention_step(q, k, v, state_e, z_e, feature_map=feature_map)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(state, state_e, rtol=0, atol=0)
    torch.testing.assert_close(z, z_e, rtol=0, atol=0)
