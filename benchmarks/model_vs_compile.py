"""Whole models: TritonModel against torch.compile, over random architectures (issue #15, item 4).

    PYTHONPATH=$PWD python benchmarks/model_vs_compile.py [--archs 20] [--seed 7] [--start 0 --count N]
                                                          [--shapes 1x256 8x1024] [--out DIR] [--list]
                                                          [--no-compile] [--gpus N] [--skip-done F…]
                                                          [--procs P] [--deadline-s S] [--stop-s S]
                                                          [--autotune-cache F]

Each architecture comes from the calibration's generator (``nas.latency.calibrate.random_arch``:
its first ranges, ``FIT_RANGES_V1``: depth 1-8, d 32-512 in steps of 16, every mixer, feature map, short
conv, MLP ratio, norm, vocab 64-8192) and is
built once with seed 0. Per shape, in the same process, as CUDA-graph replays over token batches
rotated past L2 (``benchmarks/_timing.py``: median and IQR of one forward):

- ``ours``: ``nas.models.to_triton(model)`` (the search's measured forward: its kernels and routes);
- ``compile``: the torch model in bf16 under ``torch.compile(mode="max-autotune-no-cudagraphs")``,
  compiled and autotuned first, then captured in the same kind of graph (the peer the issue names:
  max-autotune, replayed from a CUDA graph). Dynamo is reset before every compile, so no
  architecture falls back to eager on dynamo's recompile limit; the compile time is recorded.

Both outputs are checked against the torch model in bf16 eager (relative Frobenius error) before
their times count. ``ratio`` = ours / compile (lower is better). Targets (issue #15): median ratio
≤ 0.7 at each shape over ≥ 20 architectures, and no architecture above 1.0. The JSON is rewritten
after every row, so a run cut short keeps what it timed; ``--start``/``--count`` run a slice of the
architecture list (several GPU calls) and ``--merge`` joins the slices' files into one summary.
Each side is also profiled once (torch.profiler: launches, summed kernel time, heaviest kernels),
so ``*_gap_us`` (replay time minus kernel time) shows what is launch gaps rather than work.
``--no-compile`` times and profiles ours alone (the compile is most of a row's minutes).

A row's compile takes 1-3.5 minutes on an H200 (max-autotune), so the 40 rows take over an hour
in one process; with ``--procs 6`` on one H200 (16 cores) they took about 25 minutes in three
calls (2026-12-04: ``--procs 6 --stop-s 500 --autotune-cache F``, each call skipping the rows
done). ``--gpus N`` runs N processes, each on its own GPU (``CUDA_VISIBLE_DEVICES``) with
every N-th row (``--shard K/N``), and merges their files; ``--skip-done`` leaves out rows an
earlier call already timed:

    python benchmarks/model_vs_compile.py --gpus 8 --skip-done benchmarks/results/model_vs_compile_h200.json

Most of a compile is CPU work (tracing, lowering, Triton and ptxas compiles), so ``--procs P`` runs
P processes per GPU. They share the GPU through one lock file per GPU: every GPU timing of a row
(ours and the compiled replay, with their warm-ups, checks and profiles) and every benchmark
Inductor's autotuner or ours (Triton's) runs happens with the lock held, so no timing, ours or the
autotuner's, shares the GPU with another process's timing; only compiling overlaps (with the
first, untimed run of what was compiled: a benchmarked kernel is called once before the lock is
taken, so its compile does not hold the GPU). Each process gets
``cpus // (gpus * procs)`` Inductor compile threads. ``compile_s`` is then wall time on a shared
host (longer than alone). ``--deadline-s`` is a guard for a time-limited machine: a process starts
no row that its longest row so far would carry past it, and the JSON lists the rows it left out.
``--stop-s`` is the hard guard: after that many seconds the rows still running are stopped (the
children's process groups) and listed as ``stopped_not_timed``; the rows finished stay, and with
``--autotune-cache`` so do the autotuning results the stopped rows got, so a later call resumes
them without repeating those benchmarks. Rows record ``autotune_lock``: how long the autotuner held
the GPU lock, how many holds, how many over 1 s (CPU work under the lock rather than a timing).
``--list`` prints the architectures and exits (no GPU needed).

Most of a row's time holding the GPU is Inductor benchmarking GEMM choices (about 100 s a row on an
H200 with max-autotune), so ``--autotune-cache FILE`` carries Inductor's autotuning results (JSON
only) from call to call: seeded from FILE when it exists, written back under ``--out`` with the
run's added. A row re-timed after a change to our kernels then skips the peer's benchmarks; its
``compile_s`` is no longer a cold compile (rows say ``autotune_seeded``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._timing import RESULTS, GpuLock, copies_for_l2, device_slug, time_graph, write_results  # noqa: E402
from nas.latency import memory, parse_shape  # noqa: E402
from nas.latency.calibrate import FIT_RANGES_V1, random_archs  # noqa: E402
from nas.spec import ArchSpec  # noqa: E402

SHAPES = ("1x256", "8x1024")
MEDIAN_TARGET = 0.7  # ours / compile, median over architectures, per shape
WORST_TARGET = 1.0  # ours / compile, every architecture
TOLERANCE = 3e-2  # bf16 forward vs the torch model in bf16 (both round every op's output)
COMPILE_MODE = "max-autotune-no-cudagraphs"


def architectures(seed: int, n: int) -> list[ArchSpec]:
    return random_archs(seed, n, FIT_RANGES_V1)  # the draws its results file was measured on


def describe(arch: ArchSpec) -> str:
    """One line per architecture: width, vocab and its layers' mixers (A / L / M)."""
    mixers = "".join({"attention": "A", "linear_attention": "L", "none": "M"}[layer.mixer] for layer in arch.layers)
    return f"d{arch.d_model} v{arch.vocab_size} {mixers}"


