"""Measured latency: the candidate's TritonModel replayed from a CUDA graph on the local GPU.

``measure`` checks the kernels against the torch model first (a wrong result or a compile
failure raises a KernelError, which fails the trial), then times graph replays with CUDA events:
warm-up, then ≥ 20 timed replays, median and IQR; if the spread (IQR / median) exceeds 2% the
whole measurement is taken once more and the note records it. For a small model one replay runs
the forward over several input copies whose activations together exceed the L2, so each forward
starts cold, and the time is divided by the copies. Results are cached on disk by what
determines them: (arch_hash, shape, dtype, GPU name, torch, triton) — tinygrad's rule — and
the kernels' own code: a fingerprint of the sources under ``kernels/`` (kernels and their
configs) and of ``nas/models/triton_model.py``, so upgrading this library re-measures instead
of serving latencies of kernels that no longer exist.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import statistics
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from kernels.device import CUDA, cuda_available, gpu_name, is_cuda, l2_bytes, resolve
from kernels.errors import KernelCompileError, KernelError, KernelLaunchError, KernelMismatchError
from nas import settings
from nas.latency._memory import memory
from nas.latency._result import Latency, unpriced_precision
from nas.latency._shape import LatencyShape
from nas.spec import arch_hash

__all__ = [
    "LatencyCache",
    "SPREAD_LIMIT",
    "cache_key",
    "decode_fingerprint",
    "kernels_fingerprint",
    "measure",
    "source_fingerprint",
    "stored_decode_fingerprint",
]

SPREAD_LIMIT = 0.02  # IQR / median above this → measure again once
MISMATCH_LIMIT = 3e-2  # relative Frobenius error of bf16 kernels vs the torch model under autocast
# the same with fp8 weights: each linear's inputs are rounded to 1 part in 16, and an input that the kernels'
# bf16 and the torch model's autocast leave on either side of an fp8 midpoint moves by that; on a CPU emulation
# of the step (a bf16 copy of the model against the model under autocast) this doubled the gap
FP8_WEIGHTS_MISMATCH_LIMIT = 2 * MISMATCH_LIMIT
MAX_COPIES = 16


def cache_key(
    arch_hash_: str,
    shape: LatencyShape,
    dtype: str,
    gpu: str,
    torch_version: str,
    triton_version: str,
    kernels: str = "",
) -> str:
    return "|".join((arch_hash_, str(shape), dtype, gpu, torch_version, triton_version, kernels))


def _canonical(node: object) -> str:
    """An AST as text that does not depend on the Python version that parsed it: node names and
    their fields, leaving out empty ones (3.12 added ``type_params=[]`` to every function, for
    one), never line numbers."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_canonical(v) for v in node)}]"
    return repr(node)


