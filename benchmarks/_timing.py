"""Shared helpers of the benchmark scripts: CUDA-graph replay, medians and IQR, inputs rotated
across copies larger than L2, the metadata every results JSON carries and where it is written
(``results/<question>_<device>.json``, one current file per question and device)."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import platform
import re
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

__all__ = [
    "RESULTS",
    "Timing",
    "time_graph",
    "time_graphs",
    "interleaved",
    "copies_for_l2",
    "device_slug",
    "environment",
    "write_results",
]

RESULTS = Path(__file__).resolve().parent / "results"

L2_FALLBACK_BYTES = 60 * 2**20  # H100/H200 L2 is 50 MB; rotate through more than this


@dataclass(frozen=True)
class Timing:
    median_us: float
    q1_us: float
    q3_us: float
    iqr_us: float
    samples: int


def copies_for_l2(bytes_per_input: int) -> int:
    """How many input copies to rotate through so one pass touches more than the L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", L2_FALLBACK_BYTES) or L2_FALLBACK_BYTES
    return max(1, -(-2 * l2 // max(1, bytes_per_input)))


class GpuLock:
    """A lock on one GPU shared by processes that time on it (``model_vs_compile.py --procs``,
    ``default_peers.py --gpu-lock``): ``flock`` on a file, re-entrant within a process (the
    autotuner's benchmark helpers call one another). Without a path it is a no-op."""

    def __init__(self, path: str | None):
        self._file = open(path, "a+") if path else None  # noqa: SIM115 - held for the process's life
        self._mutex = threading.RLock()
        self._depth = 0
        self.waited_s = 0.0  # time spent waiting for other processes (per row in the JSON)
        self.held_s = 0.0  # time held (outermost holds), how many, the longest and those over 1 s
        self.holds = 0
        self.longest_s = 0.0
        self.over_1s = 0
        self._taken = 0.0

    @property
    def shared(self) -> bool:
        """Whether there is a lock file (processes share the GPU), not a no-op."""
        return self._file is not None

    def __enter__(self) -> GpuLock:
        if self._file is not None:
            self._mutex.acquire()
            if self._depth == 0:
                start = time.monotonic()
                fcntl.flock(self._file, fcntl.LOCK_EX)
                self._taken = time.monotonic()
                self.waited_s += self._taken - start
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._depth -= 1
            if self._depth == 0:
                fcntl.flock(self._file, fcntl.LOCK_UN)
                held = time.monotonic() - self._taken
                self.held_s += held
                self.holds += 1
                self.longest_s = max(self.longest_s, held)
                self.over_1s += held > 1.0
            self._mutex.release()


def _capture(fns: Sequence[Callable[[], object]], per_replay: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph of ``per_replay`` rounds over ``fns``, each fn run once first (compile and
    autotune outside the graph)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_replay):
            for fn in fns:
                fn()
    return graph


def _replay_us(graph: torch.cuda.CUDAGraph, calls: int) -> float:
    """One replay of ``graph`` timed with CUDA events: microseconds per call of its ``calls``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def _timing(samples: Sequence[float]) -> Timing:
    q1, med, q3 = statistics.quantiles(samples, n=4)
    return Timing(med, q1, q3, q3 - q1, len(samples))


def interleaved(measures: Mapping[str, Callable[[], float]], *, reps: int, warmup: int) -> dict[str, Timing]:
    """Each side's ``measure`` (one timed sample) called ``warmup`` times untimed, then ``reps``
    rounds of one sample per side, the sides' order rotated every round: a drift in clocks or
    temperature over the measurement falls on every side alike (timing one side after the other
    would hand it to whichever ran later), and no side always runs first after another's work."""
    names = list(measures)
    for _ in range(warmup):
        for name in names:
            measures[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(reps):
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            samples[name].append(measures[name]())
    return {name: _timing(s) for name, s in samples.items()}


def time_graphs(
    sides: Mapping[str, Sequence[Callable[[], object]]], *, reps: int = 50, warmup: int = 5, per_replay: int = 10
) -> dict[str, Timing]:
    """``time_graph`` for several ops measured together (ours beside a peer): each side in its own
    CUDA graph, their replays interleaved (``interleaved``) rather than one side's run after the
    other's."""
    graphs = {name: (_capture(fns, per_replay), per_replay * len(fns)) for name, fns in sides.items()}
    for _ in range(warmup):  # the first replays (the graphs' uploads) outside the rotation
        for graph, _calls in graphs.values():
            graph.replay()
    torch.cuda.synchronize()
    return interleaved({name: partial(_replay_us, *g) for name, g in graphs.items()}, reps=reps, warmup=0)


def time_graph(fns: Sequence[Callable[[], object]], *, reps: int = 50, warmup: int = 5, per_replay: int = 10) -> Timing:
    """Median/IQR microseconds of one call, each fn being the same op on a different input copy.

    The calls are captured ``per_replay`` times into one CUDA graph (so launch overhead is the
    graph's, as in deployment) cycling over ``fns``; each replay is timed with CUDA events and
    divided by its number of calls. ``reps`` timed replays follow ``warmup`` untimed ones.
    """
    return time_graphs({"": fns}, reps=reps, warmup=warmup, per_replay=per_replay)[""]


def environment() -> dict:
    """GPU name, versions and date, as every results JSON records them."""
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def device_slug(name: str | None = None) -> str:
    """The device part of a results file's name: the GPU's model (``"NVIDIA H100 80GB HBM3"`` ->
    ``"h100"``, ``"NVIDIA H200"`` -> ``"h200"``), ``"cpu"`` without a GPU; ``name`` defaults to
    GPU 0's."""
    if name is None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    for token in re.split(r"[\s_-]+", name.replace("NVIDIA", "")):
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", token):  # the model (H100, A100, L40S), not "80GB"
            return token.lower()
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def write_results(path: str | Path, rows: list[dict], **extra: object) -> Path:
    """Write the rows and ``extra`` with the environment; atomically (a process stopped while
    writing leaves the previous file, not half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**environment(), **extra, "results": rows}, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def write_part(path: str | Path, part: str, rows: list[dict], **extra: object) -> Path:
    """``write_results`` for one part of a question's file (``{"attention": {...}, "step": {...}}``):
    the file's other parts are kept as they are; atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        parts = json.loads(path.read_text())
    except (OSError, ValueError):
        parts = {}
    parts[part] = {**environment(), **extra, "results": rows}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(parts, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def _jsonable(obj: object) -> object:
    return asdict(obj) if hasattr(obj, "__dataclass_fields__") else str(obj)


def kernel_times(fns, rounds: int = 10, activity: str = "CUDA") -> dict[str, dict]:
    """Per kernel name: device µs and launches per call, from ``rounds`` eager calls of each of
    ``fns`` (torch.profiler; ``activity`` CPU for the tests). Where a route's time goes, kernel by
    kernel, beside the peer's kernels at the same shape (``--kernel-times``)."""
    for fn in fns:
        fn()
    if activity == "CUDA":
        torch.cuda.synchronize()
    kind = getattr(torch.profiler.ProfilerActivity, activity)
    with torch.profiler.profile(activities=[kind]) as prof:
        for _ in range(rounds):
            for fn in fns:
                fn()
        if activity == "CUDA":
            torch.cuda.synchronize()
    calls = rounds * len(fns)
    out = {}
    for e in prof.key_averages():
        if e.device_type.name != activity:
            continue
        total = getattr(e, "device_time_total", 0.0) if activity == "CUDA" else e.cpu_time_total
        out[e.key[:120]] = {"us": total / calls, "launches": e.count / calls}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))