def hold_during_autotune(lock: GpuLock) -> str:
    """Make Inductor's autotuning benchmarks hold ``lock``: through torch's hook where it has one
    (``set_gpu_benchmark_lock_context``, torch >= 2.13), else by wrapping the GPU benchmark methods
    of its benchmarker's classes. Returns which way was taken (recorded in the JSON)."""
    from torch._inductor.runtime import benchmarking

    hook = getattr(benchmarking, "set_gpu_benchmark_lock_context", None)
    if hook is not None:
        hook(lambda: lock)
        return "set_gpu_benchmark_lock_context"
    wrapped, found = [], False
    for cls in type(benchmarking.benchmarker).__mro__:
        for name in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
            fn = cls.__dict__.get(name)
            found |= fn is not None
            if fn is None or getattr(fn, "_gpu_lock", False):  # absent, or wrapped by an earlier call
                continue

            def locked(self, _callable, *args, _fn=fn, **kwargs):
                return warm_then_hold(lock, _fn, _callable, self, _callable, *args, **kwargs)

            locked._gpu_lock = True
            setattr(cls, name, locked)
            wrapped.append(f"{cls.__name__}.{name}")
    if not found:
        raise SystemExit("--procs: this torch's Inductor benchmarker has no benchmark_gpu to hold the GPU lock")
    return "wrapped " + ", ".join(wrapped)


def warm_then_hold(lock: GpuLock, bench, call, *args, **kwargs):
    """``bench(*args, **kwargs)`` with ``lock`` held, after one call of ``call`` (the benchmarked
    function) without it: a kernel's first call compiles it (Triton, ptxas: seconds of CPU), which
    must not keep the other processes off the GPU. That one untimed run overlaps their work as a
    compile's CPU time does; no timing does."""
    if lock.shared:
        call()
        torch.cuda.synchronize()
    with lock:
        return bench(*args, **kwargs)


def hold_during_our_autotune(lock: GpuLock, autotuner: type | None = None) -> str:
    """Make Triton's autotuner (ours: ``kernels._autotune``) time its configs with ``lock`` held,
    each config compiled before the lock is taken (``warm_then_hold``): ``Autotuner.do_bench`` is
    replaced by a property returning the locked benchmark. Returns what was wrapped."""
    if autotuner is None:
        from triton.runtime.autotuner import Autotuner as autotuner
    original = autotuner.__dict__.get("do_bench")
    if original is None or not hasattr(original, "__get__"):
        raise SystemExit("--procs: this Triton's Autotuner has no do_bench to hold the GPU lock")
    if getattr(original, "fget", None) is not None and getattr(original.fget, "_gpu_lock", False):
        return f"{autotuner.__name__}.do_bench (already)"

    def get(self):
        bench = original.__get__(self, autotuner)
        return lambda call, *args, **kwargs: warm_then_hold(lock, bench, call, call, *args, **kwargs)

    get._gpu_lock = True
    autotuner.do_bench = property(get)
    return f"{autotuner.__name__}.do_bench"