# Decode-only code beside the forward's, by file: top-level functions, classes and assignments a
# forward never runs. A measured or calibrated forward latency does not depend on them, so they
# are left out of its fingerprint (work on decoding must not invalidate forward calibrations).
DECODE_ONLY: dict[str, frozenset[str]] = {
    "kernels/linear_attention/triton.py": frozenset(
        {"_step_kernel", "linear_attention_step", "_step_tickets", "step_config", "StepConfig"}
    ),
    "kernels/linear_attention/configs.py": frozenset(
        {
            "StepConfig",
            "STEP",
            "INTERPRETER_STEP",
            "step_config",
            "STEP_BLOCK_V",
            "STEP_PROGRAMS_PER_SM",
            "step_configs",
            "_step_warps",
        }
    ),
    "kernels/attention/configs.py": frozenset(
        {
            "DecodeConfig",
            "DECODE_HOPPER",
            "DECODE_DEFAULT",
            "DECODE_INTERPRETER",
            "DECODE_INTERPRETER_SPLIT_ROWS",
            "DECODE_PROGRAMS_PER_SM",
            "DECODE_MIN_SLICE",
            "DECODE_LONG_SLICE",
            "DECODE_MAX_SHARED",
            "DECODE_MANY_HEADS",
            "DECODE_MAX_SPLITS",
            "_DECODE_BY_CAPABILITY",
            "_decode_splits",
            "decode_config",
            "decode_configs",
            "fit_decode_shared",
            "decode_shared_budget",
        }
    ),
    "kernels/attention/reference.py": frozenset({"rope_at", "decode_attention_ref"}),
    "kernels/linear/configs.py": frozenset(
        {"RowsConfig", "ROWS_PROGRAMS_PER_SM", "ROWS_MIN_SLICE", "ROWS_TILE", "INTERPRETER_ROWS", "rows_config"}
    ),
    "kernels/conv/configs.py": frozenset({"STEP_BLOCK_C", "STEP_NUM_WARPS", "INTERPRETER_STEP_BLOCK_C"}),
    "kernels/conv/reference.py": frozenset({"causal_conv_step_ref"}),
}
# Code no timed call runs, forward or decode: what the autotuner chose, read back for benchmarks'
# reports. Left out of both fingerprints (fixing a report must not invalidate calibrations).
REPORT_ONLY: dict[str, frozenset[str]] = {
    "kernels/attention/triton.py": frozenset({"last_tuned_config"}),
    "kernels/linear/triton.py": frozenset({"last_tuned_config"}),
    "kernels/linear_attention/triton.py": frozenset({"last_tuned_config"}),
}
# Forward-only code beside the decode step's, by file: the chunked linear-attention forward's
# routes (fused, two passes, prefix) and their launch rules. A measured decode step runs only the
# step kernels (its cache filled by the torch model or at random, ``_measure_decode``), so these
# are left out of the decode fingerprint (work on the forward must not invalidate decode
# calibrations); a test checks that no decode-timed function names them.
FORWARD_ONLY: dict[str, frozenset[str]] = {
    # The launch keywords after a library kernel, and the linear's cuBLAS route that uses them
    # (the decoder's linears are ``linear_rows``, kernels/linear/decode.py).
    "kernels/_common.py": frozenset({"after_library"}),
    "kernels/linear/triton.py": frozenset({"after_library", "_cublas_route"}),
    # The fused kernel's and cuBLAS's route rules, the norm's fold among them (the decoder's
    # ``linear_rows`` reads only ``rows_config``).
    "kernels/linear/configs.py": frozenset(
        {
            "prefers_tma",
            "CUBLAS_MIN_N",
            "CUBLAS_GELU_MIN_OUTPUT",
            "NORM_FUSED_MAX_K",
            "NORM_FUSED_MAX_X",
            "NORM_FUSED_WIDE_N",
            "_wide_readout",
            "fuses_norm",
            "prefers_cublas",
            "norm_in_kernel",
        }
    ),
    "kernels/linear_attention/triton.py": frozenset(
        {
            "_two_pass_states_kernel",
            "_walkable",
            "_two_pass_carry_kernel",
            "_two_pass_out_kernel",
            "_capped",
            "two_pass_plan",
            "_state_dtype",
            "_total_row",
            "_two_pass_states",
            "_two_pass_out",
            "_two_pass",
            "_prefix",
            "ROUTES",
            "_routes",
            "set_route",
            "last_route",
            "linear_attention",
            "linear_attention_qkv",
            "CARRY_BLOCK_G",
            "CARRY_TILE",
            "PrefixConfig",
            "TwoPassConfig",
            "TwoPassPlan",
            "forward_route",
            "prefers_two_pass",
            "prefix_config",
            "two_pass_config",
            "configs_two_pass_plan",
        }
    ),
    "kernels/linear_attention/configs.py": frozenset(
        {
            "__all__",
            "PrefixConfig",
            "PREFIX_HOPPER",
            "PREFIX_INTERPRETER",
            "prefix_config_for",
            "prefix_config",
            "PREFIX_IDENTITY",
            "PREFIX_NORMALIZED",
            "prefers_prefix",
            "forward_route",
            "TwoPassConfig",
            "TWO_PASS_HOPPER",
            "prefers_two_pass",
            "TWO_PASS_INTERPRETER",
            "TWO_PASS_GROUP_BELOW",
            "TWO_PASS_ONE_GROUP_UP_TO",
            "TWO_PASS_STATE_PROGRAMS_PER_SM",
            "TWO_PASS_DEEP_STAGES",
            "TWO_PASS_DEEP_UP_TO",
            "CARRY_TILE",
            "CARRY_BLOCK_G",
            "two_pass_group",
            "TwoPassPlan",
            "two_pass_plan",
            "two_pass_states_stages",
            "two_pass_config",
        }
    ),
}
# Whole files a forward never imports: the decode kernels over a KV cache and the conv step.
DECODE_ONLY_FILES = frozenset({"kernels/attention/decode.py", "kernels/conv/decode.py", "kernels/linear/decode.py"})
# Code no latency measurement runs: the optimizer steps train candidates. Left out of both
# fingerprints, so a change to them keeps every calibration valid.
TRAINING_ONLY_DIRS = ("kernels/optim/",)
# Kernels of the stored precisions (``precision:`` fields): only a decode step at a stored
# precision runs them (``StoredDecoder``, keyed by ``stored_decode_fingerprint``). Left out of the
# full-precision fingerprints (a test checks no file those cover imports them), so changing them
# keeps the bf16/fp32 calibrations valid.
PRECISION_ONLY_FILES = frozenset(
    {
        "kernels/_fp8.py",
        "kernels/attention/decode_fp8.py",
        "kernels/linear/fp8.py",
        "kernels/linear_attention/step_bf16.py",
    }
)


