"""The kernel launches of one ``TritonModel`` forward, each with the features its cost is fitted on.

``launches(arch, shape, sm_count)`` walks the same path as
``nas.models.triton_model.TritonModel.forward`` (and the kernel wrappers' own launch choices)
without a GPU: embedding gather, then per block norm → qkv linear → short conv → attention /
linear attention → out linear (+residual); norm → MLP up (+activation) →
MLP down (+residual); final norm; head. Each norm is folded into the linear after it, so it is a
launch of its own only where that linear does not sum it in its main loop (``_normed_linear``,
``kernels.linear.configs.fuses_norm``). A head dim
the kernels do not run is padded to the next one (P) in the weights, so the qkv linear is ``N = 3·H·P`` wide, the short
conv ``3·H·P`` channels and the out linear ``K = H·P`` deep. The MLP's hidden width and the
readout's outputs are zero-padded to ``kernels.linear.configs.padded_features`` the same way.

Every launch belongs to a *class* (one set of fitted coefficients: ``linear.tma``,
``attention.D64``, ``norm.rmsnorm``, …). Its features are the
work of the busiest SM, which is where wave quantisation enters: a kernel of ``P`` programs
(tiles) on ``S`` SMs runs ``⌈P/S⌉`` of them on the busiest SM, so 133 tiles on 132 SMs cost two
tiles' time, not 133/132. Features per family (``FEATURES`` names them; every feature has a
``KIND`` used to transfer a fit to another GPU):

- linear ``y[M, N] = act(x[M, K] Wᵀ + b) (+ r)``: the tile of the configs the wrapper hands the
  autotuner first (``kernels.linear.configs.candidates``), ``T = ⌈M/BM⌉·⌈N/BN⌉`` tiles,
  ``w = ⌈T/S⌉`` tiles on the busiest SM: ``[1, w, w·⌈K/BK⌉, w·BM·BN·gelu, w·BM·BN·(relu|silu),
  w·BM·BN·residual, MB moved, w·⌈K/BK⌉·(K % 16 ≠ 0), w·⌈K/BK⌉·(K % 8 ≠ 0), w·BM·BN·(N % 8 ≠ 0),
  MB of x read · (K % 64 ≠ 0)]`` (features 8-10: rows the kernels cannot move as vectors; cuBLAS,
  taken only for 16-byte rows, carries the first of them; the last: x's rows off 128-byte cache
  lines). The class is
  the kernel the wrapper picks: cuBLAS's matmul and the epilogue pass
  (``kernels.linear.configs.prefers_cublas``; launch feature 2 with an epilogue, a nominal
  128×128×64 tile, the epilogue's read and write of y in MB moved), persistent TMA (sm_90,
  K > 256, M > 64, 16-byte rows), small M (one row of tiles), short K, long K.
- attention (flash, causal, per padded head dim D): ``P = B·H·⌈T/128⌉`` programs; ``[1, ⌈P/S⌉,
  ⌈P/S⌉·mean key blocks, key blocks of the last query block (the critical path), MB moved]``.
  The class is the route the wrapper takes (``kernels.attention.configs.prefers_sdpa`` with RoPE):
  ``attention.sdpa.D*`` for the rotary pass + SDPA (launch feature 3: rotary pass, cuDNN's memset
  and its kernel; the pass's read and write of q and k in MB moved), else the Triton kernel's.
- linear attention (chunked, per padded head dim D): ``P = B·H·(D/block_v)·split`` programs,
  each walking ``c`` chunks of 64 tokens: ``[1, ⌈P/S⌉, ⌈P/S⌉·c·identity, ⌈P/S⌉·c·elu+1,
  ⌈P/S⌉·c·relu, ⌈P/S⌉·prefix chunks, MB moved]``. Where the identity map takes the two passes
  (``kernels.linear_attention.configs.forward_route``: "two_pass"), class
  ``linear_attention.two_pass.D*``: ``[2 (3 with the carry scan), pass-2 waves, pass-1 waves ·
  chunks per group, pass-2 waves · elu+1, pass-2 waves · relu, carry-scan steps, MB moved with the
  states' write and read (and the groups' fp32 totals and carries)]``; where it takes the prefix
  forward ("prefix"), ``linear_attention.prefix.D*``: ``[1, waves, the longest prefix in chunks,
  waves · elu+1, waves · relu, each SM's share of the prefix steps, MB moved with the prefixes'
  re-reads]``.
- norm (per kind; a program holds ~4096 elements whatever d is): ``[1, ⌈P/S⌉, MB moved]``;
  conv: ``[1, ⌈P/S⌉, ⌈P/S⌉·width, MB moved]``; embedding gather: ``[1, MB moved]``.

Beside its features a launch counts its *plain starts* (``Launch.plain``): kernels that
programmatic dependent launch (``kernels._common.pdl``) cannot overlap with the kernel before
them, so they pay a whole launch gap. The library kernels (torch's embedding gather, cuBLAS, cuDNN)
do not signal their dependents, so the first Triton kernel after one starts plain; and outside the
early-trigger scope (``nas.models.triton_model.PDL_EARLY_MAX_TOKENS``) the cuBLAS route's
epilogue pass is a plain launch (``kernels._common.after_library``). A library kernel's own start
is in its class's launch coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_profiles import KERNEL_FEATURES, KERNEL_FEATURES_ADDED
from kernels.attention import padded_head_dim  # the kernels' head-dim rule, asked, not restated
from kernels.linear.configs import LinearConfig, padded_features
from nas.spec import ArchSpec

from ._costs import mlp_hidden
from ._shape import LatencyShape

__all__ = ["FEATURES", "KINDS", "Launch", "launches", "family"]

_SIZE = 2  # bytes per element: the kernel model is fitted for bf16 / fp16
_LINE = 128  # bytes per L2 cache line (every sm_80+ GPU)
_MB = 1e-6
# feature names per family (the profile format's table: hardware_profiles.KERNEL_FEATURES, with the
# number of last features a calibration written before them lacks, read as 0); KINDS says how each
# transfers to another GPU (see nas.latency._model)
FEATURES: dict[str, tuple[str, ...]] = KERNEL_FEATURES
FEATURES_ADDED: dict[str, tuple[int, ...]] = KERNEL_FEATURES_ADDED
# launch: fixed cost per kernel; wave: per program-wave on an SM (latency); tensor: tensor-core
# work on the busiest SM; vector: CUDA-core work on the busiest SM; bytes: HBM traffic
KINDS: dict[str, str] = {
    "launch": "launch",
    "waves": "wave",
    "k_steps": "tensor",
    "key_blocks": "tensor",
    "critical_blocks": "tensor",
    "chunks_identity": "tensor",
    "chunks_elu": "tensor",
    "chunks_relu": "tensor",
    "prefix": "tensor",
    "gelu": "vector",
    "relu_silu": "vector",
    "residual": "vector",
    "taps": "vector",
    "mbytes": "bytes",
    "k_steps_k16": "tensor",
    "k_steps_k8": "tensor",
    "out_n8": "vector",
    "mbytes_k64": "bytes",
}
_ATTN_BLOCK_M = 128  # query rows per flash-attention program (every sm_90 config)
_CHUNK, _BLOCK_V = 64, 32  # linear attention: chunk length, value block of the common tiling
_CUBLAS_TILE = LinearConfig(128, 128, 64, 1, 4, 1)  # nominal: cuBLAS picks its own; the fit absorbs the difference
_NORM_ELEMENTS = 4096  # kernels.norm.configs.ELEMENTS_PER_PROGRAM
_CONV_TILE = 64  # kernels.conv.configs.HOPPER: 64 × 64 tiles


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its op name, coefficient class, features (``FEATURES[family(cls)]``
    order) and plain starts (see the module docstring; ``launches`` sets them from the launch
    before)."""

    name: str
    cls: str
    x: tuple[float, ...]
    plain: float = 0.0