def _rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.float(), expected.float()
    return float("nan") if not torch.isfinite(a).all() else ((a - e).norm() / e.norm()).item()


def profile_summary(kernels) -> dict:
    """``(name, calls, device µs)`` per kernel name -> launches, summed kernel time and the six
    heaviest kernels: set beside a graph replay's time, what is kernel work and what is the gaps
    between launches."""
    rows = sorted(kernels, key=lambda r: -r[2])
    return {
        "launches": sum(n for _, n, _ in rows),
        "kernel_us": sum(us for _, _, us in rows),
        "top": [{"kernel": name[:120], "calls": n, "us": us} for name, n, us in rows[:6]],
    }


def kernel_profile(fn) -> dict:
    """``profile_summary`` of one eager call of ``fn`` (torch.profiler, CUDA activity)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return profile_summary(
        (e.key, e.count, getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)) for e in events
    )


def model_and_inputs(arch: ArchSpec, shape_text: str) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor]]:
    """(the fp32 model on the GPU, its bf16 copy, token batches enough to rotate past L2)."""
    from nas.models import build

    shape = parse_shape(shape_text)
    model = build(arch, seed=0).cuda().eval()
    act = memory(arch, shape).peak_activation_bytes
    inputs = [
        torch.randint(0, arch.vocab_size, (shape.batch, shape.seq_len), device="cuda")
        for _ in range(min(8, copies_for_l2(act)))
    ]
    return model, copy.deepcopy(model).to(torch.bfloat16), inputs


def bench(
    index: int, arch: ArchSpec, shape_text: str, *, compile_peer: bool = True, lock: GpuLock | None = None
) -> dict:
    """One (architecture, shape) row. Timings, checks and profiles run under ``lock``; the
    compiles (ours, Inductor's) run without it, their autotuning benchmarks taking it on their own
    (``hold_during_autotune``, ``hold_during_our_autotune``)."""
    from nas.models import to_triton

    gpu = lock if lock is not None else contextlib.nullcontext()
    row: dict = {"arch_index": index, "arch": describe(arch), "spec": arch.to_dict(), "shape": shape_text}
    with torch.no_grad():
        # Built and run once without the lock: the first forward compiles our kernels (CPU), and
        # autotunes those that tune, each config's timing holding the lock (hold_during_our_autotune).
        model, torch_bf16, inputs = model_and_inputs(arch, shape_text)
        expected = torch_bf16(inputs[0])
        tm = to_triton(model)
        first = tm(inputs[0])
        torch.cuda.synchronize()
        with gpu:
            row["ours_rel_err"] = _rel_err(first, expected)
            row["ours_us"] = time_graph([lambda x=x: tm.forward(x) for x in inputs])
            row["ours_profile"] = kernel_profile(lambda: tm.forward(inputs[0]))
            row["ours_gap_us"] = row["ours_us"].median_us - row["ours_profile"]["kernel_us"]
            torch.cuda.synchronize()
        if not compile_peer:
            row.update(ratio=None, correct=row["ours_rel_err"] <= TOLERANCE, compile_skipped=True)
            return row
        torch._dynamo.reset()  # a fresh cache: no recompile limit reached, no eager fallback
        start = time.perf_counter()
        compiled = torch.compile(torch_bf16, mode=COMPILE_MODE)
        before = lock_use(lock)
        try:
            compiled(inputs[0])  # compiles and autotunes (its benchmarks hold the lock)
            torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - start
            if lock is not None and lock.shared:
                row["autotune_lock"] = {k: v - before[k] for k, v in lock_use(lock).items()} | {
                    "longest_s": lock.longest_s  # this process's longest hold so far
                }
            with gpu:
                row["compile_rel_err"] = _rel_err(compiled(inputs[0]), expected)
                row["compile_us"] = time_graph([lambda x=x: compiled(x) for x in inputs])
                row["compile_profile"] = kernel_profile(lambda: compiled(inputs[0]))
                row["compile_gap_us"] = row["compile_us"].median_us - row["compile_profile"]["kernel_us"]
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - recorded: the row then has no ratio
            row["compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    correct = row["ours_rel_err"] <= TOLERANCE and row.get("compile_rel_err", 1.0) <= TOLERANCE
    row["ratio"] = row["ours_us"].median_us / row["compile_us"].median_us if "compile_us" in row and correct else None
    row["correct"] = correct
    return row


def lock_use(lock: GpuLock | None) -> dict:
    """How long ``lock`` was held and waited for so far, and how many holds (over 1 s: a hold that
    is likely CPU work, a compile, rather than GPU timing)."""
    if lock is None:
        return {"held_s": 0.0, "waited_s": 0.0, "holds": 0, "over_1s": 0}
    return {"held_s": lock.held_s, "waited_s": lock.waited_s, "holds": lock.holds, "over_1s": lock.over_1s}


def summary(rows: list[dict]) -> dict:
    """Per shape: architectures timed, median and worst ratio, those above 1.0, whether the targets
    hold (None below 20 architectures: the issue's minimum)."""
    out = {}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape and not r.get("compile_skipped")]
        ratios = [r["ratio"] for r in mine if r.get("ratio") is not None]
        failed = [r["arch_index"] for r in mine if r.get("ratio") is None]
        median = statistics.median(ratios) if ratios else None
        worst = max(ratios) if ratios else None
        out[shape] = {
            "archs": len(mine),
            "timed": len(ratios),
            "failed_or_wrong": failed,
            "median_ratio": median,
            "worst_ratio": worst,
            "above_1": [r["arch_index"] for r in mine if r.get("ratio") is not None and r["ratio"] > WORST_TARGET],
            "median_met": None if len(ratios) < 20 else median <= MEDIAN_TARGET,
            "worst_met": None if len(ratios) < 20 else worst <= WORST_TARGET and not failed,
        }
    return out


def _is_autotune_result(name: str) -> bool:
    """Whether a path inside Inductor's cache dir is an autotuning result: the GEMM choices'
    timings (``cache/<system hash>``, JSON) or a Triton kernel's ``*.best_config`` (JSON)."""
    parts = PurePosixPath(name).parts  # two levels, relative, no ".." (an absolute path starts with "/")
    if len(parts) != 2 or "/" in parts or ".." in parts:
        return False
    return parts[0] == "cache" or name.endswith(".best_config")


class AutotuneResults:
    """``--autotune-cache FILE``: Inductor's autotuning results carried from call to call. The run
    gets a fresh ``TORCHINDUCTOR_CACHE_DIR`` (children inherit it), seeded from FILE when it exists;
    afterwards the results there, the seeded ones and this run's, go to FILE's name under ``--out``.
    Only the JSON results travel (no compiled code, no pickles), so a later compile still traces,
    lowers and compiles everything but skips the benchmarks of every choice an earlier call timed
    (same GPU model and torch; Inductor's keys include both). Rows then record ``autotune_seeded``:
    their ``compile_s`` is not a cold compile's."""

    def __init__(self, archive: Path, out: Path):
        self.archive, self.out = archive, out
        self.dir = Path(tempfile.mkdtemp(prefix="nas_mvc_inductor_"))
        self.seeded = 0

    def __enter__(self) -> AutotuneResults:
        if self.archive.is_file():
            with tarfile.open(self.archive) as tar:
                members = [m for m in tar.getmembers() if m.isfile() and _is_autotune_result(m.name)]
                tar.extractall(self.dir, members=members, filter="data")
            self.seeded = len(members)
        self._before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.dir)
        os.environ["NAS_MVC_AUTOTUNE_SEEDED"] = str(self.seeded)
        return self

    def __exit__(self, *exc) -> None:  # also after a failed or interrupted run: what it tuned is kept
        os.environ.pop("NAS_MVC_AUTOTUNE_SEEDED", None)
        if self._before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._before
        path, n = self.save(self.out)
        print(f"wrote {path}: {n} autotuning results ({self.seeded} seeded)", flush=True)

    def save(self, out: Path) -> tuple[Path, int]:
        """Write the results to ``out/<FILE's name>``; returns the path and how many files."""
        files = sorted(
            p for p in self.dir.rglob("*") if p.is_file() and _is_autotune_result(p.relative_to(self.dir).as_posix())
        )
        out.mkdir(parents=True, exist_ok=True)
        path = out / self.archive.name
        with tarfile.open(path, "w:gz") as tar:
            for f in files:
                tar.add(f, arcname=f.relative_to(self.dir).as_posix())
        return path, len(files)


