"""kernels/attention/decode_fp8: ``decode_attention_fp8`` and ``rope_append_fp8`` over an fp8 e4m3
KV cache with per-(sequence, head) scales, against the fp32 reference of the rounded math (the
reference attention over the cache as it reads back, ``row · scale``), and ``fp8_cache`` against
the rounding the accuracy objective applies (``nas.models.precision.fp8_per_head``).

Without CUDA the kernels run under Triton's interpreter on CPU tensors, with every launch the
chooser may return on the CPU (16-row blocks, 64-row slices: odd lengths cross blocks and slices).
Cache rows past each sequence's position hold fp8 NaN: any read of them fails the check.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels._fp8 import FP8_DTYPE, to_e4m3
from kernels.attention import configs
from kernels.attention import reference as ref
from kernels.attention.decode import decode_attention
from kernels.attention.decode_fp8 import (
    decode_attention_fp8,
    decode_config_fp8,
    fp8_cache,
    rope_append_fp8,
)
from kernels.device import sm_count
from tests.kernels._support import CPU, CUDA, DTYPE_NAMES, assert_rel_close, requires_cuda, requires_interpreter
from tests.kernels._support import seeded as _gen

# the output's rounding and fp32 sums only: the reference reads the same rounded cache
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _fp8_case(B: int, H: int, C: int, D: int, dtype, device, key: tuple, *, spread: float = 1.0):
    """A prefill of C rows per head stored as fp8 caches (heads of different magnitudes: the
    scales differ per head), positions (last row, a random one, the first) with NaN past them."""
    gen = _gen(*key)
    scales = torch.logspace(-2, 1, B * H).reshape(B, H, 1, 1) * spread  # per-head ranges 0.01..10
    k = torch.randn(B, H, C, D, generator=gen) * scales
    v = torch.randn(B, H, C, D, generator=gen) * scales.flip(0)
    picks = [C - 1, int(torch.randint(0, C, (1,), generator=gen)), 0]
    positions = torch.tensor([picks[b % 3] for b in range(B)], dtype=torch.int32)
    (kc, ks), (vc, vs) = fp8_cache(k), fp8_cache(v)
    for b, p in enumerate(positions.tolist()):
        kc[b, :, p + 1 :] = float("nan")
        vc[b, :, p + 1 :] = float("nan")
    q = torch.randn(B, H, D, generator=gen).to(dtype)
    return [t.to(device) for t in (q, kc, vc, ks, vs, positions)]


def _read_back(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return cache.float() * scale[:, :, None, None]


CASES = [
    (1, 1, 16, 1, torch.float32),
    (3, 2, 16, 2, torch.bfloat16),
    (3, 3, 32, 37, torch.float16),
    (1, 2, 64, 37, torch.float32),
    (3, 1, 128, 37, torch.bfloat16),
    (3, 1, 16, 1000, torch.float32),
    (1, 1, 32, 1000, torch.bfloat16),
]


@requires_interpreter
@pytest.mark.parametrize(
    ("B", "H", "D", "C", "dtype"),
    [pytest.param(*c, id=f"B{c[0]}-H{c[1]}-D{c[2]}-C{c[3]}-{DTYPE_NAMES[c[4]]}") for c in CASES],
)
def test_decode_fp8_matches_the_reference_of_the_rounded_cache(B, H, D, C, dtype) -> None:
    q, kc, vc, ks, vs, positions = _fp8_case(B, H, C, D, dtype, CPU, ("fp8", B, H, D, C))
    want = ref.decode_attention_ref(q, _read_back(kc, ks), _read_back(vc, vs), positions)
    for config in configs.decode_configs(CPU, B * H, C, D, 1):  # a 16-bit query's tl.dot runs in fp16
        out = torch.full((B, H * D), float("nan"), dtype=dtype)
        got = decode_attention_fp8(q, kc, vc, ks, vs, positions, out=out, config=config)
        assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
        assert_rel_close(got, want, BOUNDS[dtype])


@requires_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode_fp8_holds_queries_past_fp16s_range(dtype) -> None:
    """A 16-bit query's products run in fp16 with q divided by its largest magnitude: a query
    whose scaled values overflow fp16 (bf16 holds 1e30; an fp16 one times wide keys' scales)
    still matches the reference of the rounded cache."""
    B, H, D, C = 2, 3, 64, 301
    q, kc, vc, ks, vs, positions = _fp8_case(B, H, C, D, torch.float32, CPU, ("fp8-f16", dtype), spread=1e3)
    q = (q * ((1e30 if dtype == torch.bfloat16 else 6e4) / q.abs().amax())).to(dtype)
    want = ref.decode_attention_ref(q, _read_back(kc, ks), _read_back(vc, vs), positions)
    for config in configs.decode_configs(CPU, B * H, C, D, 1):
        assert_rel_close(decode_attention_fp8(q, kc, vc, ks, vs, positions, config=config), want, BOUNDS[dtype])


@requires_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode_fp8_keeps_weights_far_below_the_largest(dtype) -> None:
    """One "sink" row takes nearly all the attention and holds v = 0, so the output is the tail's
    weights (each 2^-26 of the sink's) times its values: weights that fp16 rounds to zero unless
    they are scaled up before the cast (``_walk_dot_fp8``) must still count, as they do in the sum."""
    B, H, D, C = 1, 2, 16, 150
    gen = _gen("sink", dtype)
    k = torch.zeros(B, H, C, D)
    k[:, :, 0] = 1.0  # the sink's score: q·1; every other row's: 0
    v = torch.randn(B, H, C, D, generator=gen) * 1e4  # the output (~1e-3) a normal number in fp16 too
    v[:, :, 0] = 0.0
    (kc, ks), (vc, vs) = fp8_cache(k), fp8_cache(v)
    q = torch.full((B, H, D), 26.0 / (D * D**-0.5 * 1.4426950408889634)).to(dtype)  # sink 26 above, base 2
    positions = torch.full((B,), C - 1, dtype=torch.int32)
    want = ref.decode_attention_ref(q, _read_back(kc, ks), _read_back(vc, vs), positions)
    assert want.abs().max() < 1e-2  # the tail's share: its weights below fp16's smallest (2^-24)
    for config in configs.decode_configs(CPU, B * H, C, D, 1):
        assert_rel_close(decode_attention_fp8(q, kc, vc, ks, vs, positions, config=config), want, BOUNDS[dtype])


def test_the_fp8_launch_doubles_the_programs_per_sm(monkeypatch) -> None:
    """On sm_90 at a swept head dim the fp8 cache's launch runs twice the bf16 launch's programs
    per SM (each row is half the bytes) in one fixed tile; other head dims and GPUs keep bf16's."""
    from kernels.attention import decode_fp8

    cuda = torch.device("cuda")
    monkeypatch.setattr(decode_fp8, "is_cuda", lambda device: True)
    monkeypatch.setattr(configs, "is_cuda", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for D in (64, 128):
        for heads, capacity in ((64, 32768), (8, 4096), (512, 65536)):
            fp8, bf16 = (
                decode_config_fp8(cuda, heads, capacity, D, 132),
                configs.decode_config(cuda, heads, capacity, D, 132),
            )
            wanted = configs.DECODE_PROGRAMS_PER_SM[D] * 2 * 132 // heads
            assert fp8.splits == max(1, min(wanted, capacity // configs.DECODE_MIN_SLICE, configs.DECODE_MAX_SPLITS))
            assert fp8.splits >= bf16.splits and fp8.dot and fp8.block_n * D * 2 * fp8.num_stages <= 200 * 1024
    assert (
        decode_config_fp8(cuda, 64, 32768, 64, 132).splits == 2 * configs.decode_config(cuda, 64, 32768, 64, 132).splits
    )
    assert decode_config_fp8(cuda, 64, 32768, 32, 132) == configs.decode_config(cuda, 64, 32768, 32, 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert decode_config_fp8(cuda, 64, 32768, 64, 132) == configs.decode_config(cuda, 64, 32768, 64, 132)


@requires_interpreter
def test_decode_fp8_equals_the_bf16_kernel_on_the_read_back_cache() -> None:
    """fp32 query: the fp8 kernel over (cache, scale) and ``decode_attention`` over the cache
    as it reads back, fp32, agree to fp32 round-off (the scales folded into q and the output
    change nothing but the order of two products)."""
    B, H, C, D = 2, 3, 77, 32
    q, kc, vc, ks, vs, positions = _fp8_case(B, H, C, D, torch.float32, CPU, ("fp8-vs-plain",))
    kd, vd = _read_back(kc, ks), _read_back(vc, vs)
    assert_rel_close(decode_attention_fp8(q, kc, vc, ks, vs, positions), decode_attention(q, kd, vd, positions), 1e-6)


def test_fp8_cache_rounds_as_the_accuracy_objective_does() -> None:
    """The prefill's stored rows read back exactly as ``fp8_per_head`` rounds them (one rule for
    what the search scores and what the kernel reads); an all-zero head takes scale 1."""
    from nas.models.precision import fp8_per_head

    x = torch.randn(3, 2, 29, 16, generator=_gen("cache")) * torch.tensor([0.01, 300.0]).reshape(1, 2, 1, 1)
    x[1, 0] = 0.0
    cache, scale = fp8_cache(x, capacity=40)
    assert cache.dtype == FP8_DTYPE and cache.shape == (3, 2, 40, 16) and scale.dtype == torch.float32
    assert torch.equal(_read_back(cache, scale)[:, :, :29], fp8_per_head(x))
    assert torch.equal(cache[:, :, 29:].float(), torch.zeros(3, 2, 11, 16))
    assert scale[1, 0] == 1.0
    assert (cache.float().abs().amax(dim=(2, 3))[scale != 1.0] == 448.0).all()  # each head's amax maps to 448
    with pytest.raises(ValueError, match="capacity 10"):
        fp8_cache(x, capacity=10)


def _rope_tables(C: int, D: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(C, dtype=torch.float32)[:, None] * (10000.0 ** (-torch.arange(0, D // 2) / (D // 2)))
    return angles.cos().to(device), angles.sin().to(device)


@requires_interpreter
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "no-rope"])
@pytest.mark.parametrize(("H", "D", "dtype"), [(3, 16, torch.float32), (1, 64, torch.bfloat16), (2, 32, torch.float16)])
def test_append_fp8_stores_with_the_fixed_scales_and_saturates(H: int, D: int, dtype, rope: bool) -> None:
    """The new row is stored as ``fp8(clamp(x / scale, ±448))`` at each sequence's position and
    nowhere else (one value per head is pushed past the prefill's range); q comes back rotated."""
    B, C = 3, 21
    gen = _gen("append", H, D, rope)
    qkv = torch.randn(B, 3 * H * D, generator=gen).to(dtype)
    qkv[:, H * D] = 1e4  # k channel 0 of head 0: far past its scale's range
    k_cache, k_scale = fp8_cache(torch.randn(B, H, 5, D, generator=gen), capacity=C)
    v_cache, v_scale = fp8_cache(torch.randn(B, H, 5, D, generator=gen) * 4, capacity=C)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    positions = torch.tensor([5, 20, 0], dtype=torch.int32)
    tables = _rope_tables(C, D, CPU) if rope else None
    q_out = rope_append_fp8(qkv, H, k_cache, v_cache, k_scale, v_scale, positions, tables)
    x = qkv.float().reshape(B, 3, H, D)
    q, k, v = x[:, 0], x[:, 1], x[:, 2]
    if rope:
        q, k = (ref.rope_at(t, *tables, positions) for t in (q, k))
    assert_rel_close(q_out, q, {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype])
    for cache, before, rows, scale in ((k_cache, before_k, k, k_scale), (v_cache, before_v, v, v_scale)):
        stored = (rows * (1.0 / scale[:, :, None])).clamp(-448.0, 448.0).to(FP8_DTYPE)  # the kernel's x·(1/s)
        for b, p in enumerate(positions.tolist()):
            assert torch.equal(cache[b, :, p].view(torch.uint8), stored[b].view(torch.uint8)), (b, p)
            others = torch.ones(C, dtype=torch.bool)
            others[p] = False
            assert torch.equal(cache[b, :, others].view(torch.uint8), before[b, :, others].view(torch.uint8))
    assert k_cache[:, 0, :, 0].float().abs().max() == 448.0  # saturated, not NaN


@triton.jit
def _store_e4m3(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, to_e4m3(tl.load(X + i), Y.dtype.element_ty))


@requires_interpreter
def test_the_e4m3_rounding_is_torchs_bit_for_bit() -> None:
    """``to_e4m3`` (saturate, round to nearest even in fp32, re-encode) stores what torch's cast
    of the saturated value stores, on random values over seven decades, every e4m3 value, ties,
    subnormals, ±0 and values past ±448."""
    gen = _gen("e4m3")
    every = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    every = every[every.isfinite()]
    ties = (every[1:] + every[:-1]) / 2  # halfway between neighbours (same sign)
    tiny = [2.0**-10, -(2.0**-10), 3 * 2.0**-10]  # halfway to the smallest subnormal, and past it
    special = torch.tensor([0.0, -0.0, *tiny, 447.0, 449.0, 464.0, 1e5, -1e5, -17.0, -31.0])
    scaled = torch.randn(3000, generator=gen) * 10 ** torch.empty(3000).uniform_(-4, 3, generator=gen)
    x = torch.cat([scaled, every, ties, special])
    n = 1 << (x.numel() - 1).bit_length()
    x = torch.cat([x, torch.zeros(n - x.numel())])
    y = torch.empty(n, dtype=FP8_DTYPE)
    _store_e4m3[(1,)](x, y, n)
    assert torch.equal(y.view(torch.uint8), x.clamp(-448.0, 448.0).to(FP8_DTYPE).view(torch.uint8))


@requires_interpreter
def test_bad_inputs_are_named() -> None:
    q, kc, vc, ks, vs, positions = _fp8_case(2, 2, 9, 16, torch.bfloat16, CPU, ("bad",))
    with pytest.raises(ValueError, match=r"k_cache.dtype must be torch.float8_e4m3fn"):
        decode_attention_fp8(q, kc.float(), vc, ks, vs, positions)
    with pytest.raises(ValueError, match=r"v_scale must be contiguous fp32 \[B, H\]"):
        decode_attention_fp8(q, kc, vc, ks, vs[:, :1], positions)
    with pytest.raises(ValueError, match=r"k_scale must be contiguous fp32"):
        decode_attention_fp8(q, kc, vc, ks.half(), vs, positions)
    with pytest.raises(ValueError, match="positions must be int32"):
        decode_attention_fp8(q, kc, vc, ks, vs, positions.long())
    with pytest.raises(ValueError, match="head dim D=12"):
        decode_attention_fp8(q[..., :12], kc[..., :12], vc[..., :12], ks, vs, positions)


# ---------------------------------------------------------------------------------------------
# GPU: every launch the chooser may return, compiled, at real sizes; and a CUDA graph.
# ---------------------------------------------------------------------------------------------

GPU_CASES = [(B, C, D) for D in (64, 128) for C in (4097, 32768) for B in (1, 8)]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(("B", "C", "D"), [pytest.param(*c, id=f"B{c[0]}-C{c[1]}-D{c[2]}") for c in GPU_CASES])
def test_gpu_fp8_every_config(B: int, C: int, D: int) -> None:
    H = 4
    q, kc, vc, ks, vs, positions = _fp8_case(B, H, C, D, torch.bfloat16, CUDA, ("gpu-fp8", B, C, D))
    want = ref.decode_attention_ref(q, _read_back(kc, ks), _read_back(vc, vs), positions)
    for config in configs.decode_configs(CUDA, B * H, C, D, sm_count(CUDA)):
        got = decode_attention_fp8(q, kc, vc, ks, vs, positions, config=config)
        assert_rel_close(got, want, BOUNDS[torch.bfloat16])
    assert_rel_close(decode_attention_fp8(q, kc, vc, ks, vs, positions), want, BOUNDS[torch.bfloat16])


@pytest.mark.gpu
@requires_cuda
def test_gpu_fp8_append_and_decode_replayed_from_a_cuda_graph() -> None:
    """rope_append_fp8 + decode_attention_fp8 captured once, replayed while ``positions += 1``:
    each step equals the reference over the cache as it then reads back."""
    B, H, C, D, dtype = 3, 8, 4096, 128, torch.bfloat16
    gen = _gen("graph-fp8")
    k_cache, k_scale = fp8_cache(torch.randn(B, H, 3001, D, generator=gen).to(CUDA), capacity=C)
    v_cache, v_scale = fp8_cache(torch.randn(B, H, 3001, D, generator=gen).to(CUDA), capacity=C)
    tables = _rope_tables(C, D, CUDA)
    positions = torch.tensor([1000, 3000, 17], dtype=torch.int32, device=CUDA)
    qkv = torch.empty(B, 3 * H * D, device=CUDA, dtype=dtype)
    out = torch.empty(B, H * D, device=CUDA, dtype=dtype)

    def step() -> None:
        q = rope_append_fp8(qkv, H, k_cache, v_cache, k_scale, v_scale, positions, tables)
        decode_attention_fp8(q, k_cache, v_cache, k_scale, v_scale, positions, out=out)

    qkv.copy_(torch.randn(B, 3 * H * D, generator=gen).to(CUDA, dtype))
    step()  # compile and allocate outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        positions.add_(1)
    for _ in range(12):
        qkv.copy_(torch.randn(B, 3 * H * D, generator=gen).to(CUDA, dtype))
        q = ref.rope_at(qkv.float().reshape(B, 3, H, D)[:, 0], *tables, positions).to(dtype)
        at = positions.clone()
        graph.replay()
        want = ref.decode_attention_ref(q, _read_back(k_cache, k_scale), _read_back(v_cache, v_scale), at)
        assert_rel_close(out, want, 2e-2)