def family(cls: str) -> str:
    return cls.split(".")[0]


def _library_ends(launch: Launch) -> tuple[bool, bool]:
    """Whether ``launch``'s first and its last kernel are library kernels (no PDL signal): the
    embedding gather, the cuBLAS route (its matmul first; last unless the epilogue pass follows),
    the SDPA route (the rotary pass, a Triton kernel, then cuDNN's)."""
    if launch.cls == "embed":
        return True, True
    if launch.cls == "linear.cublas":
        return True, launch.x[0] == 1.0
    return False, launch.cls.startswith("attention.sdpa.")


def _plain_starts(work: list[Launch], tokens: int) -> list[Launch]:
    """``work`` with each launch's plain starts counted (module docstring)."""
    from dataclasses import replace

    from nas.models.triton_model import PDL_EARLY_MAX_TOKENS

    out, after_library = [], False
    for launch in work:
        first, last = _library_ends(launch)
        plain = float(after_library and not first)
        if launch.cls == "linear.cublas" and launch.x[0] == 2.0 and tokens > PDL_EARLY_MAX_TOKENS:
            plain += 1.0  # the epilogue pass after cuBLAS, launched plain outside the early scope
        out.append(replace(launch, plain=plain))
        after_library = last
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _normed_linear(
    norm_name: str, kind: str, name: str, M: int, N: int, K: int, sms: int, *, activation: str | None = None
) -> list[Launch]:
    """A norm and the linear after it (``TritonModel`` folds the norm into the linear): one launch
    where ``norm_in_kernel`` has the fused kernel sum the row statistics in its main loop (a second
    read of x: its MB moved); elsewhere the norm's own launch, then the linear's usual route."""
    from kernels.linear import configs

    if configs.norm_in_kernel((9, 0), configs.m_bucket(M), N, K, activation):
        return [_linear(name, M, N, K, sms, activation=activation, norm=True)]
    return [_norm(norm_name, kind, M, K, sms), _linear(name, M, N, K, sms, activation=activation)]