def merge(paths: list[str]) -> list[dict]:
    """Rows of several slice files, one per (architecture, shape), in order."""
    rows: dict[tuple[int, str], dict] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["results"]:
            rows[(r["arch_index"], r["shape"])] = r
    return [rows[k] for k in sorted(rows)]


ENVIRONMENT_KEYS = ("gpu", "torch", "triton", "cuda", "python", "date")


def slices_environment(paths: list[str]) -> dict:
    """The GPU and versions the slices were timed with (not the machine that merges them); the
    slices must agree on all but the date, which becomes the latest of theirs."""
    envs = [{k: json.loads(Path(p).read_text()).get(k) for k in ENVIRONMENT_KEYS} for p in paths]
    for env, p in zip(envs[1:], paths[1:], strict=True):
        differ = [k for k in ENVIRONMENT_KEYS[:-1] if env[k] != envs[0][k]]
        if differ:
            raise SystemExit(f"{p}: timed with another {', '.join(differ)} than {paths[0]}; not merged")
    return {**envs[0], "date": max(str(e["date"]) for e in envs)}


def write_merged(paths: list[str], out: Path, seed: int, **extra: object) -> Path:
    """``--merge``: the slices' rows in one file with their environment and the summary."""
    rows = merge(paths)
    path = write_results(
        out / "model_vs_compile_merged.json",
        rows,
        **slices_environment(paths),
        merged_from=[Path(p).name for p in paths],
        summary=summary(rows),
        seed=seed,
        **extra,
    )
    print(json.dumps(summary(rows), indent=1))
    print(f"wrote {path}")
    return path


