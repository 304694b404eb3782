"""Measured decoding: one generated token of the candidate's ``TritonDecoder``, replayed from a
CUDA graph on the local GPU, at a context.

As ``measure`` does for the forward: the kernels are checked first — a torch prefill of a short
prompt, loaded into the decoder, then a few Triton steps against the torch model's own steps (a
wrong result or a compile failure raises a KernelError, which fails the trial) — then the step
is timed at the asked context on caches of random contents (the time of a step does not depend
on what the cache holds): warm-up, then ≥ 20 samples of ``STEPS_PER_SAMPLE`` replays each,
median and IQR, once more when the spread exceeds 2 %. Each replay advances the positions by
one, so a sample covers contexts N … N + STEPS_PER_SAMPLE − 1 (the positions are reset before
each sample; ≤ 0.8 % more rows than N at 1K, far less beyond). Weights stay in L2 between
replays when they fit, as they do between the steps of a real generation. Cached on disk like
the forward, keyed by arch, ``decode BxN``, dtype, GPU, versions and ``decode_fingerprint``.

An architecture stored below full precision (``kv_dtype``, ``state_dtype``, ``weight_dtype``) is
decoded as stored: its ``StoredDecoder`` (fp8 KV cache, bf16 state, fp8 weights on the precision
kernels) is checked against the torch model's steps at its stored precision and timed, keyed by
``stored_decode_fingerprint``; the latency prices its dtypes.
"""

from __future__ import annotations

import statistics

import torch

from kernels.device import CUDA, cuda_available, gpu_name, is_cuda, resolve
from kernels.errors import KernelMismatchError
from nas.spec import arch_hash

from ._measure import (
    FP8_WEIGHTS_MISMATCH_LIMIT,
    MISMATCH_LIMIT,
    SPREAD_LIMIT,
    LatencyCache,
    cache_key,
    decode_fingerprint,
    kernel_errors,
    stored_decode_fingerprint,
)
from ._result import Latency
from ._shape import LatencyShape

__all__ = ["CHECK_PROMPT", "CHECK_STEPS", "STEPS_PER_SAMPLE", "measure_decode"]

CHECK_PROMPT = 24  # tokens of the prompt the correctness check prefills
CHECK_STEPS = 4  # Triton steps compared with the torch model's
STEPS_PER_SAMPLE = 8


def measure_decode(
    model: torch.nn.Module,
    batch: int,
    context: int,
    *,
    device: torch.device | str | None = None,
    reps: int = 30,
    cache: LatencyCache | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Latency:
    """Latency of one decoding step of ``model`` (a token for each of ``batch`` sequences holding
    ``context`` tokens) on ``device`` (CUDA; None: the current one), ``kind`` "decode"."""
    import triton

    if not (cuda_available() and (device is None or is_cuda(device))):
        raise RuntimeError(f"measure_decode needs a CUDA device, got {device!r}; use predict_decode elsewhere")
    if model.arch.readout != "token":
        raise ValueError(f"readout {model.arch.readout!r} does not generate tokens: no decode latency")
    shape = LatencyShape(batch, context)
    device = resolve(device if device is not None else CUDA)
    reps = max(20, reps)
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    gpu = gpu_name(device)
    stored = not model.arch.full_precision
    fingerprint = stored_decode_fingerprint() if stored else decode_fingerprint()
    key = cache_key(
        arch_hash(model.arch), f"decode {shape}", dtype_name, gpu, torch.__version__, triton.__version__, fingerprint
    )
    cache = cache or LatencyCache()
    if (hit := cache.get(key)) is not None:
        return hit
    with torch.cuda.device(device):
        model = model.to(device).eval()
        with kernel_errors():
            decoder = _checked(model, batch, device, dtype)
            samples, notes = _timed(decoder, batch, context, device, reps)
    q1, median, q3 = statistics.quantiles(samples, n=4)
    latency = Latency(
        median,
        q3 - q1,
        "measured",
        gpu,
        dtype_name,
        shape,
        versions=(("torch", torch.__version__), ("triton", triton.__version__), ("kernels", fingerprint)),
        notes=tuple(notes),
        kind="decode",
    )
    cache.put(key, latency)
    return latency


def _checked(model: torch.nn.Module, batch: int, device: torch.device, dtype: torch.dtype):
    """A function making the model's decoder for a capacity (``StoredDecoder`` below full
    precision), once that decoder's steps match the torch model's, at the architecture's stored
    precision (KernelMismatchError if not)."""
    from functools import partial

    from nas.models.triton_decode import TritonDecoder
    from nas.models.triton_decode_stored import StoredDecoder
    from nas.models.triton_model import to_triton

    stored = not model.arch.full_precision
    gen = torch.Generator(device=device).manual_seed(0)
    vocab = model.arch.vocab_size
    prompt = torch.randint(0, vocab, (batch, CHECK_PROMPT), device=device, generator=gen)
    steps = torch.randint(0, vocab, (CHECK_STEPS, batch), device=device, generator=gen)
    # fp8 weights quantize the normalized rows, as the torch model does: the norms stay unfolded
    # (a decode step runs each norm as its own launch either way)
    decoder = partial(StoredDecoder if stored else TritonDecoder, to_triton(model, dtype=dtype, fold_norms=not stored))
    check = decoder(batch, CHECK_PROMPT + CHECK_STEPS)
    fp8_weights = any(layer.weight_dtype == "fp8" for layer in model.arch.layers)
    limit = FP8_WEIGHTS_MISMATCH_LIMIT if fp8_weights else MISMATCH_LIMIT
    was = model.at_stored_precision
    model.stored_precision(stored)
    try:
        with torch.no_grad(), torch.autocast(CUDA, dtype=dtype):
            _, state = model.prefill(prompt, capacity=CHECK_PROMPT + CHECK_STEPS)
            check.load(state)
            for t in range(CHECK_STEPS):
                expected = model.step(steps[t], state).float()
                got = check.step(steps[t]).float()
                err = ((got - expected).norm() / expected.norm().clamp(min=1e-12)).item()
                if not err <= limit:
                    raise KernelMismatchError(
                        f"triton decode step {t} differs from the torch model: relative error {err:.2e} > {limit:.0e}"
                    )
    finally:
        model.stored_precision(was)
    return decoder


def _timed(make, batch: int, context: int, device: torch.device, reps: int) -> tuple[list[float], list]:
    """ms per step: samples of STEPS_PER_SAMPLE graph replays, positions reset to ``context`` before
    each (``make(batch, capacity)``: the decoder)."""
    decoder = make(batch, context + STEPS_PER_SAMPLE + 1)
    gen = torch.Generator(device=device).manual_seed(1)
    decoder.fill_random(context, generator=gen)
    tokens = torch.randint(0, decoder.tmodel.arch.vocab_size, (batch,), device=device, generator=gen)
    replay = decoder.capture(tokens)
    notes: list[tuple[str, str]] = []
    for attempt in range(2):
        samples = []
        for i in range(reps + 3):  # three warm-up samples
            decoder.seek(context)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(STEPS_PER_SAMPLE):
                replay()
            end.record()
            end.synchronize()
            if i >= 3:
                samples.append(start.elapsed_time(end) / STEPS_PER_SAMPLE)
        q1, median, q3 = statistics.quantiles(samples, n=4)
        spread = (q3 - q1) / median
        if spread <= SPREAD_LIMIT:
            break
        notes.append((f"spread_attempt_{attempt + 1}", f"{spread:.1%}"))
    if notes:
        notes.append(("remeasured", "yes"))
    return samples, notes