def _linear(
    name: str,
    M: int,
    N: int,
    K: int,
    sms: int,
    *,
    activation: str | None = None,
    residual: bool = False,
    norm: bool = False,
) -> Launch:
    from kernels.linear import configs

    bucket = configs.m_bucket(M)
    x_read = (2 if norm else 1) * M * K * _SIZE * _MB
    moved = x_read + (N * K + N + M * N * (2 if residual else 1)) * _SIZE * _MB
    if configs.prefers_cublas((9, 0), bucket, N, K, activation, residual, norm=norm):
        # cuBLAS's matmul (bias, and ReLU, in its epilogue), then for GELU, SiLU or a residual
        # the epilogue pass over the output in place: one class for both launches, the tile a
        # nominal one for the wave and K features (the model's linears all have a bias)
        epilogue = activation in ("gelu", "silu") or residual
        tile = _CUBLAS_TILE
        cls, launch = "linear.cublas", 2.0 if epilogue else 1.0
        moved += 2 * M * N * _SIZE * _MB * epilogue
    else:
        aligned = (K * _SIZE) % 16 == 0 and (N * _SIZE) % 16 == 0  # row strides a tensor descriptor can address
        tma = configs.prefers_tma((9, 0), bucket, K) and aligned
        tile = configs.candidates((9, 0), bucket, K, _SIZE, tma=tma)[0]
        cls = (
            "linear.tma"
            if tma
            else "linear.small_m"
            if bucket <= configs.SMALL_M_MAX
            else "linear.short_k"
            if K <= configs.SHORT_K_MAX
            else "linear.long_k"
        )
        launch = 1.0
    tiles = _cdiv(M, tile.block_m) * _cdiv(N, tile.block_n)
    w = _cdiv(tiles, sms)
    elems = w * tile.block_m * tile.block_n / 1e4
    k_steps = w * _cdiv(K, tile.block_k)
    # Rows off the vector loads and stores: K not a multiple of 16 (the fused kernel's loads masked
    # element-wise: Triton's divisibility specialisation; cuBLAS, which prefers_cublas gives these
    # rows where they are 16-byte aligned, runs a slower kernel too), K not a multiple of 8 (x's
    # rows not even 16-byte aligned) and N not a multiple of 8 (the output's rows the same; cuBLAS
    # never takes these two). The fused kernel's cost is several times the aligned loop on sm_90
    # (kernel grid: widths 40 and 200 beside 32, 48, 192 and 256). Rows of x that do not start on
    # a 128-byte cache line (K not a multiple of 64) cost more to read on either route: every
    # tile's row straddles two lines (the preset spaces' widths, multiples of 128, were predicted
    # 4-8 % high at 32×512 without this term: predictor_rows_h100_lease7.json).
    triton = cls != "linear.cublas"
    return Launch(
        name,
        cls,
        (
            launch,
            w,
            k_steps,
            elems * (activation == "gelu"),
            elems * (activation in ("relu", "silu")),
            elems * residual,
            moved,
            k_steps * (K % 16 != 0),
            k_steps * (triton and K % 8 != 0),
            elems * (triton and N % 8 != 0),
            x_read * ((K * _SIZE) % _LINE != 0),
        ),
    )


