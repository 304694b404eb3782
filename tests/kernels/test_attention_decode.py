"""kernels/attention/decode: ``rope_append`` and split-KV ``decode_attention`` against the fp32
reference (``reference.decode_attention_ref``, ``reference.rope_at``), and a chain of append +
decode steps against causal attention over the whole sequence.

Without CUDA the kernels run under Triton's interpreter on CPU tensors, with the interpreter's
launch (16-row blocks, 64-row slices, so odd lengths cross blocks and slices and the later slices
are empty). Cache rows past each sequence's position hold NaN: any read of them fails the check.
The ``gpu`` tests run every launch the chooser may return at real sizes, and a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from kernels.attention import configs
from kernels.attention import reference as ref
from kernels.attention.configs import DecodeConfig
from kernels.attention.decode import decode_attention, rope_append
from kernels.device import sm_count
from tests.kernels._support import CPU, CUDA, DTYPE_NAMES, assert_rel_close, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

# Relative Frobenius error bounds against the fp32 reference on the same (rounded) cache: only
# the output's rounding (the interpreter truncates fp32 → bf16: 2^-8 relative) and fp32 sums.
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _generator(device: torch.device, *key: object) -> torch.Generator:
    """A generator on ``device`` seeded by the test case (GPU caches are drawn where they live)."""
    return torch.Generator(device).manual_seed(_gen(*key).initial_seed())


def _positions(B: int, C: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Different positions per sequence: the last row, a random one, and the first."""
    picks = [C - 1, int(torch.randint(0, C, (1,), generator=_gen(gen.initial_seed()))), 0]
    return torch.tensor([picks[b % 3] for b in range(B)], dtype=torch.int32, device=device)