class Stopped(BaseException):
    """``--stop-s`` fired (or the process was sent SIGTERM): not an error of the row it cuts."""


def _raise_stopped(*_: object) -> None:
    raise Stopped


def wait_or_stop(procs: list[subprocess.Popen], stop_s: float | None, grace_s: float = 20.0) -> tuple[list, bool]:
    """Wait for the children; once ``stop_s`` seconds have passed, stop those still running with
    their process groups (Inductor's compile workers too): SIGTERM, up to ``grace_s`` for the
    children to exit, then SIGKILL to whatever is left of each group. Returns their exit codes and
    whether the stop fired. A child stopped mid-row keeps the rows it finished (each is written
    when done) and the autotuning results it got (the cache dir)."""
    start, stopped = time.monotonic(), False
    while any(p.poll() is None for p in procs):
        if stop_s is not None and time.monotonic() - start >= stop_s:
            stopped = True
            break
        time.sleep(1.0)
    if stopped:
        running = [p for p in procs if p.poll() is None]
        _signal_groups(running, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_groups(running, signal.SIGKILL)  # a worker that outlived its child, or a child that ignored TERM
        for p in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=grace_s)
    return [p.poll() for p in procs], stopped


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:  # each child leads its own group (start_new_session); gone groups are skipped
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"invalid shard {text!r}: K/N with 0 <= K < N")
    return int(k), int(n)


def work(
    chosen: list[int], shapes: list[str], done: list[dict], shard: tuple[int, int] | None
) -> list[tuple[int, str]]:
    """The (architecture, shape) rows to run: those not ``done`` (rows with a ratio), every N-th
    from the K-th with a shard (interleaved, so the shards' compiles cost about the same)."""
    have = {(r["arch_index"], r["shape"]) for r in done if r.get("ratio") is not None}
    todo = [(i, s) for i in chosen for s in shapes if (i, s) not in have]
    return todo if shard is None else todo[shard[0] :: shard[1]]