def _attention(name: str, B: int, T: int, H: int, D: int, sms: int) -> Launch:
    from kernels.attention.configs import prefers_sdpa

    q_blocks = _cdiv(T, _ATTN_BLOCK_M)
    w = _cdiv(B * H * q_blocks, sms)
    mean_blocks = (q_blocks + 1) / 2  # causal: query block i reads i + 1 key blocks of 128
    moved = 4 * B * T * H * D * _SIZE * _MB  # q, k, v read, o written
    if prefers_sdpa((9, 0), B * H, T, rope=True):  # the model's attention always has RoPE
        # the rotary pass (q and k read and written), cuDNN's memset and its flash kernel: one
        # class for the three launches, 128-row query tiles as the Triton kernel's
        moved += 4 * B * T * H * D * _SIZE * _MB
        return Launch(name, f"attention.sdpa.D{D}", (3.0, w, w * mean_blocks * D / 64, q_blocks * D / 64, moved))
    return Launch(name, f"attention.D{D}", (1.0, w, w * mean_blocks * D / 64, q_blocks * D / 64, moved))


def _linear_attention(name: str, B: int, T: int, H: int, D: int, feature_map: str, sms: int) -> Launch:
    from kernels.linear_attention.configs import (
        CARRY_BLOCK_G,
        CARRY_TILE,
        TWO_PASS_HOPPER,
        forward_route,
        prefix_config_for,
        split_for,
        two_pass_plan,
    )

    route = forward_route((9, 0), B * H, T, D, feature_map)
    elu, relu = float(feature_map == "elu+1"), float(feature_map == "relu")
    if route == "two_pass":
        # pass 1: B·H·(D/bk)·(D/bv) state blocks, each walking its group of chunks (the critical
        # path), in the plan's groups; the carry scan between the passes when there are several;
        # pass 2: one program per (chunk, value block). The states go to memory and back (bf16);
        # with groups also the fp32 totals (written, scanned in place) and each pass-2 program's
        # fp32 carry tile. A normalized map's φ and z ride on pass 2's waves (features 3, 4).
        plan = two_pass_plan(B * H, T, D, TWO_PASS_HOPPER[D][0], sms)
        bk, bv, nc, group, groups = plan.config.block_k, plan.config.block_v, plan.chunks, plan.group, plan.groups
        blocks = B * H * (D // bk) * (D // bv)
        w1 = _cdiv(blocks * groups, sms)
        w2 = _cdiv(B * H * nc * (D // bv), sms)
        moved = (4 * B * T * H * D + 2 * B * H * nc * D * D) * _SIZE * _MB
        carry = 0.0
        if groups > 1:
            moved += (3 * groups + nc) * B * H * D * D * 4 * _MB
            carry = _cdiv(B * H * _cdiv(D * D, CARRY_TILE), sms) * _cdiv(groups, CARRY_BLOCK_G)
        launches = 2.0 + (groups > 1)
        return Launch(
            name,
            f"linear_attention.two_pass.D{D}",
            (launches, w2, w1 * group * D / 64, w2 * elu, w2 * relu, carry, moved),
        )
    if route == "prefix":
        # one program per (chunk, value block), the latest chunks first; program c sums the c
        # chunks before its own (the longest, nc - 1, is the critical path), B·H·nc²/2 chunk
        # steps in all (each SM's share is feature 5), then its chunk's outputs as pass 2 does.
        cfg = prefix_config_for(D)
        nc = _cdiv(T, cfg.chunk)
        blocks = B * H * (D // cfg.block_v)
        w = _cdiv(blocks * nc, sms)
        steps = _cdiv(blocks * nc * (nc - 1) // 2, sms) * D / 64
        moved = (4 * B * T * H * D + 2 * B * H * nc * (nc - 1) // 2 * cfg.chunk * D) * _SIZE * _MB
        return Launch(
            name,
            f"linear_attention.prefix.D{D}",
            (1.0, w, (nc - 1) * cfg.chunk / 64 * D / 64, w * elu, w * relu, steps, moved),
        )
    chunks = _cdiv(T, _CHUNK)
    block_v = min(_BLOCK_V, D)
    split = split_for(B * H * max(1, D // 32), chunks, sms)
    w = _cdiv(B * H * (D // block_v) * split, sms)
    walk = w * _cdiv(chunks, split) * D / 64
    prefix = w * chunks * (split - 1) / (2 * split) * D / 64  # segment s sums the states of s/split of the chunks
    moved = 4 * B * T * H * D * _SIZE * _MB
    return Launch(
        name,
        f"linear_attention.D{D}",
        (
            1.0,
            w,
            walk * (feature_map == "identity"),
            walk * (feature_map == "elu+1"),
            walk * (feature_map == "relu"),
            prefix,
            moved,
        ),
    )


def _norm(name: str, kind: str, rows: int, d: int, sms: int) -> Launch:
    width = _pow2(d)
    per_program = max(1, _NORM_ELEMENTS // width)
    w = _cdiv(_cdiv(rows, per_program), sms)
    moved = (2 * rows * d + 2 * d) * _SIZE * _MB
    return Launch(name, f"norm.{kind}", (1.0, w, moved))  # a program moves ~4096 elements: waves say it


def _conv(name: str, B: int, T: int, C: int, width: int, sms: int) -> Launch:
    w = _cdiv(_cdiv(T, _CONV_TILE) * _cdiv(C, _CONV_TILE) * B, sms)
    moved = (2 * B * T * C + C * (width + 1)) * _SIZE * _MB
    return Launch(name, "conv", (1.0, w, w * width, moved))


def launches(arch: ArchSpec, shape: LatencyShape, sm_count: int) -> list[Launch]:
    """The kernel launches of ``arch``'s TritonModel forward at ``shape`` in execution order, with
    their features on a GPU of ``sm_count`` SMs. ValueError for a head dim no kernel runs."""
    d, B, T = arch.d_model, shape.batch, shape.seq_len
    M = B * T
    out = [Launch("embed", "embed", (1.0, (M * 8 + 2 * M * d) * _SIZE * _MB))]
    for i, layer in enumerate(arch.layers):
        prefix = f"layers.{i}"
        if layer.mixer != "none":
            D = d // layer.heads
            P = padded_head_dim(D)
            if P is None:
                raise ValueError(f"layer {i}: head dim {D} has no {layer.mixer} kernel")
            HP = layer.heads * P  # heads padded to P in the weights: the projection writes them so
            out += _normed_linear(f"{prefix}.mixer_norm", layer.norm, f"{prefix}.qkv", M, 3 * HP, d, sm_count)
            if layer.short_conv:
                out.append(_conv(f"{prefix}.short_conv", B, T, 3 * HP, layer.short_conv, sm_count))
            if layer.mixer == "attention":
                out.append(_attention(f"{prefix}.attention", B, T, layer.heads, P, sm_count))
            else:
                out.append(
                    _linear_attention(f"{prefix}.linear_attention", B, T, layer.heads, P, layer.feature_map, sm_count)
                )
            out.append(_linear(f"{prefix}.out", M, d, HP, sm_count, residual=True))
        if layer.mlp_ratio > 0:
            hidden = padded_features(mlp_hidden(layer, d))  # zero-padded in the weights
            out += _normed_linear(
                f"{prefix}.mlp_norm",
                layer.norm,
                f"{prefix}.mlp_up",
                M,
                hidden,
                d,
                sm_count,
                activation=layer.activation,
            )
            out.append(_linear(f"{prefix}.mlp_down", M, d, hidden, sm_count, residual=True))
    rows = M if arch.readout == "token" else B
    n_out = padded_features(arch.n_out)  # the readout's rows zero-padded in the weights
    out += _normed_linear("final_norm", arch.layers[-1].norm, "head", rows, n_out, d, sm_count)
    return _plain_starts(out, M)
