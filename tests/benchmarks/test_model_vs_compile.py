"""benchmarks/model_vs_compile.py without a GPU: its architectures span the issue's range, the
summary scores the targets only from 20 architectures and never counts a wrong or failed row,
slices merge, and --list runs anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import model_vs_compile as mc
from tests.benchmarks._locks import held_elsewhere


def test_architectures_span_depth_width_and_every_mixer():
    archs = mc.architectures(7, 20)
    assert len(archs) == 20 and archs == mc.architectures(7, 20), "deterministic by seed"
    depths = {len(a.layers) for a in archs}
    assert min(depths) == 1 and max(depths) == 8
    assert min(a.d_model for a in archs) <= 64 and max(a.d_model for a in archs) >= 384
    assert {layer.mixer for a in archs for layer in a.layers} == {"attention", "linear_attention", "none"}


def _row(i: int, shape: str, ratio: float | None) -> dict:
    return {"arch_index": i, "arch": f"a{i}", "shape": shape, "ratio": ratio}


def test_summary_needs_20_archs_and_counts_failures_against_the_worst_target():
    rows = [_row(i, "1x256", 0.5 + 0.01 * i) for i in range(19)]
    s = mc.summary(rows)["1x256"]
    assert s["timed"] == 19 and s["median_met"] is None and s["worst_met"] is None
    rows.append(_row(19, "1x256", 0.6))
    s = mc.summary(rows)["1x256"]
    assert s["median_ratio"] == pytest.approx(0.595) and s["median_met"] and s["worst_met"]
    rows.append(_row(20, "1x256", None))  # compile failed or a result was wrong
    s = mc.summary(rows)["1x256"]
    assert s["failed_or_wrong"] == [20] and s["worst_met"] is False and s["median_met"]
    rows = [_row(i, "8x1024", 0.9 if i else 1.2) for i in range(20)]
    s = mc.summary(rows)["8x1024"]
    assert s["above_1"] == [0] and s["worst_met"] is False and s["median_met"] is False


def test_merge_keeps_one_row_per_arch_and_shape(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"results": [_row(1, "1x256", 0.5), _row(0, "1x256", 0.4)]}))
    b.write_text(json.dumps({"results": [_row(1, "1x256", 0.6), _row(1, "8x1024", 0.7)]}))
    rows = mc.merge([str(a), str(b)])
    assert [(r["arch_index"], r["shape"], r["ratio"]) for r in rows] == [
        (0, "1x256", 0.4),
        (1, "1x256", 0.6),
        (1, "8x1024", 0.7),
    ]


def test_list_runs_without_a_gpu(capsys):
    mc.main(["--list", "--archs", "5", "--start", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [int(line.split()[0]) for line in lines] == [2, 3, 4]
    with pytest.raises(SystemExit) as exit_:
        mc.main(["--list", "--shapes", "8by1024"])
    assert exit_.value.code == 2 and "invalid shape '8by1024'" in capsys.readouterr().err


def test_profile_summary_counts_launches_and_kernel_time_heaviest_first():
    got = mc.profile_summary([("gemm", 3, 30.0), ("norm", 5, 10.0), ("memset", 1, 0.5)])
    assert got["launches"] == 9 and got["kernel_us"] == pytest.approx(40.5)
    assert [k["kernel"] for k in got["top"]] == ["gemm", "norm", "memset"]
    assert mc.profile_summary([]) == {"launches": 0, "kernel_us": 0, "top": []}


def test_rows_without_a_compile_are_not_failures():
    rows = [_row(i, "1x256", 0.5) for i in range(20)] + [{**_row(20, "1x256", None), "compile_skipped": True}]
    s = mc.summary(rows)["1x256"]
    assert s["archs"] == 20 and s["failed_or_wrong"] == [] and s["worst_met"]


def test_merge_keeps_the_slices_gpu_and_versions_and_refuses_mixed_ones(tmp_path, capsys):
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0", "python": "3.12.3"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**env, "date": "2026-12-02T17:00", "results": [_row(0, "1x256", 0.5)]}))
    b.write_text(json.dumps({**env, "date": "2026-12-02T17:30", "results": [_row(1, "1x256", 0.7)]}))
    mc.main(["--merge", str(a), str(b), "--out", str(tmp_path)])
    merged = json.loads((tmp_path / "model_vs_compile_merged.json").read_text())
    assert {k: merged[k] for k in env} == env and merged["date"] == "2026-12-02T17:30"
    assert merged["merged_from"] == ["a.json", "b.json"] and merged["summary"]["1x256"]["timed"] == 2
    b.write_text(json.dumps({**env, "gpu": "NVIDIA H100", "date": "x", "results": []}))
    with pytest.raises(SystemExit, match="another gpu"):
        mc.main(["--merge", str(a), str(b), "--out", str(tmp_path)])


def test_shards_split_the_rows_left_to_do_exactly_once():
    done = [_row(0, "1x256", 0.7), _row(1, "1x256", None)]  # a failed row is run again
    todo = mc.work([0, 1, 2], ["1x256", "8x1024"], done, None)
    assert todo == [(0, "8x1024"), (1, "1x256"), (1, "8x1024"), (2, "1x256"), (2, "8x1024")]
    shards = [mc.work([0, 1, 2], ["1x256", "8x1024"], done, (k, 3)) for k in range(3)]
    assert sorted(r for s in shards for r in s) == sorted(todo) and all(len(s) <= 2 for s in shards)


def test_one_child_per_gpu_on_its_own_device_with_its_shard():
    cmds = mc.shard_commands(["--gpus", "4", "--shapes", "1x256", "--skip-done", "a.json"], 4)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in cmds] == ["0", "1", "2", "3"]
    for k, (argv, _) in enumerate(cmds):
        assert "--gpus" not in argv and argv[-2:] == ["--shard", f"{k}/4"]
        assert argv[2:-2] == ["--shapes", "1x256", "--skip-done", "a.json"]
    assert "--gpus=2" not in mc.shard_commands(["--gpus=2"], 2)[0][0]


@pytest.mark.parametrize("bad", ["3/3", "1", "a/b", "-1/2"])
def test_a_bad_shard_is_one_line_and_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        mc.main(["--list", f"--shard={bad}"])
    assert exit_.value.code == 2 and "invalid shard" in capsys.readouterr().err


def test_procs_per_gpu_share_each_gpus_lock_and_split_the_cpus():
    cmds = mc.shard_commands(["--gpus", "2", "--procs=3", "--deadline-s", "500"], 2, 3, cpus=16)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in cmds] == ["0", "1", "0", "1", "0", "1"]
    locks = [env["NAS_MVC_GPU_LOCK"] for _, env in cmds]
    assert len(set(locks)) == 2 and locks[0] == locks[2] == locks[4] != locks[1]
    assert {env["TORCHINDUCTOR_COMPILE_THREADS"] for _, env in cmds} == {"2"}
    for k, (argv, _) in enumerate(cmds):
        assert argv[2:] == ["--deadline-s", "500", "--shard", f"{k}/6"]
    alone = mc.shard_commands(["--gpus", "2"], 2, 1, cpus=16)
    assert all("NAS_MVC_GPU_LOCK" not in env for _, env in alone), "one process per GPU needs no lock"


def test_the_gpu_lock_excludes_other_processes_and_is_reentrant(tmp_path):
    path = tmp_path / "gpu.lock"
    lock = mc.GpuLock(str(path))
    assert not held_elsewhere(path)
    with lock:
        assert held_elsewhere(path)
        with lock:  # the autotuner's helpers nest
            assert held_elsewhere(path)
        assert held_elsewhere(path), "leaving the inner block must not release the outer one"
    assert not held_elsewhere(path)
    assert lock.holds == 1, "the nested block is part of the one outermost hold"
    import subprocess
    import sys

    holder = subprocess.Popen(  # another process holds the lock until its stdin closes
        [
            sys.executable,
            "-c",
            "import fcntl,sys; f=open(sys.argv[1],'a+'); fcntl.flock(f,fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert held_elsewhere(path)
    holder.stdin.close()  # it exits; our lock can then be taken
    with lock:
        assert held_elsewhere(path)
    holder.wait(timeout=30)
    with mc.GpuLock(None):  # one process per GPU: no file, no lock
        assert not held_elsewhere(path)


def _assert_autotune_benchmarks_hold(path, bench):
    assert not held_elsewhere(path)
    assert bench() is True
    assert not held_elsewhere(path)


def test_autotune_benchmarks_hold_the_lock_through_torchs_hook(tmp_path, monkeypatch):
    from torch._inductor.runtime import benchmarking

    if not hasattr(benchmarking, "set_gpu_benchmark_lock_context"):
        pytest.skip("this torch has no benchmark lock hook (the wrapping path is tested below)")
    monkeypatch.setattr(benchmarking, "_gpu_benchmark_lock_context", None)  # restored after the test
    path = tmp_path / "gpu.lock"
    assert mc.hold_during_autotune(mc.GpuLock(str(path))) == "set_gpu_benchmark_lock_context"

    def bench():
        with benchmarking.maybe_gpu_benchmark_lock():
            return held_elsewhere(path)

    _assert_autotune_benchmarks_hold(path, bench)


def test_autotune_benchmarks_hold_the_lock_where_torch_has_no_hook(tmp_path, monkeypatch):
    """torch 2.11 (the H200's) has no hook: the benchmarker's GPU methods are wrapped instead."""
    from torch._inductor.runtime import benchmarking

    path = tmp_path / "gpu.lock"

    class Base:
        def benchmark_gpu(self, fn):
            return fn()

    class Bench(Base):
        def benchmark_gpu_with_cuda_graph(self, fn):
            return self.benchmark_gpu(fn)  # nested: the lock is re-entrant

    monkeypatch.delattr(benchmarking, "set_gpu_benchmark_lock_context", raising=False)
    monkeypatch.setattr(benchmarking, "benchmarker", Bench())
    monkeypatch.setattr(mc.torch.cuda, "synchronize", lambda: None)
    taken = mc.hold_during_autotune(mc.GpuLock(str(path)))
    assert "Base.benchmark_gpu" in taken and "Bench.benchmark_gpu_with_cuda_graph" in taken
    _assert_autotune_benchmarks_hold(path, lambda: benchmarking.benchmarker.benchmark_gpu(lambda: held_elsewhere(path)))
    _assert_autotune_benchmarks_hold(
        path, lambda: benchmarking.benchmarker.benchmark_gpu_with_cuda_graph(lambda: held_elsewhere(path))
    )
    seen = []  # the benchmarked function runs once without the lock (its compile), then timed with it
    assert benchmarking.benchmarker.benchmark_gpu(lambda: seen.append(held_elsewhere(path)) or True)
    assert seen == [False, True]
    before = (Base.benchmark_gpu, Bench.benchmark_gpu_with_cuda_graph)
    mc.hold_during_autotune(mc.GpuLock(str(path)))  # a second call wraps nothing twice
    assert (Base.benchmark_gpu, Bench.benchmark_gpu_with_cuda_graph) == before


def test_a_torch_without_any_gpu_benchmark_method_is_refused(monkeypatch):
    from torch._inductor.runtime import benchmarking

    monkeypatch.delattr(benchmarking, "set_gpu_benchmark_lock_context", raising=False)
    monkeypatch.setattr(benchmarking, "benchmarker", object())
    with pytest.raises(SystemExit, match="no benchmark_gpu"):
        mc.hold_during_autotune(mc.GpuLock(None))


def test_the_deadline_guard_starts_the_first_row_and_then_only_rows_that_fit():
    assert mc.next_fits(0.0, 0.0, 10.0, now=100.0), "the first row always starts"
    assert mc.next_fits(0.0, 60.0, None, now=1e6), "no deadline, no guard"
    assert mc.next_fits(0.0, 60.0, 100.0, now=40.0) and not mc.next_fits(0.0, 60.0, 100.0, now=41.0)


@pytest.mark.parametrize(
    "flag,says",
    [
        ("--procs=0", "at least 1"),
        ("--gpus=0", "at least 1"),
        ("--stop-s=0", "--stop-s takes a positive number of seconds"),
        ("--deadline-s=-5", "--deadline-s takes a positive number of seconds"),
    ],
)
def test_a_count_or_guard_below_one_is_one_line_and_exit_2(flag, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        mc.main([flag, "--archs", "1"])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_row_loop_stops_at_the_deadline_and_records_what_it_left_out(tmp_path, monkeypatch):
    """main's loop without a GPU: ``bench`` faked, a fake clock advancing 100 s per row. With a
    250 s deadline two rows run (the third would end at 300 s), the rest are listed, every row is
    written with its row time."""
    clock = {"now": 0.0}

    def fake_bench(i, arch, shape, *, compile_peer, lock):
        clock["now"] += 100.0
        return {"arch_index": i, "arch": mc.describe(arch), "shape": shape, "ratio": 0.5, "correct": True}

    monkeypatch.setattr(mc, "bench", fake_bench)
    monkeypatch.setattr(mc.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(mc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mc.torch.cuda, "get_device_name", lambda *_: "NVIDIA Fake9")
    monkeypatch.setattr(mc.torch.cuda, "empty_cache", lambda: None)
    mc.main(["--archs", "3", "--shapes", "1x256", "8x1024", "--deadline-s", "250", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "model_vs_compile_fake9.json").read_text())
    assert [(r["arch_index"], r["shape"]) for r in data["results"]] == [(0, "1x256"), (0, "8x1024")]
    assert all(r["row_s"] == 100.0 and "gpu_lock_wait_s" not in r for r in data["results"])
    assert data["deadline_left_out"] == [[1, "1x256"], [1, "8x1024"], [2, "1x256"], [2, "8x1024"]]
    assert data["deadline_s"] == 250.0 and data["procs_per_gpu_lock"] is None


def test_only_inductors_autotuning_results_are_carried():
    keep = ["cache/44136fa355b3", "ab/386ea903.best_config"]
    drop = [
        "ab/386ea903.py",  # generated code
        "triton/0/XYZ/kernel.cubin",
        "fxgraph/ab/entry",  # pickles
        "cache/sub/x",
        "../cache/x",
        "/cache/x",
        "ab/../../etc.best_config",
        "deep/er/x.best_config",
        "",
    ]
    assert [n for n in keep + drop if mc._is_autotune_result(n)] == keep


def test_the_layout_carried_is_the_one_this_torch_writes(tmp_path, monkeypatch):
    """Inductor's GEMM-choice timings and Triton best configs land where the archive looks."""
    from torch._inductor.codecache import PersistentCache
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    gemm = PersistentCache.get_local_cache_path()
    best = Path(AutotuneCache._make_local_cache_key(str(tmp_path / "ab"), "key"))
    for path in (Path(gemm), best):
        assert mc._is_autotune_result(path.relative_to(tmp_path).as_posix()), path


def test_autotune_results_are_seeded_and_written_back(tmp_path, monkeypatch):
    import io
    import os
    import tarfile

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    seed = tmp_path / "seed" / "autotune_h200.tar.gz"
    seed.parent.mkdir()
    with tarfile.open(seed, "w:gz") as tar:

        def add(name: str, text: str = "{}", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.type, data = kind, text.encode()
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("cache/h1", '{"cache": {"mm": 1}}')
        add("ab/k1.best_config", '{"XBLOCK": 64}')
        add("../outside.best_config")  # refused: outside the cache dir
        add("ab/k1.py", "print('code')")  # refused: not a result
        add("cd/link.best_config", kind=tarfile.SYMTYPE)  # refused: not a file
    out = tmp_path / "out"
    with mc.AutotuneResults(seed, out) as results:
        cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert cache == results.dir and os.environ["NAS_MVC_AUTOTUNE_SEEDED"] == "2"
        assert (cache / "cache/h1").read_text() == '{"cache": {"mm": 1}}'
        assert (cache / "ab/k1.best_config").is_file()
        assert not (cache / "ab/k1.py").exists() and not (cache / "cd").exists()
        assert not (tmp_path / "outside.best_config").exists() and not (cache.parent / "outside.best_config").exists()
        (cache / "ef").mkdir()  # what this run tunes, beside code it generates
        (cache / "ef/k2.best_config").write_text('{"XBLOCK": 128}')
        (cache / "ef/k2.py").write_text("kernel source")
        (cache / "triton").mkdir()
        (cache / "triton/k2.cubin").write_bytes(b"\0" * 64)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "NAS_MVC_AUTOTUNE_SEEDED" not in os.environ
    with tarfile.open(out / seed.name) as tar:
        assert sorted(tar.getnames()) == ["ab/k1.best_config", "cache/h1", "ef/k2.best_config"]
        assert tar.extractfile("ef/k2.best_config").read() == b'{"XBLOCK": 128}'


def test_a_failed_run_still_writes_back_what_it_tuned(tmp_path, monkeypatch):
    import os
    import tarfile

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with pytest.raises(SystemExit), mc.AutotuneResults(tmp_path / "none.tar.gz", tmp_path) as results:
        assert results.seeded == 0  # no archive yet: a fresh cache
        (Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "cache").mkdir()
        (Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "cache/h").write_text("{}")
        raise SystemExit("shards exited with [1]")
    with tarfile.open(tmp_path / "none.tar.gz") as tar:
        assert tar.getnames() == ["cache/h"]


def test_the_gpu_lock_counts_its_outermost_holds_and_the_long_ones(tmp_path, monkeypatch):
    """Per row the JSON says how long the autotuner held the GPU and how many holds were over 1 s
    (likely a compile under the lock, not a timing): nested holds count once."""
    from benchmarks import _timing

    clock = iter([0.0, 10.0, 12.0, 20.0, 20.0, 20.5])  # take, release (2 s); take, take, release (0.5 s)
    lock = mc.GpuLock(str(tmp_path / "gpu.lock"))
    monkeypatch.setattr(_timing.time, "monotonic", lambda: next(clock))
    with lock:
        pass
    with lock, lock:
        pass
    assert (lock.holds, lock.over_1s, lock.longest_s, lock.held_s) == (2, 1, 2.0, 2.5)
    assert lock.waited_s == 10.0 and lock.shared and not mc.GpuLock(None).shared
    assert mc.lock_use(lock) == {"held_s": 2.5, "waited_s": 10.0, "holds": 2, "over_1s": 1}


def test_results_are_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "r.json"
    mc.write_results(path, [{"a": 1}])
    mc.write_results(path, [{"a": 2}])
    assert json.loads(path.read_text())["results"] == [{"a": 2}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"], "no temporary file left beside it"


def test_the_stop_guard_stops_running_children_and_their_own_children(tmp_path):
    import contextlib
    import subprocess
    import sys
    import time

    grandchild = tmp_path / "grandchild.pid"
    code = (
        "import subprocess,sys,time; g=subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']);"
        f"open({str(grandchild)!r},'w').write(str(g.pid)); time.sleep(300)"
    )
    quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    slow = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert quick.wait(timeout=60) == 3
    while not grandchild.exists() or not grandchild.read_text():
        assert slow.poll() is None
    codes, stopped = mc.wait_or_stop([quick, slow], 0.0, grace_s=30.0)
    assert stopped and codes[0] == 3 and codes[1] == -15, codes
    pid = int(grandchild.read_text())

    def state() -> str:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            return Path(f"/proc/{pid}/stat").read_text().split()[2]
        return "gone"

    deadline = time.monotonic() + 60  # signalled already: only the scheduler's delay to wait for
    while state() not in ("Z", "X", "gone") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state() in ("Z", "X", "gone"), f"the child's own child is still {state()}"


def test_without_a_stop_the_children_are_waited_for():
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", f"raise SystemExit({c})"]) for c in (0, 2)]
    assert mc.wait_or_stop(procs, None) == ([0, 2], False)


def _fake_gpu(monkeypatch):
    monkeypatch.setattr(mc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mc.torch.cuda, "get_device_name", lambda *_: "NVIDIA Fake9")
    monkeypatch.setattr(mc.torch.cuda, "empty_cache", lambda: None)


def test_a_stop_in_one_process_keeps_the_rows_done_and_lists_the_rest(tmp_path, monkeypatch):
    """The alarm is faked: the second row is cut (``Stopped`` raised in it, as the SIGALRM handler
    does); the first row stays, the cut one and those after are listed, the alarm is cleared."""
    import signal

    timers = []
    monkeypatch.setattr(mc.signal, "setitimer", lambda which, s: timers.append((which, s)))
    monkeypatch.setattr(mc.signal, "signal", lambda *a: None)
    calls = []

    def fake_bench(i, arch, shape, *, compile_peer, lock):
        calls.append((i, shape))
        if len(calls) == 2:
            raise mc.Stopped
        return {"arch_index": i, "arch": mc.describe(arch), "shape": shape, "ratio": 0.5, "correct": True}

    monkeypatch.setattr(mc, "bench", fake_bench)
    _fake_gpu(monkeypatch)
    mc.main(["--archs", "2", "--shapes", "1x256", "8x1024", "--stop-s", "300", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "model_vs_compile_fake9.json").read_text())
    assert [(r["arch_index"], r["shape"]) for r in data["results"]] == [(0, "1x256")]
    assert data["stopped_not_timed"] == [[0, "8x1024"], [1, "1x256"], [1, "8x1024"]] and data["stop_s"] == 300.0
    assert timers == [(signal.ITIMER_REAL, 300.0), (signal.ITIMER_REAL, 0)]


def test_a_stop_with_children_merges_what_they_finished_and_lists_the_rest(tmp_path, monkeypatch):
    """Two fake children each finish one row and write their shard file; the stop is faked as
    having fired. The merged file holds the two rows and lists the other two as not timed."""
    import os
    import sys

    def fake_children(argv, gpus, procs=1, cpus=None):
        out = []
        for k, (i, shape) in enumerate([(0, "1x256"), (1, "8x1024")]):
            row = {"arch_index": i, "arch": "x", "shape": shape, "ratio": 0.5, "correct": True}
            script = (
                "import json,sys; json.dump({'gpu': 'NVIDIA Fake9', 'torch': 't', 'triton': 'x', 'cuda': 'c',"
                f" 'python': 'p', 'date': 'd', 'results': [{row!r}]}}, open(sys.argv[1], 'w'))"
            )
            path = tmp_path / f"model_vs_compile_fake9_shard{k}of2.json"
            out.append(([sys.executable, "-c", script, str(path)], dict(os.environ)))
        return out

    def fake_wait(procs, stop_s):
        assert stop_s == 60.0
        return [p.wait(timeout=60) for p in procs], True

    monkeypatch.setattr(mc, "shard_commands", fake_children)
    monkeypatch.setattr(mc, "wait_or_stop", fake_wait)
    monkeypatch.setattr(mc.signal, "signal", lambda *a: None)
    _fake_gpu(monkeypatch)
    argv = ["--archs", "2", "--procs", "2", "--stop-s", "60", "--out", str(tmp_path)]
    mc.main(argv)
    data = json.loads((tmp_path / "model_vs_compile_merged.json").read_text())
    assert [(r["arch_index"], r["shape"]) for r in data["results"]] == [(0, "1x256"), (1, "8x1024")]
    assert data["stopped_not_timed"] == [[0, "8x1024"], [1, "1x256"]] and data["stop_s"] == 60.0


def test_our_autotuners_compile_each_config_first_and_time_it_holding_the_lock(tmp_path, monkeypatch):
    """Triton's Autotuner (a stand-in class with its ``do_bench`` cached property): each config is
    called once without the lock (its compile), then benchmarked with it; wrapping twice is a
    no-op, and a Triton without ``do_bench`` is refused."""
    from functools import cached_property

    path = tmp_path / "gpu.lock"
    timed = []

    class Autotuner:
        @cached_property
        def do_bench(self):
            return lambda kernel_call, quantiles: (timed.append(held_elsewhere(path)), kernel_call())[1]

    monkeypatch.setattr(mc.torch.cuda, "synchronize", lambda: None)
    assert mc.hold_during_our_autotune(mc.GpuLock(str(path)), Autotuner) == "Autotuner.do_bench"
    assert mc.hold_during_our_autotune(mc.GpuLock(str(path)), Autotuner) == "Autotuner.do_bench (already)"
    calls = []
    assert Autotuner().do_bench(lambda: calls.append(held_elsewhere(path)) or 7, quantiles=(0.5,)) == 7
    assert calls == [False, True] and timed == [True], (calls, timed)
    assert not held_elsewhere(path)

    class Old:
        pass

    with pytest.raises(SystemExit, match="no do_bench"):
        mc.hold_during_our_autotune(mc.GpuLock(None), Old)


def test_the_real_triton_autotuner_has_the_do_bench_that_is_wrapped():
    from triton.runtime.autotuner import Autotuner

    assert hasattr(Autotuner.__dict__.get("do_bench"), "__get__"), "hold_during_our_autotune needs it"


def _fake_bench_gpu(monkeypatch, ours_out, compiled_out, expected):
    """``bench``'s GPU parts faked on the CPU: the models, our forward and Inductor's return the
    given outputs, and each timing (5 µs ours, 10 µs Inductor's) and profile is that of the side
    whose function it was handed, so a row that swapped the sides' timings would show it."""
    import torch

    import nas.models
    from benchmarks._timing import Timing

    last = {"side": None}

    def side(name, out):
        def call(*_):
            last["side"] = name
            return out

        return call

    tm = type(
        "TM", (), {"__call__": staticmethod(side("ours", ours_out)), "forward": staticmethod(side("ours", ours_out))}
    )
    compiles = []

    def fake_compile(module, *, mode):
        compiles.append(mode)
        return side("compile", compiled_out)

    def fake_time_graph(fns, **_):
        fns[0]()
        us = {"ours": 5.0, "compile": 10.0}[last["side"]]
        return Timing(us, us - 0.1, us + 0.1, 0.2, 50)

    def fake_profile(fn):
        fn()
        return {"launches": 3, "kernel_us": {"ours": 4.0, "compile": 9.5}[last["side"]], "top": []}

    monkeypatch.setattr(
        mc, "model_and_inputs", lambda arch, shape: (object(), side("eager", expected), [torch.zeros(1)])
    )
    monkeypatch.setattr(nas.models, "to_triton", lambda model: tm())
    monkeypatch.setattr(mc, "time_graph", fake_time_graph)
    monkeypatch.setattr(mc, "kernel_profile", fake_profile)
    monkeypatch.setattr(mc.torch, "compile", fake_compile)
    monkeypatch.setattr(mc.torch._dynamo, "reset", lambda: None)
    monkeypatch.setattr(mc.torch.cuda, "synchronize", lambda: None)
    return compiles


def test_a_row_is_ours_over_compiles_time_and_only_when_both_sides_are_right(monkeypatch):
    import torch

    arch = mc.architectures(7, 1)[0]
    expected = torch.linspace(1.0, 2.0, 12)
    compiles = _fake_bench_gpu(monkeypatch, expected * 1.001, expected, expected)
    row = mc.bench(0, arch, "1x256")
    assert compiles == [mc.COMPILE_MODE]
    assert row["ours_us"].median_us == 5.0 and row["compile_us"].median_us == 10.0
    assert row["ratio"] == pytest.approx(0.5) and row["correct"] is True
    assert row["ours_gap_us"] == pytest.approx(1.0) and row["compile_gap_us"] == pytest.approx(0.5)
    assert row["ours_rel_err"] == pytest.approx(1e-3, rel=1e-3) and row["compile_rel_err"] == 0.0
    _fake_bench_gpu(monkeypatch, expected, expected * 1.5, expected)  # Inductor's result is wrong
    row = mc.bench(0, arch, "1x256")
    assert row["ratio"] is None and row["correct"] is False and row["compile_us"].median_us == 10.0
    _fake_bench_gpu(monkeypatch, expected * 1.5, expected, expected)  # ours is wrong
    assert mc.bench(0, arch, "1x256")["ratio"] is None
    _fake_bench_gpu(monkeypatch, expected, expected, expected)
    only = mc.bench(0, arch, "1x256", compile_peer=False)
    assert only["ratio"] is None and only["correct"] is True and only["compile_skipped"] and "compile_us" not in only


def test_a_failed_row_does_not_count_toward_the_20_architectures():
    rows = [_row(i, "1x256", 0.5 + 0.01 * i) for i in range(19)] + [_row(19, "1x256", None)]
    s = mc.summary(rows)["1x256"]
    assert s["archs"] == 20 and s["timed"] == 19 and s["failed_or_wrong"] == [19]
    assert s["median_met"] is None and s["worst_met"] is None


def test_skip_done_leaves_out_the_rows_already_timed_in_one_process(tmp_path, monkeypatch):
    done = tmp_path / "done.json"
    done.write_text(json.dumps({"results": [_row(0, "1x256", 0.5)]}))
    calls = []

    def fake_bench(i, arch, shape, *, compile_peer, lock):
        calls.append((i, shape))
        return {"arch_index": i, "arch": mc.describe(arch), "shape": shape, "ratio": 0.6, "correct": True}

    monkeypatch.setattr(mc, "bench", fake_bench)
    _fake_gpu(monkeypatch)
    mc.main(["--archs", "1", "--shapes", "1x256", "8x1024", "--skip-done", str(done), "--out", str(tmp_path)])
    assert calls == [(0, "8x1024")]


def test_a_stop_with_children_keeps_the_rows_skip_done_held(tmp_path, monkeypatch):
    """With --skip-done, the merged file after a stop holds the earlier call's rows as well as the
    children's, and lists as not timed only the rows neither has."""
    import os
    import sys

    done = tmp_path / "earlier.json"
    meta = {"gpu": "NVIDIA Fake9", "torch": "t", "triton": "x", "cuda": "c", "python": "p", "date": "d"}
    done.write_text(json.dumps({**meta, "results": [_row(1, "1x256", 0.4)]}))

    def fake_children(argv, gpus, procs=1, cpus=None):
        row = {"arch_index": 0, "arch": "x", "shape": "1x256", "ratio": 0.5, "correct": True}
        script = f"import json,sys; json.dump({{**{meta!r}, 'results': [{row!r}]}}, open(sys.argv[1], 'w'))"
        path = tmp_path / "model_vs_compile_fake9_shard0of2.json"
        return [([sys.executable, "-c", script, str(path)], dict(os.environ))]

    monkeypatch.setattr(mc, "shard_commands", fake_children)
    monkeypatch.setattr(mc, "wait_or_stop", lambda procs, stop_s: ([p.wait(timeout=60) for p in procs], True))
    monkeypatch.setattr(mc.signal, "signal", lambda *a: None)
    _fake_gpu(monkeypatch)
    mc.main(["--archs", "2", "--procs", "2", "--stop-s", "60", "--skip-done", str(done), "--out", str(tmp_path)])
    data = json.loads((tmp_path / "model_vs_compile_merged.json").read_text())
    assert [(r["arch_index"], r["shape"], r["ratio"]) for r in data["results"]] == [
        (0, "1x256", 0.5),
        (1, "1x256", 0.4),
    ]
    assert data["stopped_not_timed"] == [[0, "8x1024"], [1, "8x1024"]]


def test_a_row_the_deadline_left_out_is_not_also_listed_as_stopped(tmp_path, monkeypatch):
    """The deadline leaves row 3 out; the stop then fires before row 4: row 3 is listed once, under
    the deadline, row 4 under the stop."""
    clock = {"now": 0.0}
    real_fits, fits_calls = mc.next_fits, []

    def fits(*args):
        fits_calls.append(args)
        if len(fits_calls) == 4:
            raise mc.Stopped
        return real_fits(*args)

    def fake_bench(i, arch, shape, *, compile_peer, lock):
        clock["now"] += 100.0
        return {"arch_index": i, "arch": mc.describe(arch), "shape": shape, "ratio": 0.5, "correct": True}

    monkeypatch.setattr(mc, "bench", fake_bench)
    monkeypatch.setattr(mc, "next_fits", fits)
    monkeypatch.setattr(mc.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(mc.signal, "setitimer", lambda *a: None)
    monkeypatch.setattr(mc.signal, "signal", lambda *a: None)
    _fake_gpu(monkeypatch)
    argv = ["--archs", "2", "--shapes", "1x256", "8x1024", "--deadline-s", "250", "--stop-s", "900"]
    mc.main([*argv, "--out", str(tmp_path)])
    data = json.loads((tmp_path / "model_vs_compile_fake9.json").read_text())
    assert [(r["arch_index"], r["shape"]) for r in data["results"]] == [(0, "1x256"), (0, "8x1024")]
    assert data["deadline_left_out"] == [[1, "1x256"]] and data["stopped_not_timed"] == [[1, "8x1024"]]


def test_architectures_are_the_ones_its_results_were_measured_on():
    """The benchmark draws from the calibration's first ranges (FIT_RANGES_V1), so its seed still
    gives the architectures of the shipped results file, whatever the calibration draws now."""
    data = json.loads((Path(mc.__file__).parent / "results" / "model_vs_compile_h200.json").read_text())
    specs = {r["arch_index"]: r["spec"] for r in data["results"]}
    drawn = mc.architectures(data["seed"], max(specs) + 1)
    assert {i: drawn[i].to_dict() for i in specs} == specs