def _cache(B: int, H: int, C: int, D: int, dtype, positions: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random cache ``[B, H, C, D]`` with NaN in every row past each sequence's position."""
    cache = torch.randn(B, H, C, D, generator=gen, device=positions.device, dtype=dtype)
    for b, p in enumerate(positions.tolist()):
        cache[b, :, p + 1 :] = float("nan")
    return cache


def _decode_case(B: int, H: int, C: int, D: int, dtype, device, config: DecodeConfig | None, key: tuple) -> None:
    gen = _generator(device, *key)
    positions = _positions(B, C, gen, device)
    k, v = _cache(B, H, C, D, dtype, positions, gen), _cache(B, H, C, D, dtype, positions, gen)
    q = torch.randn(B, H, D, generator=gen, device=device, dtype=dtype)
    out = torch.full((B, H * D), float("nan"), dtype=dtype, device=device)
    got = decode_attention(q, k, v, positions, out=out, config=config)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    assert_rel_close(got, ref.decode_attention_ref(q, k, v, positions), BOUNDS[dtype])


# (B, H, D, C, dtype): odd batch and heads, every head dim and dtype, contexts from 1 to 4097 (the
# long ones at small D and B·H, so the interpreter stays fast).
CASES = [
    (1, 1, 16, 1, torch.float32),
    (3, 2, 16, 2, torch.bfloat16),
    (3, 3, 32, 37, torch.float16),
    (1, 2, 64, 37, torch.float32),
    (3, 1, 128, 37, torch.bfloat16),
    (1, 1, 128, 100, torch.float16),
    (3, 1, 16, 1000, torch.float32),
    (1, 1, 32, 1000, torch.bfloat16),
    (3, 1, 16, 4097, torch.float16),
]


@requires_interpreter
@pytest.mark.parametrize(
    ("B", "H", "D", "C", "dtype"),
    [pytest.param(*c, id=f"B{c[0]}-H{c[1]}-D{c[2]}-C{c[3]}-{DTYPE_NAMES[c[4]]}") for c in CASES],
)
def test_decode_matches_reference(B: int, H: int, D: int, C: int, dtype: torch.dtype) -> None:
    for config in configs.decode_configs(CPU, B * H, C, D, 1):
        if config.dot and dtype == torch.bfloat16:
            continue  # the Triton interpreter's bf16 tl.dot multiplies raw bit patterns: GPU tests only
        _decode_case(B, H, C, D, dtype, CPU, config, ("decode", B, H, D, C, dtype, config))
    _decode_case(B, H, C, D, dtype, CPU, None, ("decode-default", B, H, D, C, dtype))


@requires_interpreter
@pytest.mark.parametrize("dot", [False, True], ids=["cuda-cores", "dot"])
@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_decode_any_split_count(splits: int, dot: bool) -> None:
    """One slice (written directly, no combine), two, and slices ragged against the 16-row blocks
    and positions (a 100-row cache in 7 slices of 16 rows: several wholly past a position)."""
    _decode_case(3, 2, 100, 32, torch.float32, CPU, DecodeConfig(16, 4, 1, splits, dot), ("splits", splits, dot))


@requires_interpreter
def test_fused_combine_equals_the_separate_launch_and_leaves_its_counters_zero() -> None:
    """The last slice of each head combines (one launch): the same output as the separate combine
    launch, bit for bit (same sums in slice order), whatever the positions, and the per-head
    counters are zero again afterwards, so the next call (or graph replay) counts from zero."""
    from kernels.attention import decode as decode_module

    gen = _gen("fused")
    B, H, C, D = 3, 2, 100, 32
    k, v = (torch.randn(B, H, C, D, generator=gen) for _ in "kv")
    for positions in (torch.tensor([99, 0, 40], dtype=torch.int32), torch.tensor([63, 64, 17], dtype=torch.int32)):
        q = torch.randn(B, H, D, generator=gen)
        fused = decode_attention(q, k, v, positions, config=DecodeConfig(16, 4, 1, 7, dot=True))
        counts = decode_module._COUNTS[q.device]
        assert not counts.any(), "the last slice resets its head's counter"
        apart = decode_attention(q, k, v, positions, config=DecodeConfig(16, 4, 1, 7, dot=True, fused=False))
        assert torch.equal(fused, apart)
        assert_rel_close(fused, ref.decode_attention_ref(q, k, v, positions), BOUNDS[torch.float32])


@requires_interpreter
def test_decode_scale_and_strided_cache() -> None:
    """A custom scale, and caches that are views of ``[B, C, H, D]`` buffers (strided over H, C)."""
    gen = _gen("strided")
    B, H, C, D = 3, 2, 45, 16
    positions = _positions(B, C, gen, CPU)
    k, v = (
        _cache(B, H, C, D, torch.float32, positions, gen).transpose(1, 2).contiguous().transpose(1, 2) for _ in "kv"
    )
    assert not k.is_contiguous()
    q = torch.randn(B, H, D, generator=gen)
    got = decode_attention(q, k, v, positions, scale=0.3)
    assert_rel_close(got, ref.decode_attention_ref(q, k, v, positions, scale=0.3), 1e-5)


def _append_case(B: int, H: int, C: int, D: int, dtype, use_rope: bool, device) -> None:
    gen = _gen("append", B, H, C, D, dtype, use_rope)
    positions = _positions(B, C, gen, device)
    wide = torch.randn(B, 3 * H * D + 8, generator=gen).to(device=device, dtype=dtype)
    qkv = wide[:, 4 : 4 + 3 * H * D]  # a strided view: row stride 3·H·D + 8
    k = torch.randn(B, C, H, D, generator=gen).to(device=device, dtype=dtype).transpose(1, 2)  # strided cache
    v = torch.randn(B, H, C, D, generator=gen).to(device=device, dtype=dtype)
    k0, v0 = k.clone(), v.clone()
    tables = (
        torch.randn(C + 3, D // 2, generator=gen).to(device),
        torch.randn(C + 3, D // 2, generator=gen).to(device),
    )
    q = rope_append(qkv, H, k, v, positions, tables if use_rope else None)
    assert q.shape == (B, H, D) and q.dtype == dtype and q.is_contiguous()
    q_in, k_in, v_in = qkv.reshape(B, 3, H, D).unbind(1)
    if use_rope:
        q_in, k_in = ref.rope_at(q_in, *tables, positions), ref.rope_at(k_in, *tables, positions)
    assert_rel_close(q, q_in, BOUNDS[dtype])
    written = torch.zeros(B, H, C, dtype=torch.bool, device=device)
    for b, p in enumerate(positions.tolist()):
        written[b, :, p] = True
        assert_rel_close(k[b, :, p], k_in[b], BOUNDS[dtype])
        assert torch.equal(v[b, :, p], v_in[b])
    assert torch.equal(k[~written], k0[~written]) and torch.equal(v[~written], v0[~written])  # one row each


@requires_interpreter
@pytest.mark.parametrize("use_rope", [True, False], ids=["rope", "no-rope"])
@pytest.mark.parametrize(
    ("D", "dtype"),
    [
        pytest.param(d, t, id=f"D{d}-{DTYPE_NAMES[t]}")
        for d, t in ((16, torch.float32), (32, torch.bfloat16), (64, torch.float16), (128, torch.bfloat16))
    ],
)
def test_rope_append_writes_one_row(D: int, dtype: torch.dtype, use_rope: bool) -> None:
    _append_case(3, 3, 11, D, dtype, use_rope, CPU)


def _rope_tables(C: int, D: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's rotary tables ``[C, D/2]``: angles position · 10000^(−2i/D)."""
    angles = torch.arange(C, dtype=torch.float32)[:, None] * 10000 ** (-torch.arange(D // 2) / (D // 2))
    return angles.cos().to(device), angles.sin().to(device)


def _chain(B: int, H: int, D: int, prefill: int, steps: int, C: int, dtype, device, config=None) -> None:
    """Prefill rows 0..prefill-1 of the caches (k rotated as the forward would), then ``steps``
    append + decode steps: each step's output equals causal attention with RoPE over the whole
    sequence at that token."""
    gen = _gen("chain", B, H, D, prefill, steps, dtype)
    T = prefill + steps
    qkv = torch.randn(B, T, 3 * H * D, generator=gen).to(device=device, dtype=dtype)
    tables = _rope_tables(C, D, device)
    q_all, k_all, v_all = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # [B, H, T, D] each
    expected = ref.attention(q_all, k_all, v_all, causal=True, rope_tables=tables)  # [B, T, H·D]
    k_cache = torch.full((B, H, C, D), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full((B, H, C, D), float("nan"), dtype=dtype, device=device)
    k_cache[:, :, :prefill] = ref.rope(k_all[:, :, :prefill], *tables).to(dtype)
    v_cache[:, :, :prefill] = v_all[:, :, :prefill]
    positions = torch.full((B,), prefill, dtype=torch.int32, device=device)
    for t in range(prefill, T):
        q = rope_append(qkv[:, t], H, k_cache, v_cache, positions, tables)
        out = decode_attention(q, k_cache, v_cache, positions, config=config)
        assert_rel_close(out, expected[:, t], 2 * BOUNDS[dtype])
        positions += 1


@requires_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_then_steps_equal_causal_attention(dtype: torch.dtype) -> None:
    _chain(3, 2, 32, 61, 6, 80, dtype, CPU)


@requires_interpreter
def test_bad_inputs_raise() -> None:
    q, cache = torch.zeros(2, 3, 32), torch.zeros(2, 3, 10, 32)
    pos = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="head dim"):
        decode_attention(torch.zeros(2, 3, 48), torch.zeros(2, 3, 10, 48), torch.zeros(2, 3, 10, 48), pos)
    with pytest.raises(ValueError, match="positions must be int32"):
        decode_attention(q, cache, cache, pos.long())
    with pytest.raises(ValueError, match="k_cache must be"):
        decode_attention(q, torch.zeros(2, 4, 10, 32), cache, pos)
    with pytest.raises(ValueError, match="dtype"):
        decode_attention(q, cache.half(), cache, pos)
    with pytest.raises(ValueError, match="unit stride on D"):
        decode_attention(q, torch.zeros(2, 3, 32, 10).transpose(2, 3), cache, pos)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_append(torch.zeros(2, 3 * 3 * 32 + 1), 3, cache, cache, pos, None)
    with pytest.raises(ValueError, match="rope cos"):
        rope_append(torch.zeros(2, 3 * 3 * 32), 3, cache, cache, pos, (torch.zeros(9, 16), torch.zeros(9, 16)))


def test_decode_config_fills_the_gpu_from_the_capacity(monkeypatch) -> None:
    """B·H·splits reaches at most DECODE_PROGRAMS_PER_SM[D] programs per SM (two at D = 64, one
    at D = 128) in slices of at least 128 rows, with D = 128's wide tile from 1024-row slices and
    2-stage tiles once the heads alone fill the SMs; the choice depends on the capacity only (one
    launch per captured graph)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda")
    cfg = configs.decode_config
    wide = {D: configs.DECODE_HOPPER[D][1] for D in (64, 128)}
    narrow = {D: configs.DECODE_HOPPER[D][0] for D in (64, 128)}
    assert wide[128].block_n > narrow[128].block_n
    assert cfg(cuda, 8, 131072, 128, 132).splits == 16  # 8·16 = 128 programs on 132 SMs
    assert cfg(cuda, 8, 131072, 128, 132).block_n == wide[128].block_n  # slices of 8192 rows
    assert cfg(cuda, 8, 16384, 128, 132).block_n == wide[128].block_n  # slices of 1024 rows
    assert cfg(cuda, 8, 4096, 128, 132).splits == 16  # slices of 256 rows
    assert cfg(cuda, 8, 4096, 128, 132).block_n == narrow[128].block_n
    assert cfg(cuda, 8, 1024, 128, 132).splits == 8  # the 128-row floor
    assert cfg(cuda, 8, 32768, 64, 132).splits == 33  # two programs per SM at D = 64
    assert cfg(cuda, 8, 32768, 64, 132).block_n == cfg(cuda, 8, 1024, 64, 132).block_n == 128
    assert cfg(cuda, 64, 4096, 64, 132).splits == 4
    assert cfg(cuda, 64, 4096, 128, 132).splits == 2  # 2048-row slices: wide
    assert cfg(cuda, 64, 4096, 128, 132).block_n == wide[128].block_n
    assert cfg(cuda, 512, 1024, 64, 132).splits == 1  # more heads than SMs: no split, no combine
    assert cfg(cuda, 8192, 131072, 64, 132).splits == 1
    for D in (64, 128):  # ... and the many-heads tile (3 stages -> 2), at any capacity
        many = configs.DECODE_HOPPER[D][2]
        assert many.num_stages < wide[D].num_stages
        assert cfg(cuda, 512, 4096, D, 132).block_n == many.block_n
        assert cfg(cuda, 132, 131072, D, 132).num_stages == many.num_stages
        assert cfg(cuda, 131, 131072, D, 132).num_stages == wide[D].num_stages
    for D in (16, 32):  # one matmul tile in every role
        assert len({c.block_n for c in configs.DECODE_HOPPER[D][:3]}) == 1 and configs.DECODE_HOPPER[D][2].dot
    assert cfg(cuda, 1, 10**6, 64, 132).splits == 256  # DECODE_MAX_SPLITS
    assert cfg(cuda, 1, 10**6, 128, 132).splits == 132
    assert cfg(cuda, 1, 100, 64, 132).splits == 1
    for D in configs.SUPPORTED_HEAD_DIMS:
        for capacity in (1000, 4096, 32768):
            every = configs.decode_configs(cuda, 8, capacity, D, 132)
            assert every[0] == cfg(cuda, 8, capacity, D, 132) and len(set(every)) == len(every)
            assert {c.splits for c in every} == {every[0].splits}
            assert any(not c.fused for c in every) or D < 64, "the unfused combine is tested too"
    with pytest.raises(ValueError, match="splits"):
        DecodeConfig(16, 4, 1, 0)


def test_other_gpus_get_one_program_per_sm_and_tiles_within_their_shared_memory(monkeypatch) -> None:
    """Off sm_90 the default tiles run at one program per SM (two 96 KB tiles do not share an
    A100 SM), and a tile is fitted to the device's opt-in shared memory, less 16 KB."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cuda = torch.device("cuda")
    assert configs.decode_config(cuda, 8, 32768, 64, 108).splits == 13  # 108 SMs // 8 heads
    assert configs.decode_config(cuda, 8, 32768, 64, 108).block_n == configs.DECODE_DEFAULT[64][0].block_n

    class Props:
        shared_memory_per_block_optin = 101376  # sm_86 / sm_89: 99 KB

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    budget = configs.decode_shared_budget(cuda)
    assert budget == 101376 - 16 * 1024
    tile = DecodeConfig(128, 4, 3, 13, dot=True)  # 96 KB at 2 bytes
    assert configs.fit_decode_shared(tile, 64, 2, budget).block_n == 64
    assert configs.fit_decode_shared(tile, 64, 2).block_n == 128  # the sm_90 budget
    Props.shared_memory_per_block_optin = 232448  # sm_90: 227 KB, capped at DECODE_MAX_SHARED
    assert configs.decode_shared_budget(cuda) == configs.DECODE_MAX_SHARED
    assert configs.decode_shared_budget(torch.device("cpu")) == configs.DECODE_MAX_SHARED


def test_fit_decode_shared_halves_the_tile_for_wide_elements() -> None:
    """Every table tile fits the shared-memory budget at 2 bytes an element; at 4 bytes (fp32
    caches) the fitted tile does too, with the same warps, stages, split and combine."""
    budget = configs.DECODE_MAX_SHARED
    for D, table in configs.DECODE_HOPPER.items():
        for tile in table:
            config = DecodeConfig(tile.block_n, tile.num_warps, tile.num_stages, 7, tile.dot, tile.fused)
            assert configs.fit_decode_shared(config, D, 2) == config
            assert config.block_n * D * 2 * 2 * config.num_stages <= budget
            fitted = configs.fit_decode_shared(config, D, 4)
            assert fitted.block_n * D * 4 * 2 * fitted.num_stages <= budget
            assert fitted.block_n in (config.block_n, config.block_n // 2)
            assert (fitted.num_warps, fitted.num_stages, fitted.splits, fitted.dot, fitted.fused) == (
                config.num_warps,
                config.num_stages,
                7,
                config.dot,
                config.fused,
            )
    wide = DecodeConfig(128, 4, 3, 16, dot=True)
    assert configs.fit_decode_shared(wide, 128, 4).block_n == 64  # 384 KB -> 192 KB


# ---------------------------------------------------------------------------------------------
# GPU: every launch the chooser may return, compiled, at real sizes; and a CUDA graph.
# ---------------------------------------------------------------------------------------------

GPU_CASES = [(B, C, D) for D in (64, 128) for C in (4097, 32768) for B in (1, 8, 64)]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(("B", "C", "D"), [pytest.param(*c, id=f"B{c[0]}-C{c[1]}-D{c[2]}") for c in GPU_CASES])
def test_gpu_every_config(B: int, C: int, D: int) -> None:
    H = 4
    for config in configs.decode_configs(CUDA, B * H, C, D, sm_count(CUDA)):
        _decode_case(B, H, C, D, torch.bfloat16, CUDA, config, ("gpu", B, C, D, config))


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gpu_dtypes_and_small_heads(dtype: torch.dtype) -> None:
    for D in configs.SUPPORTED_HEAD_DIMS:
        _decode_case(3, 5, 1000, D, dtype, CUDA, None, ("gpu-dtype", D, dtype))
        # slices past DECODE_LONG_SLICE: the wide tiles, fitted to shared memory for fp32
        _decode_case(8, 4, 4097, D, dtype, CUDA, None, ("gpu-dtype-long", D, dtype))
        _append_case(3, 5, 200, D, dtype, True, CUDA)


@pytest.mark.gpu
@requires_cuda
def test_gpu_prefill_then_steps() -> None:
    _chain(2, 4, 128, 3000, 8, 4096, torch.bfloat16, CUDA)


@pytest.mark.gpu
@requires_cuda
def test_gpu_append_and_decode_replayed_from_a_cuda_graph() -> None:
    """rope_append + decode_attention captured once, replayed 12 times while ``positions += 1``
    (inside the graph): each step equals the reference on the cache as it then is."""
    B, H, C, D, dtype = 3, 8, 4096, 128, torch.bfloat16
    gen = _gen("graph")
    k_cache = torch.randn(B, H, C, D, generator=gen).to(CUDA, dtype)
    v_cache = torch.randn(B, H, C, D, generator=gen).to(CUDA, dtype)
    tables = _rope_tables(C, D, CUDA)
    positions = torch.tensor([1000, 3000, 17], dtype=torch.int32, device=CUDA)
    qkv = torch.empty(B, 3 * H * D, device=CUDA, dtype=dtype)
    out = torch.empty(B, H * D, device=CUDA, dtype=dtype)

    def step() -> None:
        q = rope_append(qkv, H, k_cache, v_cache, positions, tables)
        decode_attention(q, k_cache, v_cache, positions, out=out)
        positions.add_(1)

    qkv.copy_(torch.randn(B, 3 * H * D, generator=gen))
    step()  # compile outside the graph
    positions.sub_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(12):
        qkv.copy_(torch.randn(B, 3 * H * D, generator=gen))
        before = positions.clone()
        q_in, k_in, v_in = qkv.float().view(B, 3, H, D).unbind(1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(positions, before + 1)
        for b, p in enumerate(before.tolist()):
            assert_rel_close(v_cache[b, :, p], v_in[b], 1e-2)
            assert_rel_close(k_cache[b, :, p], ref.rope_at(k_in, *tables, before)[b], 1e-2)
        q_rot = ref.rope_at(q_in, *tables, before)
        assert_rel_close(out, ref.decode_attention_ref(q_rot, k_cache, v_cache, before), 1e-2)