def shard_commands(argv: list[str], gpus: int, procs: int = 1, cpus: int | None = None) -> list[tuple[list[str], dict]]:
    """``gpus * procs`` children: this script with ``argv`` less ``--gpus``/``--procs``, plus
    ``--shard k/(gpus*procs)``, child k on ``CUDA_VISIBLE_DEVICES=k % gpus``. With ``procs`` > 1 the
    children of one GPU share its lock file (``NAS_MVC_GPU_LOCK``: no timing shares the GPU with
    another's) and split the host's CPUs for Inductor's compile threads."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--gpus", "--procs"):
            skip = True
        elif not a.startswith(("--gpus=", "--procs=")):
            rest.append(a)
    n = gpus * procs
    threads = max(1, (cpus or os.cpu_count() or 1) // n)
    out = []
    for k in range(n):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(k % gpus)}
        if procs > 1:
            env["NAS_MVC_GPU_LOCK"] = f"/tmp/model_vs_compile_gpu{k % gpus}.lock"
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        out.append(([sys.executable, str(Path(__file__).resolve()), *rest, "--shard", f"{k}/{n}"], env))
    return out


def next_fits(started: float, longest_s: float, deadline_s: float | None, now: float) -> bool:
    """Whether a row may start at ``now``: always without a deadline or before the first row
    (``longest_s`` 0), else only if the longest row so far would end by the deadline."""
    return deadline_s is None or longest_s == 0 or now - started + longest_s <= deadline_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", type=int, default=20, help="architectures in the list (default 20)")
    parser.add_argument("--seed", type=int, default=7, help="the generator's seed (the calibration uses 1 and 1001)")
    parser.add_argument("--start", type=int, default=0, help="first architecture of this run's slice")
    parser.add_argument("--count", type=int, help="architectures in this run's slice (default: to the end)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--list", action="store_true", help="print the architectures and exit")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="time and profile ours only (minutes for the whole list; no ratios), to its own file",
    )
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="join slice files into --out's file and exit")
    parser.add_argument(
        "--skip-done", nargs="+", default=[], metavar="JSON", help="leave out rows these files hold (a later call)"
    )
    parser.add_argument("--shard", type=_shard, help="K/N: this process runs every N-th row from the K-th")
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="one process per GPU, each on its own device with its own shard, then merged (compile dominates)",
    )
    parser.add_argument(
        "--procs",
        type=int,
        default=1,
        help="processes per GPU: compiles overlap, GPU timings and autotune benchmarks take turns (a lock)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        help="guard: start no row that the longest row so far would carry past this many seconds (reported)",
    )
    parser.add_argument(
        "--stop-s",
        type=float,
        help="guard: stop after this many seconds (rows cut are listed; their autotuning results are kept)",
    )
    parser.add_argument(
        "--autotune-cache",
        metavar="FILE",
        help="seed Inductor's autotuning results from this .tar.gz when it exists; write them back under --out",
    )
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.procs < 1:
        parser.error("--gpus and --procs take a count of at least 1")
    for name in ("deadline_s", "stop_s"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} takes a positive number of seconds")
    for s in args.shapes:
        try:
            parse_shape(s)  # a bad shape fails here, before any GPU work
        except ValueError as e:
            parser.error(str(e))  # one line, exit 2
    archs = architectures(args.seed, args.archs)
    stop = len(archs) if args.count is None else min(len(archs), args.start + args.count)
    chosen = list(range(args.start, stop))
    if args.list:
        for i in chosen:
            print(f"{i:3d}  {describe(archs[i])}  ({len(archs[i].layers)} layers)")
        return
    out = Path(args.out)
    if args.merge:
        write_merged(args.merge, out, args.seed)
        return
    if not torch.cuda.is_available():
        raise SystemExit("model_vs_compile.py times GPU forwards: no CUDA device here (--list works anywhere)")
    if args.shard is None:  # SIGTERM (a time limit) unwinds: children stopped, autotuning results kept
        signal.signal(signal.SIGTERM, _raise_stopped)
    if args.autotune_cache and args.shard is None:  # children inherit the parent's cache dir
        with AutotuneResults(Path(args.autotune_cache), out):
            _run(args, argv, archs, chosen, stop, out)
    else:
        _run(args, argv, archs, chosen, stop, out)


def _run(
    args: argparse.Namespace, argv: list[str] | None, archs: list[ArchSpec], chosen: list[int], stop: int, out: Path
) -> None:
    """The rows of this process (a shard), or the children's with ``--gpus``/``--procs``, merged."""
    if args.gpus * args.procs > 1 and args.shard is None:
        n = args.gpus * args.procs
        children = shard_commands(argv or sys.argv[1:], args.gpus, args.procs)
        procs = [subprocess.Popen(cmd, env=env, start_new_session=True) for cmd, env in children]
        try:
            codes, stopped = wait_or_stop(procs, args.stop_s)
        except Stopped:  # SIGTERM here: stop the children now
            codes, stopped = wait_or_stop(procs, 0.0)
        files = sorted(str(f) for f in out.glob(f"model_vs_compile_*_shard*of{n}.json"))
        paths = [*args.skip_done, *files]
        extra = {}
        if stopped:
            done = merge(paths) if paths else []
            extra = {"stop_s": args.stop_s, "stopped_not_timed": work(chosen, args.shapes, done, None)}
            print(f"stop guard: {len(extra['stopped_not_timed'])} rows not timed", flush=True)
        if paths:
            write_merged(paths, out, args.seed, **extra)
        if any(codes) and not stopped:
            raise SystemExit(f"shards exited with {codes}")
        return
    name = device_slug(torch.cuda.get_device_name(0))
    suffix = "" if (args.start, stop) == (0, len(archs)) else f"_{args.start}-{stop - 1}"
    suffix += "_ours_only" if args.no_compile else ""
    suffix += f"_shard{args.shard[0]}of{args.shard[1]}" if args.shard else ""
    path = out / f"model_vs_compile_{name}{suffix}.json"
    lock_path = os.environ.get("NAS_MVC_GPU_LOCK")
    lock = GpuLock(lock_path)
    sharing = {
        "procs_per_gpu_lock": lock_path,
        "compile_threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
    }
    if lock_path:
        sharing["autotune_lock"] = hold_during_autotune(lock)
        sharing["our_autotune_lock"] = hold_during_our_autotune(lock)
    rows, left_out = [], []

    def save(**extra) -> None:
        write_results(
            path,
            rows,
            summary=summary(rows),
            seed=args.seed,
            compile_mode=COMPILE_MODE,
            timing="CUDA-graph replay, median of 50 replays; token batches rotated over copies larger than L2",
            **sharing,
            **extra,
        )

    todo = work(chosen, args.shapes, merge(args.skip_done) if args.skip_done else [], args.shard)
    if args.stop_s is not None and args.shard is None:  # one process: the stop is an alarm
        signal.signal(signal.SIGALRM, _raise_stopped)
        signal.setitimer(signal.ITIMER_REAL, args.stop_s)
    try:
        _rows(args, archs, todo, lock, rows, left_out, save)
    except Stopped:
        done = {(r["arch_index"], r["shape"]) for r in rows}
        cut = [[i, s] for i, s in todo if (i, s) not in done and [i, s] not in left_out]
        print(f"stop guard: {len(cut)} rows not timed", flush=True)
        save(
            stop_s=args.stop_s,
            stopped_not_timed=cut,
            **({"deadline_s": args.deadline_s, "deadline_left_out": left_out} if left_out else {}),
        )
        return
    finally:
        if args.stop_s is not None and args.shard is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    if left_out:
        save(deadline_s=args.deadline_s, deadline_left_out=left_out)
    print(json.dumps(summary(rows), indent=1))
    print(f"wrote {path}")


