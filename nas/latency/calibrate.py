"""Calibration of the per-kernel cost model on a real GPU (``nas profiles calibrate``).

``calibrate(profile)`` on a CUDA machine whose GPU the profile lists:

1. compiles every kernel it will time in parallel worker processes (Triton compiles are seconds
   each and CPU-bound; the autotuners' timings taken there, under contention, are then deleted
   from Triton's cache so that the timed process tunes alone);
2. times every kernel family the ``TritonModel`` launches — fused linear (every epilogue, every
   kernel path: TMA, small M, short K, long K), flash attention and chunked linear attention per
   head dim and feature map, both norms, the short conv and the embedding gather — over
   ``kernel_grid()``: d 16-512, the three latency shapes (and linear attention over one long
   sequence, where few heads take the identity map's two passes), vocab sizes that do and do not
   fill the last tile, so wave quantisation over the SM count shows; the linears the model runs
   after a norm (q/k/v, MLP up, readout) launched as it launches them, the norm summed in the
   fused kernel where ``norm_in_kernel`` says so;
   each kernel back to back in a CUDA graph, the per-launch graph gap included;
3. fits stage 1 of ``nas.latency._model`` on those timings (the prior), then stage 2 (every
   class's coefficients refitted on whole forwards, pulled toward the prior; graph gaps,
   intercept, token term) on architectures measured with ``measure`` (``fit_draws``: per-layer
   random stacks and candidates of random search spaces in turn);
4. cross-validates stage 2 over architectures (5 folds; one architecture's shapes never split)
   and, where the rows come from several GPU runs (``run`` key: machines differ by a few per
   cent), also fits on all runs but one and predicts that one: the 95th percentile of
   |measured / predicted - 1| (``interval_widths``: what ``predicted x (1 ± i)`` must span) over
   both sets of held-out residuals, or over the check rows (other architectures, a different
   seed; reported apart) where that is wider, is the interval every calibrated prediction carries;
5. writes the ``calibrated:`` section of the profile YAML (GPU, driver, torch, triton, kernels
   fingerprint, date, interval, check, kernel model), keeping the rest of the file as it was.

Fitting (``fit``) and writing are plain CPU functions over the timing rows, so a calibration can
be refitted from saved rows anywhere.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import logging
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from hardware_profiles import HardwareProfile, ProfileError, load_profile
from kernels.device import CUDA, resolve, sm_count
from nas.spec import ACTIVATIONS, FEATURE_MAPS, NORMS, ArchSpec, LayerSpec

from ._launches import Launch, launches, padded_head_dim
from ._model import (
    DEFAULT_STRENGTH,
    KernelModel,
    cross_validate,
    finite_interval,
    fit_forwards,
    fit_kernels,
    interval_widths,
    quantile,
    relative_errors,
)
from ._shape import LatencyShape, parse_shape

__all__ = [
    "CalibrationError",
    "KernelCase",
    "SHAPES",
    "calibrate",
    "calibration_section",
    "check_summary",
    "fit",
    "kernel_grid",
    "FIT_RANGES",
    "FIT_RANGES_V1",
    "FitRanges",
    "random_arch",
    "fit_draws",
    "preset_arch",
    "preset_archs",
    "random_archs",
    "space_arch",
    "space_archs",
    "stacked_arch",
    "stacked_archs",
    "spearman",
    "write_calibration",
]

log = logging.getLogger(__name__)

SHAPES = tuple(parse_shape(s) for s in ("1x256", "8x1024", "32x512"))
LONG_LENGTHS = (2048, 8192)  # linear attention's kernel rows at one sequence of these lengths
D_GRID = (16, 24, 32, 40, 48, 64, 96, 128, 192, 200, 256, 384, 512)  # 24, 40 and 200: widths no tile divides
INTERVAL_QUANTILE = 0.95  # the interval's half-width: this quantile of the held-out rows' interval_widths
MIN_GENERATOR_ROWS = 60  # a generator's rows set an interval of their own from this many (a lease's 20 × 3 shapes)
CV_FOLDS = 5


class CalibrationError(ProfileError):
    """Calibration cannot run here (no GPU, or a GPU the profile does not describe)."""


# ---------------------------------------------------------------------------------------------
# Random architectures over the whole space family


def _heads_for(d: int, max_heads: int = 16) -> list[int]:
    """Head counts 1-``max_heads`` the kernels run at ``d``: dividing d, head dim even and ≤ 128."""
    return [h for h in range(1, max_heads + 1) if d % h == 0 and padded_head_dim(d // h) is not None]


MLP_RATIOS = (0.0, 1.0, 1.5, 2.0, 3.0, 4.0)
SHORT_CONVS = (0, 2, 3, 4, 8)
CONV_WIDTHS = (2, 3, 4, 8, 12, 16)  # the kernel grid's conv widths, cycled over D_GRID


@dataclass(frozen=True)
class FitRanges:
    """What ``random_arch`` draws from: depth, width (a multiple of ``d_step`` in ``d_min``-512,
    uniform or, with ``log_width``, log-uniform), head counts up to ``max_heads``, vocabulary
    (log-uniform over ``vocab``), MLP ratios (``ratios``; with ``free_ratios`` also any ratio in
    0.25-8) and short-conv widths."""

    depth: tuple[int, int]
    d_step: int
    d_min: int
    max_heads: int
    vocab: tuple[int, int]
    free_ratios: bool
    convs: tuple[int, ...]
    log_width: bool = False


# the calibration's generator: every width in steps of 8 from 16, log-uniform (small widths are
# launch-bound, where the H100's held-out misses were: predictor_rows_h100_lease5.json), every head
# count a width allows (head dim even, ≤ 128), depth 1-12, vocabularies from 32 to GPT-2's 50257,
# MLP ratios anywhere in 0.25-8 and every conv width, so a fit carries to what a user's YAML can produce
FIT_RANGES = FitRanges(
    depth=(1, 12),
    d_step=8,
    d_min=16,
    max_heads=32,
    vocab=(32, 50257),
    free_ratios=True,
    convs=(0, *range(2, 17)),
    log_width=True,
)
# the first calibrations' narrower generator: the shipped H200 rows (benchmarks/results/
# predictor_rows_h200.json) and the model_vs_compile benchmark's architectures are its draws
FIT_RANGES_V1 = FitRanges(
    depth=(1, 8), d_step=16, d_min=32, max_heads=16, vocab=(64, 8192), free_ratios=False, convs=SHORT_CONVS
)


def _ratio(rng: random.Random, ranges: FitRanges, mlp_only: bool) -> float:
    if ranges.free_ratios and rng.random() < 0.5:
        return round(rng.uniform(0.25, 8.0), 2)
    return rng.choice(MLP_RATIOS[1:] if mlp_only else MLP_RATIOS)


def _layer(rng: random.Random, d: int, ranges: FitRanges) -> LayerSpec:
    mixer = rng.choice(("attention", "linear_attention", "none"))
    ratio = _ratio(rng, ranges, mlp_only=mixer == "none")
    return LayerSpec(
        mixer=mixer,
        heads=rng.choice(_heads_for(d, ranges.max_heads)) if mixer != "none" else 0,
        feature_map=rng.choice(FEATURE_MAPS) if mixer == "linear_attention" else None,
        short_conv=rng.choice(ranges.convs) if mixer != "none" else 0,
        mlp_ratio=ratio,
        activation=rng.choice(ACTIVATIONS),
        norm=rng.choice(NORMS),
    )


def _vocab(rng: random.Random, ranges: FitRanges) -> int:
    lo, hi = ranges.vocab
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _width(rng: random.Random, ranges: FitRanges) -> int:
    if not ranges.log_width:
        return rng.randrange(ranges.d_min, 513, ranges.d_step)
    d = math.exp(rng.uniform(math.log(ranges.d_min), math.log(512)))
    return min(512, max(ranges.d_min, ranges.d_step * round(d / ranges.d_step)))


def random_arch(rng: random.Random, ranges: FitRanges = FIT_RANGES) -> ArchSpec:
    """The fit's generator: a width, a depth, and per layer every mixer, head count, feature map,
    short conv, MLP ratio, activation and norm drawn afresh (``ranges``); a vocabulary and a
    readout (token or last)."""
    d = _width(rng, ranges)
    layers = tuple(_layer(rng, d, ranges) for _ in range(rng.randint(*ranges.depth)))
    vocab = _vocab(rng, ranges)
    return ArchSpec(d, layers, vocab, vocab, rng.choice(("token", "last")))


def stacked_arch(rng: random.Random, ranges: FitRanges = FIT_RANGES) -> ArchSpec:
    """The check set's generator, unlike the fit's: one block (``random_arch``'s layer draw)
    repeated to the depth, as most hand-written and searched models are built."""
    d = _width(rng, ranges)
    block = _layer(rng, d, ranges)
    vocab = _vocab(rng, ranges)
    return ArchSpec(d, (block,) * rng.randint(*ranges.depth), vocab, vocab, rng.choice(("token", "last")))


# head-count lists a space's author writes; the widths offered are the multiples of 8 in 16-512
# that every count divides with an even head dim of at most 128
HEAD_LISTS = ((1,), (2,), (4,), (1, 2), (2, 4), (4, 8), (2, 4, 8), (8, 16), (3, 6), (6, 12), (5, 10), (12,), (16,))


def _any_task(rng: random.Random) -> SimpleNamespace:
    """What ``SearchSpace.sample`` reads of a task: a vocabulary log-uniform over 32-50257 (GPT-2's)
    and either readout."""
    vocab = int(round(math.exp(rng.uniform(math.log(32), math.log(50257)))))
    return SimpleNamespace(vocab_size=vocab, n_out=vocab, readout=rng.choice(("token", "last")))


def _candidate(space: Any, rng: random.Random, task: SimpleNamespace) -> ArchSpec:
    """One candidate of ``space`` drawn by Optuna's random sampler (seeded from ``rng``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=rng.randrange(2**31)))
    return space.sample(study.ask(), task).arch


def space_arch(rng: random.Random) -> ArchSpec:
    """A search space as a user's YAML writes one — a depth range within 1-12, one to three
    widths, a subset of mixers, feature maps, convs, MLP ratios, activations and norms, head
    counts from ``HEAD_LISTS`` — validated by ``nas.space.parse_space``, then one candidate drawn
    from it (``_candidate``) for any task (``_any_task``). Unlike ``random_arch`` its stacks are
    uniform in what the space leaves out, all-MLP ones included."""
    from nas.space import parse_space

    heads = rng.choice(HEAD_LISTS)
    unit = 2 * math.lcm(*heads)
    widths = [d for d in range(16, 513, 8) if d % unit == 0 and d // min(heads) <= 128]
    lo = rng.randint(1, 12)
    mixers = rng.sample(("attention", "linear_attention", "none"), rng.randint(1, 3))

    def some(values: tuple) -> list:
        return sorted(rng.sample(values, rng.randint(1, len(values))), key=values.index)

    ratios = some((0.0, 1.0, 2.0, 3.0, 4.0)) if mixers != ["none"] else some((1.0, 2.0, 4.0))
    raw = {
        "depth": {"low": lo, "high": rng.randint(lo, 12)},
        "d_model": sorted(rng.sample(widths, min(len(widths), rng.randint(1, 3)))),
        "layer": {
            "mixer": mixers,
            "heads": list(heads),
            "feature_map": some(("identity", "elu+1", "relu")),
            "short_conv": some((0, 2, 3, 4, 8)),
            "mlp_ratio": ratios,
            "activation": some(("gelu", "relu", "silu")),
            "norm": some(("layernorm", "rmsnorm")),
        },
        "train": {"optimizer": ["adamw"], "lr": [1e-3], "steps": [100], "batch_size": [8]},
    }
    space = parse_space(raw, "drawn space")
    return _candidate(space, rng, _any_task(rng))


def space_archs(seed: int, n: int) -> list[ArchSpec]:
    rng = random.Random(seed)
    return [space_arch(rng) for _ in range(n)]


def preset_arch(rng: random.Random) -> ArchSpec:
    """A candidate of one of the shipped search spaces (``search_spaces/*.yaml``, the spaces a user
    searches first), for any task (``_any_task``): a generator neither fit draw uses."""
    from nas.space import list_spaces, load_space

    return _candidate(load_space(rng.choice(list_spaces())), rng, _any_task(rng))


def preset_archs(seed: int, n: int) -> list[ArchSpec]:
    rng = random.Random(seed)
    return [preset_arch(rng) for _ in range(n)]


def fit_draws(seed: int, n: int) -> list[ArchSpec]:
    """The fit set's architectures: ``random_arch`` and ``space_arch`` draws in turn from one
    generator. Either alone misses what the other draws: per-layer random stacks almost never
    repeat one block or leave every mixer out, which a user's space does all the time; the H100's
    misses were those stacks (benchmarks/results/predictor_rows_h100_lease4.json, ``held_out_report``)."""
    rng = random.Random(seed)
    return [random_arch(rng) if i % 2 == 0 else space_arch(rng) for i in range(n)]


def random_archs(seed: int, n: int, ranges: FitRanges = FIT_RANGES) -> list[ArchSpec]:
    rng = random.Random(seed)
    return [random_arch(rng, ranges) for _ in range(n)]


def stacked_archs(seed: int, n: int, ranges: FitRanges = FIT_RANGES) -> list[ArchSpec]:
    rng = random.Random(seed)
    return [stacked_arch(rng, ranges) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# The kernel grid


@dataclass(frozen=True)
class KernelCase:
    """One isolated kernel to time: its family and arguments (``run`` builds it on the GPU) and
    its launch features (``launch``, computed on the CPU)."""

    family: str
    args: tuple[tuple[str, Any], ...]

    @property
    def kw(self) -> dict[str, Any]:
        return dict(self.args)

    def launch(self, sm_count: int) -> Launch:
        from . import _launches as L

        a = self.kw
        if self.family == "linear":
            return L._linear(
                "linear",
                a["M"],
                a["N"],
                a["K"],
                sm_count,
                activation=a["activation"],
                residual=a["residual"],
                norm=a.get("norm", False),
            )
        if self.family == "attention":
            return L._attention("attention", a["B"], a["T"], a["H"], a["D"], sm_count)
        if self.family == "linear_attention":
            return L._linear_attention("linear_attention", a["B"], a["T"], a["H"], a["D"], a["feature_map"], sm_count)
        if self.family == "norm":
            return L._norm("norm", a["kind"], a["rows"], a["d"], sm_count)
        if self.family == "conv":
            return L._conv("conv", a["B"], a["T"], a["C"], a["width"], sm_count)
        if self.family == "embed":
            return L.Launch("embed", "embed", (1.0, (a["M"] * 8 + 2 * a["M"] * a["d"]) * 2e-6))
        raise ValueError(f"unknown kernel family {self.family!r}")


def _case(family: str, **kw: Any) -> KernelCase:
    return KernelCase(family, tuple(sorted(kw.items())))


def kernel_grid() -> list[KernelCase]:
    """Every kernel family at the shapes it takes in random architectures (see the module docstring)."""
    from kernels.linear import configs

    cases: list[KernelCase] = []
    acts = ("gelu", "relu", "silu")

    def normed(M: int, N: int, K: int, activation: str | None) -> KernelCase:
        # a linear the model runs after a norm (q/k/v, MLP up, readout), launched as the model
        # launches it: the norm summed in the fused kernel where ``norm_in_kernel`` says so (the
        # norm's own launch before the route elsewhere is timed with the norms below)
        if configs.norm_in_kernel((9, 0), configs.m_bucket(M), N, K, activation):
            return _case("linear", M=M, N=N, K=K, activation=activation, residual=False, norm=True)
        return _case("linear", M=M, N=N, K=K, activation=activation, residual=False)

    for shape in SHAPES:
        M = shape.tokens
        for i, d in enumerate(D_GRID):
            cases += [normed(M, 3 * d, d, None), _case("linear", M=M, N=d, K=d, activation=None, residual=True)]
            for j, ratio in enumerate((1, 2, 4)):
                cases += [
                    normed(M, ratio * d, d, acts[(i + j) % 3]),
                    _case("linear", M=M, N=d, K=ratio * d, activation=None, residual=True),
                ]
            # an activation and a residual in one launch: no forward has it, but without it the
            # fused kernel's wave count and its epilogue features are collinear (each short-K
            # launch would carry exactly one epilogue term once the plain ones go to cuBLAS)
            cases.append(_case("linear", M=M, N=2 * d, K=d, activation=acts[i % 3], residual=True))
            if M > 8192 and d > configs.SHORT_K_MAX:  # the TMA kernel's only shapes (long K, N >= K): every epilogue
                cases += [
                    _case("linear", M=M, N=ratio * d, K=d, activation=act, residual=act == "relu")
                    for ratio in (1, 2, 4)
                    for act in acts
                ]
            # the readout's vocab from 32 (one partial tile) to GPT-2's 50257 (many waves), its
            # outputs padded as the model pads them
            for vocab in map(configs.padded_features, (32, 64, 1001, 8192, 50257) + ((3001, 5003) if d > 256 else ())):
                cases += [normed(M, vocab, d, None), normed(shape.batch, vocab, d, None)]
            cases.append(
                _case("conv", B=shape.batch, T=shape.seq_len, C=3 * d, width=CONV_WIDTHS[i % len(CONV_WIDTHS)])
            )
            cases.append(_case("embed", M=M, d=d, vocab=8192))
        for D in (16, 32, 64, 128):
            for H in (1, 2, 4, 8, 16, 32):
                if H * D > 512:
                    continue
                cases.append(_case("attention", B=shape.batch, T=shape.seq_len, H=H, D=D))
                for fm in FEATURE_MAPS:
                    cases.append(_case("linear_attention", B=shape.batch, T=shape.seq_len, H=H, D=D, feature_map=fm))
    # long rows with few heads (a prefill at --context N): where the maps take the two passes
    # (kernels.linear_attention.configs.forward_route); the short rows above take the prefix forward
    for T in LONG_LENGTHS:
        for D in (32, 64, 128):
            for H in (1, 4, 16):
                for fm in ("identity", "elu+1"):
                    cases.append(_case("linear_attention", B=1, T=T, H=H, D=D, feature_map=fm))
    # the identity map over full grids (B·H ≥ 128 over ≥ 2048 tokens): the two passes with many
    # programs per SM, which no shape above reaches
    for D in (32, 64):
        for B, H, T in ((8, 16, 2048), (32, 8, 2048), (16, 16, 4096)):
            cases.append(_case("linear_attention", B=B, T=T, H=H, D=D, feature_map="identity"))
    cases += _unaligned_linears()
    for kind in NORMS:
        for d in D_GRID:
            for rows in (1, 8, 32, 256, 8192, 16384):
                cases.append(_case("norm", kind=kind, rows=rows, d=d))
    return cases


# residual widths the model cannot pad (the norms read d): K % 16 = 8 (40, 72, 200, 264), whose
# linears go to cuBLAS (a norm before them as a launch of its own), and K % 8 ≠ 0 (36, 100, 180),
# whose rows are not 16-byte aligned and stay on the fused kernel, off its vector loads and stores
UNALIGNED_WIDTHS = (40, 72, 200, 264)
ODD_WIDTHS = (36, 100, 180)


def _unaligned_linears() -> list[KernelCase]:
    """Every linear a forward launches at a residual width d not a multiple of 16, at each
    shape: the normed qkv and MLP up (K = d), the out and MLP down projections (N = d, with the
    residual) and the readout at the batch's rows (the small-M tile); the widths they pair d
    with are padded as the model pads them (``padded_features``)."""
    from kernels.linear.configs import padded_features

    cases: list[KernelCase] = []
    acts = ("gelu", "relu", "silu")
    for shape in SHAPES:
        M = shape.tokens
        for i, d in enumerate(UNALIGNED_WIDTHS + ODD_WIDTHS):
            hidden = padded_features(round(d * (1.5, 2.7, 4)[i % 3]))
            cases += [
                _case("linear", M=M, N=3 * 64, K=d, activation=None, residual=False, norm=True),
                _case("linear", M=M, N=hidden, K=d, activation=acts[i % 3], residual=False, norm=True),
                _case("linear", M=M, N=d, K=64 * (1 + i % 4), activation=None, residual=True),
                _case("linear", M=M, N=d, K=hidden, activation=None, residual=True),
                _case(
                    "linear", M=shape.batch, N=padded_features(1001 + 1000 * i), K=d, activation=None, residual=False
                ),
            ]
        # K % 16 = 8 on the fused kernel: no forward launches it (the model pads N, so cuBLAS takes
        # these rows), but without it the K % 16 and K % 8 features, which a residual width off a
        # multiple of 8 carries together, are collinear
        for rows in (M, shape.batch):
            cases += [_case("linear", M=rows, N=1001, K=d, activation=None, residual=False) for d in UNALIGNED_WIDTHS]
    return cases


def _kernel_fn(case: KernelCase, device: str = CUDA) -> Callable[[], object]:
    """A zero-argument callable launching ``case``'s kernel on fresh random inputs (bf16) on
    ``device`` (CPU only under ``TRITON_INTERPRET=1``, for tests)."""
    import torch

    from kernels.attention.triton import flash_attention_qkv
    from kernels.conv import causal_depthwise_conv
    from kernels.linear import linear
    from kernels.linear_attention.triton import linear_attention_qkv
    from kernels.norm import layer_norm, rms_norm
    from nas.models.mixers import rope_tables

    a, dev, bf = case.kw, device, torch.bfloat16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf)

    if case.family == "linear":
        x, w, b = rand(a["M"], a["K"]), rand(a["N"], a["K"]) * a["K"] ** -0.5, rand(a["N"])
        r = rand(a["M"], a["N"]) if a["residual"] else None
        if a.get("norm"):  # the norm folded into the linear, as TritonModel runs it (LayerNorm: the weight's sums)
            sums = w.float().sum(1)
            return lambda: linear(x, w, b, activation=a["activation"], norm="layernorm", weight_sums=sums)
        return lambda: linear(x, w, b, activation=a["activation"], residual=r)
    if case.family in ("attention", "linear_attention"):
        B, T, H, D = a["B"], a["T"], a["H"], a["D"]
        qkv = rand(B, T, 3 * H * D)
        if case.family == "attention":
            cos, sin = rope_tables(max(256, T), D, device=torch.device(dev), dtype=torch.float32)
            return lambda: flash_attention_qkv(qkv, H, causal=True, scale=D**-0.5, rope=(cos, sin))
        return lambda: linear_attention_qkv(qkv, H, feature_map=a["feature_map"])
    if case.family == "norm":
        x, w, b = rand(a["rows"], a["d"]), rand(a["d"]), rand(a["d"])
        return (lambda: layer_norm(x, w, b, 1e-5)) if a["kind"] == "layernorm" else (lambda: rms_norm(x, w, 1e-5))
    if case.family == "conv":
        x, w, b = rand(a["B"], a["T"], a["C"]), rand(a["C"], a["width"]), rand(a["C"])
        return lambda: causal_depthwise_conv(x, w, b)
    if case.family == "embed":
        table = rand(a["vocab"], a["d"])
        ids = torch.randint(0, a["vocab"], (a["M"],), device=dev)
        return lambda: torch.nn.functional.embedding(ids, table)
    raise ValueError(f"unknown kernel family {case.family!r}")


def graph_us(fn: Callable[[], object], *, calls: int = 20, reps: int = 15) -> float:
    """Median µs per call of ``fn`` captured ``calls`` times back to back in one CUDA graph (so the
    per-launch gap of graph replay is included, as in a captured forward)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile, autotune
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


# ---------------------------------------------------------------------------------------------
# Parallel compile warm-up


def _warm_chunk(tasks: list[tuple[str, Any]]) -> int:
    """Worker process: run each task once (compiles and autotunes into Triton's disk cache)."""
    import torch

    failed = 0
    for kind, payload in tasks:
        try:
            if kind == "kernel":
                _kernel_fn(payload)()
            else:
                from nas.models import build, to_triton

                arch, shape = ArchSpec.from_dict(payload[0]), parse_shape(payload[1])
                tm = to_triton(build(arch, seed=0).cuda())
                tm(torch.randint(0, arch.vocab_size, (shape.batch, shape.seq_len), device=CUDA))
        except Exception:  # noqa: BLE001 - the timed pass reports the error for this task
            failed += 1
    torch.cuda.synchronize()
    return failed


def warm(
    kernel_cases: Sequence[KernelCase], models: Sequence[tuple[ArchSpec, LatencyShape]], *, workers: int | None = None
) -> None:
    """Compile everything ``kernel_cases`` and ``models`` launch in ``workers`` processes, then drop
    the autotuners' cached timings (taken under contention) so the timing process tunes alone."""
    import concurrent.futures as cf
    import multiprocessing as mp

    tasks: list[tuple[str, Any]] = [("kernel", c) for c in kernel_cases]
    tasks += [("model", (a.to_dict(), str(s))) for a, s in models]
    workers = workers or max(1, min(12, (os.cpu_count() or 2) - 2))
    chunks = [tasks[i::workers] for i in range(workers)]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        failed = sum(pool.map(_warm_chunk, chunks))
    log.info("warm-up: %d tasks in %d processes, %d failed", len(tasks), workers, failed)
    _drop_autotune_cache()


def _drop_autotune_cache() -> None:
    from triton import knobs  # Triton's own resolution of TRITON_CACHE_DIR (3.4+)

    root = knobs.cache.dir
    for path in glob.glob(os.path.join(root, "*", "*.autotune.json")):
        os.unlink(path)


# ---------------------------------------------------------------------------------------------
# Timing


def time_kernels(
    cases: Iterable[KernelCase], *, on_row: Callable[[dict], None] | None = None, deadline: float = math.inf
) -> list[dict]:
    """``{"family", "args", "us"}`` (or ``"error"``) per case, timed with ``graph_us``."""
    import torch

    rows = []
    for case in cases:
        if time.monotonic() > deadline:
            break
        row: dict[str, Any] = {"family": case.family, "args": dict(case.args)}
        try:
            row["us"] = graph_us(_kernel_fn(case))
        except Exception as e:  # noqa: BLE001 - recorded, the fit uses the others
            row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        torch.cuda.empty_cache()
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def measure_models(
    models: Iterable[tuple[ArchSpec, LatencyShape]],
    *,
    on_row: Callable[[dict], None] | None = None,
    deadline: float = math.inf,
    reps: int = 20,
) -> list[dict]:
    """``{"arch", "shape", "ms", "iqr_ms"}`` (or ``"error"``) per model, by ``nas.latency.measure``
    with a private cache (every number here is fresh)."""
    from nas.models import build

    from ._measure import LatencyCache, measure

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = LatencyCache(Path(tmp) / "latency.json")
        for arch, shape in models:
            if time.monotonic() > deadline:
                break
            row: dict[str, Any] = {"arch": arch.to_dict(), "shape": str(shape)}
            try:
                lat = measure(build(arch, seed=0), shape, reps=reps, cache=cache)
                row.update(ms=lat.median_ms, iqr_ms=lat.iqr_ms)
            except Exception as e:  # noqa: BLE001 - a candidate the kernels refuse is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Fitting and checking (CPU)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(a) < 2:
        return math.nan
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else math.nan


def check_summary(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """Share within ±10 %, Spearman, median ratio, 95th percentile of |relative error|."""
    errors = relative_errors(predicted, measured)
    return {
        "n": len(errors),
        "within_10pct": sum(abs(e) <= 0.10 for e in errors) / len(errors) if errors else math.nan,
        "spearman": spearman(predicted, measured),
        "median_ratio": statistics.median(p / m for p, m in zip(predicted, measured, strict=True))
        if errors
        else math.nan,
        "p95_abs_error": quantile([abs(e) for e in errors], INTERVAL_QUANTILE),
    }


def _model_launches(row: dict, sm_count: int) -> list[Launch]:
    return launches(ArchSpec.from_dict(row["arch"]), parse_shape(row["shape"]), sm_count)


def _forward(row: dict, sm_count: int) -> tuple[list[Launch], int, float]:
    """A whole-model row as stage 2 takes it: launches, tokens, measured µs."""
    return _model_launches(row, sm_count), parse_shape(row["shape"]).tokens, row["ms"] * 1e3


def _per_shape(rows: Sequence[dict], predicted: Sequence[float]) -> dict[str, dict[str, float]]:
    """``check_summary`` over all rows and per shape (smallest first)."""
    measured = [r["ms"] for r in rows]
    out = {"all": check_summary(predicted, measured)}
    for shape in sorted({r["shape"] for r in rows}, key=lambda s: parse_shape(s).tokens):
        idx = [i for i, r in enumerate(rows) if r["shape"] == shape]
        out[shape] = check_summary([predicted[i] for i in idx], [measured[i] for i in idx])
    return out


def fit(
    kernel_rows: Sequence[dict],
    model_rows: Sequence[dict],
    check_rows: Sequence[dict] = (),
    *,
    sm_count: int,
    strength: float = DEFAULT_STRENGTH,
) -> tuple[KernelModel, dict[str, Any]]:
    """The kernel model from timing rows (``time_kernels`` / ``measure_models`` output; rows with
    an error are skipped; a whole-model row may carry ``run``, the GPU run it was measured in) and
    its held-out errors: ``cv`` (cross-validation over architectures), ``across_runs`` (each run
    predicted by the fit on the others, when there are several), ``check`` (``check_rows``, when
    given), each per shape and overall (``check_summary``); ``interval`` is the largest 95th
    percentile of the interval widths over one set of held-out residuals: the cross-validation and
    across-runs residuals of each generator's rows (a row's ``generator``; a generator with fewer
    than ``MIN_GENERATOR_ROWS`` rows counts with the untagged ones), and the check rows alone
    (``interval_by_generator`` lists them)."""
    prior = fit_kernels(
        (KernelCase(r["family"], tuple(sorted(r["args"].items()))).launch(sm_count), r["us"])
        for r in kernel_rows
        if "us" in r
    )
    good = [r for r in model_rows if "ms" in r and prior.covers(_model_launches(r, sm_count))]
    if len(good) < sum("ms" in r for r in model_rows):
        log.warning(
            "%d whole-model rows launch kernel classes the kernel grid did not time; left out of the fit",
            sum("ms" in r for r in model_rows) - len(good),
        )
    report: dict[str, Any] = {"fit_models": len(good), "kernel_rows": sum("us" in r for r in kernel_rows)}
    if not good:
        return prior, report
    forwards = [_forward(r, sm_count) for r in good]
    model = fit_forwards(prior, forwards, strength=strength)
    generators = [str(r.get("generator", "")) for r in good]
    sizes = {g: generators.count(g) for g in set(generators)}
    generators = [g if sizes[g] >= MIN_GENERATOR_ROWS else "" for g in generators]
    held_out: dict[str, list[float]] = {}  # per generator, the held-out errors of its rows
    archs = [json.dumps(r["arch"], sort_keys=True) for r in good]
    if len(set(archs)) >= CV_FOLDS:
        errors = cross_validate(prior, forwards, archs, folds=CV_FOLDS, strength=strength)
        report["cv"] = _per_shape(good, [r["ms"] * (1 + e) for r, e in zip(good, errors, strict=True)])
        for g, e in zip(generators, errors, strict=True):
            held_out.setdefault(g, []).append(e)
    runs = sorted({str(r.get("run", "")) for r in good})
    if len(runs) > 1:
        across = {}
        for run in runs:
            inside = [i for i, r in enumerate(good) if str(r.get("run", "")) == run]
            others = fit_forwards(
                prior, [f for f, r in zip(forwards, good, strict=True) if str(r.get("run", "")) != run]
            )
            errors = [others.forward_us(forwards[i][0], forwards[i][1]) / forwards[i][2] - 1 for i in inside]
            across[run] = _per_shape(
                [good[i] for i in inside], [good[i]["ms"] * (1 + e) for i, e in zip(inside, errors, strict=True)]
            )
            for i, e in zip(inside, errors, strict=True):
                held_out.setdefault(generators[i], []).append(e)
        report["across_runs"] = across
    # the interval spans the widest held-out set: each generator's rows (cross-validation, other
    # runs) and the check generator's on their own, which pooled with many more rows of an
    # easier generator would be outvoted where only they miss
    spans = {g or "pooled": quantile(interval_widths(e), INTERVAL_QUANTILE) for g, e in sorted(held_out.items())}
    check = [r for r in check_rows if "ms" in r and model.covers(_model_launches(r, sm_count))]
    if check:
        predicted = [model.forward_us(*_forward(r, sm_count)[:2]) / 1e3 for r in check]
        report["check"] = _per_shape(check, predicted)
        missed = relative_errors(predicted, [r["ms"] for r in check])
        spans["check"] = quantile(interval_widths(missed), INTERVAL_QUANTILE)
    if spans:
        report["interval_by_generator"] = spans
        report["interval"] = finite_interval(max(spans.values()))
    return model, report


# ---------------------------------------------------------------------------------------------
# Writing the profile


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def write_calibration(profile: HardwareProfile, section: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """The profile's YAML with ``section``'s keys written into its ``calibrated:`` section, to
    ``out``. Everything else is kept line for line, comments included: the lines before and after
    the section and, inside it, the entries (with their comments) of keys ``section`` does not set."""
    import re

    source = Path(profile.path).read_text() if profile.path else ""
    lines = source.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("calibrated:")), len(lines))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and lines[i][0] not in " \t#"), len(lines))
    kept: list[str] = []
    keep = False
    for line in lines[start + 1 : end]:
        key = re.match(r"^  ([A-Za-z_][A-Za-z0-9_]*):", line)
        if key:
            keep = key[1] not in section
        if keep or not (key or line.startswith("   ")):
            kept.append(line if keep or not line.strip() else "")
    body = yaml.safe_dump(section, sort_keys=False, default_flow_style=None, width=120)
    text = (
        "".join(lines[:start])
        + ("" if not lines[:start] or lines[start - 1].endswith("\n") else "\n")
        + "calibrated:\n"
        + "".join(kept)
        + "".join(f"  {line}\n" for line in body.splitlines())
        + "".join(lines[end:])
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    load_profile(str(out))  # what we wrote must load
    return out


def environment() -> dict[str, str]:
    """GPU name, driver, torch and triton versions, kernels fingerprint and today's date."""
    import torch
    import triton

    from ._measure import kernels_fingerprint

    driver = ""
    try:
        import subprocess

        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, ValueError):  # no nvidia-smi: the CUDA runtime's version instead
        driver = f"cuda {torch.version.cuda}"
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": str(torch.__version__),
        "triton": str(triton.__version__),
        "kernels_fingerprint": kernels_fingerprint(),
        "date": dt.date.today().isoformat(),
    }  # str(): torch's version is a str subclass yaml cannot write


def calibration_section(
    model: KernelModel, report: dict[str, Any], env: dict[str, str], sm_count: int
) -> dict[str, Any]:
    return {
        **env,
        "sm_count": sm_count,
        "interval": _round(report.get("interval")),
        # the held-out errors behind the interval: cross-validation over architectures, each GPU run
        # predicted by the fit on the others, the check set
        "check": {
            name: _round(report[key])
            for key, name in (("cv", "cross_validation"), ("across_runs", "across_runs"), ("check", "check_set"))
            if key in report
        },
        "kernel_model": model.to_dict(),
    }


def budget_cut(parts: dict[str, tuple[Sequence[Any], Sequence[dict]]]) -> dict[str, tuple[int, int]]:
    """Per part (planned items, timed rows): (how many the deadline left untimed, how many were
    planned), for the parts that lost any."""
    return {
        what: (len(planned) - len(rows), len(planned))
        for what, (planned, rows) in parts.items()
        if len(rows) < len(planned)
    }


def require_gpu(profile: HardwareProfile) -> int:
    """The SM count of the current GPU; CalibrationError unless there is one and ``profile`` lists it."""
    import torch

    from hardware_profiles import detect_profile

    if not torch.cuda.is_available():
        raise CalibrationError(
            "calibrate needs a CUDA GPU; this machine has none (predictions here use the shipped calibrations)"
        )
    name = torch.cuda.get_device_name()
    found = detect_profile(name)
    listed = any(" ".join(n.split()).casefold() == " ".join(name.split()).casefold() for n in profile.device_names)
    if not listed:
        raise CalibrationError(
            f"this GPU is {name!r}, which profile {profile.name!r} does not list "
            f"(device_names {list(profile.device_names)}); use --profile "
            f"{found.name if found else 'PATH of a profile listing it'}"
        )
    return sm_count(resolve(CUDA))


def calibrate(
    profile_name: str | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    fit_archs: int = 60,
    check_archs: int = 40,
    seed: int = 1,
    budget_s: float = 540.0,
    on_progress: Callable[[str], None] | None = None,
    rows_out: str | os.PathLike[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Time, fit, check and write (see the module docstring). ``profile_name``: a shipped name or a
    path; None detects the current GPU's. ``rows_out``: also write every timing row there (JSON:
    the GPU, versions, SM count, ``kernel_rows``, ``fit_rows``, ``check_rows``), so the fit can be
    redone or widened on any machine (``benchmarks/predictor.py --refit``). Returns the written
    path and the report."""
    from hardware_profiles import detect_profile

    say = on_progress or log.info
    if profile_name is None:
        import torch

        if not torch.cuda.is_available():
            raise CalibrationError("calibrate needs a CUDA GPU; this machine has none")
        profile = detect_profile()
        if profile is None:
            raise CalibrationError(
                f"no shipped profile lists this GPU ({torch.cuda.get_device_name()!r}); "
                f"pass --profile PATH of one that does"
            )
    else:
        profile = load_profile(profile_name)
    sm_count = require_gpu(profile)
    deadline = time.monotonic() + budget_s
    cases = kernel_grid()
    fit_set = [(a, s) for a in fit_draws(seed, fit_archs) for s in SHAPES]
    check_set = [(a, s) for a in stacked_archs(seed + 1000, check_archs) for s in SHAPES]
    say(f"compiling {len(cases)} kernels and {len(fit_set) + len(check_set)} forwards")
    warm(cases, fit_set + check_set)
    say("timing kernels")
    kernel_rows = time_kernels(cases, deadline=deadline)
    say("measuring the fit set")
    model_rows = measure_models(fit_set, deadline=deadline)
    say("measuring the check set")
    check_rows = measure_models(check_set, deadline=deadline + 60)
    env = environment()
    if rows_out is not None:
        run = f"{env['date']} {time.strftime('%H:%M:%S')}"
        data = {
            **env,
            "sm_count": sm_count,
            "seeds": {"fit": seed, "check": seed + 1000},
            "kernel_rows": kernel_rows,
            "fit_rows": [{**r, "run": run} for r in model_rows],
            "check_rows": [{**r, "run": run} for r in check_rows],
            "held_out_rows": [],
        }
        Path(rows_out).write_text(json.dumps(data, indent=1, default=str))
        say(f"timing rows written to {rows_out}")
    model, report = fit(kernel_rows, model_rows, check_rows, sm_count=sm_count)
    left_out = budget_cut(
        {
            "kernels": (cases, kernel_rows),
            "fit forwards": (fit_set, model_rows),
            "check forwards": (check_set, check_rows),
        }
    )
    if left_out:
        report["left_out"] = left_out
        say(
            f"the {budget_s:.0f} s budget left out "
            + ", ".join(f"{n} of {total} {what}" for what, (n, total) in left_out.items())
            + ": the fit used the rest (a larger --budget-s times them all)"
        )
    section = calibration_section(model, report, env, sm_count)
    path = write_calibration(profile, section, out or profile.path)
    return path, report