def _timed(rel: str) -> bool:
    return not rel.startswith(TRAINING_ONLY_DIRS) and rel not in PRECISION_ONLY_FILES


def _decode_only(node: ast.stmt, names: frozenset[str]) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name in names
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return bool(targets) and all(isinstance(t, ast.Name) and t.id in names for t in targets)


# One parse at a time: CPython 3.11's AST constructor can raise a spurious SystemError ("recursion
# depth mismatch", python/cpython#106905) when threads parse at once, as a study's first trials do.
_PARSE_LOCK = threading.Lock()


def _code_of(path: Path, skip: frozenset[str] = frozenset()) -> bytes:
    """What a file's code does, without what only reads differently: its AST (no line numbers,
    comments or formatting) with docstrings and the top-level definitions named in ``skip``
    removed, in a form every Python 3.11+ writes alike; the bytes for a file that does not parse."""
    source = path.read_bytes()
    try:
        with _PARSE_LOCK:
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    tree.body = [node for node in tree.body if not _decode_only(node, skip)]
    for node in tree.body:  # and the decode-only names a forward module imports
        if isinstance(node, ast.ImportFrom):
            node.names = [a for a in node.names if (a.asname or a.name) not in skip]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return _canonical(tree).encode()


def source_fingerprint(files: Iterable[Path], root: Path) -> str:
    """12 hex digits of SHA-256 over the files' paths (relative to ``root``) and code
    (``_code_of``: a reformat, a comment, a docstring, ``DECODE_ONLY`` or ``REPORT_ONLY`` code does
    not change it), in path order; ``DECODE_ONLY_FILES`` and ``TRAINING_ONLY_DIRS`` are left out whole."""
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if rel in DECODE_ONLY_FILES or not _timed(rel):
            continue
        skip = DECODE_ONLY.get(rel, frozenset()) | REPORT_ONLY.get(rel, frozenset())
        digest.update(rel.encode() + b"\0" + _code_of(path, skip) + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def kernels_fingerprint() -> str:
    """The fingerprint of the code a measured latency times: ``kernels/**/*.py`` but the
    training-only ones, and ``nas/models/triton_model.py`` (computed once per process)."""
    import kernels
    import nas.models.triton_model as triton_model

    root = Path(kernels.__file__).resolve().parent.parent
    files = [*Path(kernels.__file__).resolve().parent.rglob("*.py"), Path(triton_model.__file__).resolve()]
    return source_fingerprint(files, root)


@functools.cache
def decode_fingerprint() -> str:
    """The fingerprint of the code a measured decode step times: every file under ``kernels/``
    but the training-only ones (decode-only code included), ``nas/models/triton_model.py`` and
    ``nas/models/triton_decode.py``."""
    import kernels
    import nas.models.triton_model as triton_model

    root = Path(kernels.__file__).resolve().parent.parent
    models = Path(triton_model.__file__).resolve().parent
    files = [*Path(kernels.__file__).resolve().parent.rglob("*.py"), *(models / n for n in _DECODE_MODEL_FILES)]
    return decode_source_fingerprint(files, root)


def decode_source_fingerprint(files: Iterable[Path], root: Path, *, precision: bool = False) -> str:
    """``source_fingerprint`` for the decode step: decode-only code counts, ``REPORT_ONLY`` and
    ``FORWARD_ONLY`` do not; files that do not exist and ``TRAINING_ONLY_DIRS`` are left out, and
    ``PRECISION_ONLY_FILES`` unless ``precision`` (a step at a stored precision runs them)."""
    digest = hashlib.sha256()
    for path in sorted((f for f in files if f.exists()), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if not (_timed(rel) or precision and rel in PRECISION_ONLY_FILES):
            continue
        skip = REPORT_ONLY.get(rel, frozenset()) | FORWARD_ONLY.get(rel, frozenset())
        digest.update(rel.encode() + b"\0" + _code_of(path, skip) + b"\0")
    return digest.hexdigest()[:12]


_DECODE_MODEL_FILES = ("triton_model.py", "triton_decode.py")
_STORED_DECODE_MODEL_FILE = "triton_decode_stored.py"  # the decoder at a stored precision (``StoredDecoder``)


@functools.cache
def stored_decode_fingerprint() -> str:
    """The fingerprint of the code a decode step at a stored precision times (``StoredDecoder``):
    ``decode_fingerprint``'s files, the precision kernels (``PRECISION_ONLY_FILES``) and
    ``nas/models/triton_decode_stored.py``. A change to those alone invalidates only the
    measurements of architectures stored below full precision."""
    import kernels
    import nas.models.triton_model as triton_model

    root = Path(kernels.__file__).resolve().parent.parent
    models = Path(triton_model.__file__).resolve().parent
    names = (*_DECODE_MODEL_FILES, _STORED_DECODE_MODEL_FILE)
    files = [*Path(kernels.__file__).resolve().parent.rglob("*.py"), *(models / n for n in names)]
    return decode_source_fingerprint(files, root, precision=True)


class LatencyCache:
    """Measured latencies in one JSON file (``$NAS_LATENCY_CACHE``, default
    ``~/.cache/hybrid-nas/latency.json``), written atomically so parallel workers never see a
    torn file (the last writer wins for a key, which is the same measurement anyway)."""

    def __init__(self, path: str | Path | None = None) -> None:
        default = Path.home() / ".cache" / "hybrid-nas" / "latency.json"
        self.path = Path(path or settings.get().latency_cache or default)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Latency | None:
        entry = self._read().get(key)
        return Latency.from_dict(entry) if entry is not None else None

    def put(self, key: str, latency: Latency) -> None:
        data = self._read()
        data[key] = latency.to_dict()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".latency-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)  # key order kept: a latency's breakdown is in execution order
        os.replace(tmp, self.path)


def _triton_errors() -> tuple[type[Exception], ...]:
    """Triton's own exception types (CompilationError and those in triton.runtime.errors), for
    the Triton versions this project supports."""
    import triton

    found = {triton.CompilationError}
    found.update(c for c in vars(triton.runtime.errors).values() if isinstance(c, type) and issubclass(c, Exception))
    return tuple(found)


def _fatal(e: BaseException) -> bool:
    """A sticky CUDA error or out-of-memory: no later trial in this process could succeed."""
    accelerator = getattr(torch, "AcceleratorError", ())
    text = str(e)
    return (
        isinstance(e, (torch.OutOfMemoryError, accelerator) if accelerator else torch.OutOfMemoryError)
        or "CUDA error" in text
        or "illegal memory access" in text
        or "misaligned address" in text
    )


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""


@contextlib.contextmanager
def kernel_errors() -> Iterator[None]:
    """Errors of building, compiling or launching a candidate's kernels as the KernelError a
    trial fails with; a sticky CUDA error or out-of-memory propagates (this worker must stop)."""
    try:
        yield
    except KernelError:
        raise
    except _triton_errors() as e:  # compile, ptxas, out of shared memory/registers, autotuner
        raise KernelCompileError(f"{type(e).__name__}: {_first_line(e)}") from None
    except (ValueError, TypeError, RuntimeError, AssertionError) as e:
        if _fatal(e):
            raise  # the CUDA context is gone (or memory is): this worker must stop, its trial is re-queued
        # a kernel wrapper refusing this candidate's shapes: fail the trial, keep the search going
        raise KernelLaunchError(f"{type(e).__name__}: {_first_line(e)}") from None


def _time(replay, copies: int, reps: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / copies)
    return samples


def measure(
    model: torch.nn.Module,
    shape: LatencyShape,
    *,
    device: torch.device | str | None = None,
    reps: int = 30,
    cache: LatencyCache | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Latency:
    """Latency of ``model``'s TritonModel forward at ``shape`` on ``device`` (a CUDA device; None:
    the current one). The search passes the device it was given (``--device cuda:N``)."""
    import triton

    if not (cuda_available() and (device is None or is_cuda(device))):
        raise RuntimeError(f"measure needs a CUDA device, got {device!r}; use predict elsewhere")
    device = resolve(device if device is not None else CUDA)
    reps = max(20, reps)
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    gpu = gpu_name(device)
    # keyed by the network at full precision: the kernels run every precision field alike
    key = cache_key(
        arch_hash(model.arch.at_full_precision()),
        shape,
        dtype_name,
        gpu,
        torch.__version__,
        triton.__version__,
        kernels_fingerprint(),
    )
    cache = cache or LatencyCache()
    if (hit := cache.get(key)) is not None:
        return unpriced_precision(hit, model.arch)

    with torch.cuda.device(device):
        found = _measure(model.to(device).eval(), shape, device, reps, dtype, dtype_name, gpu, key, cache)
    return unpriced_precision(found, model.arch)


def _measure(
    model: torch.nn.Module,
    shape: LatencyShape,
    device: torch.device,
    reps: int,
    dtype: torch.dtype,
    dtype_name: str,
    gpu: str,
    key: str,
    cache: LatencyCache,
) -> Latency:
    import triton

    from nas.models.triton_model import to_triton

    l2 = l2_bytes(device)
    mem = memory(model.arch, shape, dtype=dtype_name)
    copies = min(MAX_COPIES, max(1, -(-2 * l2 // max(1, mem.peak_activation_bytes))))
    gen = torch.Generator(device=device).manual_seed(0)
    inputs = [
        torch.randint(0, model.arch.vocab_size, (shape.batch, shape.seq_len), device=device, generator=gen)
        for _ in range(copies)
    ]
    with kernel_errors():
        tm = to_triton(model, dtype=dtype)
        got = tm(inputs[0]).float()
    with torch.no_grad(), torch.autocast(CUDA, dtype=dtype):
        expected = model(inputs[0]).float()
    err = ((got - expected).norm() / expected.norm().clamp(min=1e-12)).item()
    if not err <= MISMATCH_LIMIT:
        raise KernelMismatchError(
            f"triton forward differs from the torch model: relative error {err:.2e} > {MISMATCH_LIMIT:.0e}"
        )

    replays = [tm.capture(x) for x in inputs]  # one graph per input copy, replayed back to back

    def replay() -> None:
        for r in replays:
            r()

    notes = []
    for attempt in range(2):
        samples = _time(replay, copies, reps)
        q1, median, q3 = statistics.quantiles(samples, n=4)
        spread = (q3 - q1) / median
        if spread <= SPREAD_LIMIT:
            break
        notes.append((f"spread_attempt_{attempt + 1}", f"{spread:.1%}"))
    if notes:
        notes.append(("remeasured", "yes"))
    latency = Latency(
        median,
        q3 - q1,
        "measured",
        gpu,
        dtype_name,
        shape,
        versions=(("torch", torch.__version__), ("triton", triton.__version__), ("kernels", kernels_fingerprint())),
        notes=(("input_copies", str(copies)), ("replays", str(reps)), *notes),
    )
    cache.put(key, latency)
    return latency