def _rows(args, archs, todo, lock, rows, left_out, save) -> None:
    """The row loop of ``_run``: each row timed, recorded and written as it finishes."""
    started, longest = time.monotonic(), 0.0
    for i, shape in todo:
        if not next_fits(started, longest, args.deadline_s, time.monotonic()):
            left_out.append([i, shape])
            print(f"deadline guard: row {i} {shape} not started ({args.deadline_s:.0f} s)", flush=True)
            continue
        row_start, waited = time.monotonic(), lock.waited_s
        try:
            row = bench(i, archs[i], shape, compile_peer=not args.no_compile, lock=lock)
        except Exception as e:  # noqa: BLE001 - one broken architecture is recorded, not fatal
            row = {"arch_index": i, "arch": describe(archs[i]), "shape": shape, "ratio": None}
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        longest = max(longest, time.monotonic() - row_start)
        row["row_s"] = time.monotonic() - row_start
        if lock.shared:
            row["gpu_lock_wait_s"] = lock.waited_s - waited  # compile_s includes this much waiting
        if os.environ.get("NAS_MVC_AUTOTUNE_SEEDED"):  # --autotune-cache: compile_s is not a cold compile
            row["autotune_seeded"] = int(os.environ["NAS_MVC_AUTOTUNE_SEEDED"])
        rows.append(row)
        ratio = row.get("ratio")
        prof = row.get("ours_profile", {})
        print(
            f"{i:3d} {row['arch']:28s} {shape:7s} ratio {ratio if ratio is None else round(ratio, 3)}"
            f" | ours {getattr(row.get('ours_us'), 'median_us', float('nan')):.1f} µs, {prof.get('launches')}"
            f" launches, {prof.get('kernel_us', float('nan')):.1f} µs in kernels"
            f" | compile {getattr(row.get('compile_us'), 'median_us', float('nan')):.1f} µs,"
            f" {row.get('compile_profile', {}).get('launches')} launches",
            flush=True,
        )
        save()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
