"""benchmarks/default_peers.py without a GPU: its grids cover the issue's odd shapes, a row is
scored against its target (a wrong result never meets it), and --list runs anywhere."""

from __future__ import annotations

import pytest

from benchmarks import default_peers as dp
from tests.benchmarks._locks import held_elsewhere
from tests.kernels._support import requires_cuda


def test_grids_hold_the_odd_shapes_and_every_issue_shape():
    attn = dp.attention_grid()
    assert {L for _, _, L, _ in attn} == {333, 1000, 1024, 2048, 4097, 8192}
    assert {D for *_, D in attn} == {32, 64, 128}
    assert min(B * H for B, H, _, _ in attn) == 4 and max(B * H for B, H, _, _ in attn) == 512
    assert set(dp.ATTN_QUICK) <= set(dp.attention_grid(quick=True))
    lin = dp.linear_grid()
    assert {M for M, *_ in lin} >= {777, 16384} and {K for _, K, _, _ in lin} >= {96, 200, 256, 384, 1024, 4096}
    assert {N for _, _, N, _ in lin} >= {200, 384, 1024, 4096}
    assert {e for *_, e in lin} == {"gelu", "silu", "relu", "gelu+residual", "none+residual", "none"}
    assert {(M, K, N) for M, K, N, _ in dp.linear_grid(quick=True)} == set(dp.LINEAR_QUICK)
    la = dp.linear_attention_grid()
    assert {(3, 5, 1000, 64), (8, 8, 1024, 64), (1, 4, 256, 32), (4, 16, 4096, 64)} <= set(la)
    assert {D for *_, D in la} == {32, 64, 128} and 4097 in {L for _, _, L, _ in la}


def test_targets_follow_the_issue():
    assert dp.attention_target(1000) == 0.9 and dp.attention_target(1024) == 1.0
    assert dp.FEATURE_TARGETS == {"identity": 1.0, "elu+1": 1.5, "relu": 1.5}


@pytest.mark.parametrize(
    ("speedup", "target", "err", "met", "miss_by"),
    [
        (1.02, 1.0, 1e-3, True, None),
        (0.97, 1.0, 1e-3, False, 0.03),
        (1.60, 1.5, 1e-3, True, None),
        (2.00, 1.0, 0.5, False, "wrong result"),  # fast but wrong
        (2.00, 1.0, float("nan"), False, "wrong result"),
    ],
)
def test_score(speedup, target, err, met, miss_by):
    assert dp.score(speedup, target, err) == {"met": met, "miss_by": miss_by}


def test_a_row_is_the_peers_time_over_ours_scored_against_its_own_target(monkeypatch):
    """``speedup`` is peer / ours (above 1: ours faster), and each row is scored against the target
    it was given (attention below L 1024: 0.9), not against 1."""
    monkeypatch.setattr(dp, "_SINKS", [])
    case = {"B": 2, "H": 7, "L": 333, "D": 64}
    fast = dp._row(
        "attention", case, {"median_us": 2.0, "iqr_us": 0.0}, {"median_us": 3.0, "iqr_us": 0.0}, "sdpa", 1.0, 0.0
    )
    assert fast["speedup"] == pytest.approx(1.5) and fast["met"] is True and fast["miss_by"] is None
    slow = dp._row(
        "attention", case, {"median_us": 4.0, "iqr_us": 0.0}, {"median_us": 3.8, "iqr_us": 0.0}, "sdpa", 0.9, 0.0
    )
    assert slow["speedup"] == pytest.approx(0.95) and slow["met"] is True  # under 1.0, over its 0.9 target
    short = dp._row(
        "attention", case, {"median_us": 4.0, "iqr_us": 0.0}, {"median_us": 3.2, "iqr_us": 0.0}, "sdpa", 0.9, 0.0
    )
    assert short["met"] is False and short["miss_by"] == pytest.approx(0.1)


def test_summary_counts_misses_per_op():
    rows = [
        {"op": "linear", "M": 777, "K": 96, "N": 384, "epilogue": "gelu", "speedup": 0.8, "met": False, "miss_by": 0.2},
        {
            "op": "linear",
            "M": 3000,
            "K": 200,
            "N": 800,
            "epilogue": "gelu",
            "speedup": 1.1,
            "met": True,
            "miss_by": None,
        },
        {"op": "attention", "B": 1, "H": 4, "L": 333, "D": 32, "speedup": 0.95, "met": True, "miss_by": None},
    ]
    s = dp.summary(rows)
    assert s["linear"]["rows"] == 2 and s["linear"]["met"] == 1 and s["linear"]["worst_speedup"] == 0.8
    assert s["linear"]["misses"] == [{"M": 777, "K": 96, "N": 384, "epilogue": "gelu", "speedup": 0.8, "miss_by": 0.2}]
    assert s["attention"]["misses"] == [] and s["attention"]["median_speedup"] == 0.95
    assert s["linear"]["median_speedup"] == pytest.approx(0.95)  # the mean of the middle two, 0.8 and 1.1


def test_summary_sets_rows_on_the_peers_own_kernels_apart():
    rows = [
        {"op": "attention", "L": 1024, "speedup": 0.998, "met": False, "miss_by": 0.002, "same_kernels_as_peer": True},
        {"op": "attention", "L": 2048, "speedup": 1.004, "met": True, "miss_by": None, "same_kernels_as_peer": True},
        {"op": "attention", "L": 4097, "speedup": 0.95, "met": False, "miss_by": 0.05, "same_kernels_as_peer": False},
        {"op": "attention", "L": 8192, "speedup": 1.3, "met": True, "miss_by": None, "same_kernels_as_peer": False},
        {"op": "attention", "L": 333, "speedup": 0.8, "met": False, "miss_by": 0.1, "same_kernels_as_peer": False},
    ]
    s = dp.summary(rows)["attention"]
    assert s["peer_kernel_rows"] == {"rows": 2, "met": 1, "median_speedup": 1.001, "range": [0.998, 1.004]}
    assert s["misses_on_our_kernels"] == 2  # of the three misses, one ran the peer's kernels
    assert [m["same_kernels_as_peer"] for m in s["misses"]] == [True, False, False]
    old_file_row = {"op": "linear", "speedup": 1.0, "met": True, "miss_by": None}  # no kernel columns
    assert "peer_kernel_rows" not in dp.summary([old_file_row])["linear"]


def test_kernel_columns_compare_both_sides(monkeypatch):
    names = {"ours": ["cudnn_flash", "Memset (Device)"], "same": ["cudnn_flash", "Memset (Device)"], "other": ["x"]}
    monkeypatch.setattr(dp, "_kernels", lambda fn: sorted(names[fn()]))
    assert dp._kernel_columns(lambda: "ours", lambda: "same") == {
        "ours_kernels": ["Memset (Device)", "cudnn_flash"],
        "peer_kernels": ["Memset (Device)", "cudnn_flash"],
        "same_kernels_as_peer": True,
    }
    assert dp._kernel_columns(lambda: "ours", lambda: "other")["same_kernels_as_peer"] is False
    names["more"] = ["cudnn_flash", "Memset (Device)", "gelu_kernel"]  # ours is a subset of the peer's: not the same
    assert dp._kernel_columns(lambda: "ours", lambda: "more")["same_kernels_as_peer"] is False
    assert dp._kernel_columns(lambda: "more", lambda: "ours")["same_kernels_as_peer"] is False


def test_list_runs_without_a_gpu(capsys):
    dp.main(["--list", "--quick"])
    out = capsys.readouterr().out
    assert "attention: 5 shapes" in out and "linear: 5 shapes" in out and "linear_attention: 4 shapes" in out
    assert "linear_fp8: 2 shapes" in out


def test_every_row_is_written_as_it_finishes(tmp_path, monkeypatch):
    """A run cut short (here: the second shape raises) leaves a file holding the rows timed so
    far, marked incomplete; a finished run marks it complete."""
    import json

    timing = {"median_us": 2.0, "iqr_us": 0.1}

    def rows(quick, rope=False, fail_after=None):
        out = []
        for i, shape in enumerate(dp.attention_grid(quick=True)[:2]):
            if fail_after is not None and i == fail_after:
                raise RuntimeError("cut short")
            case = dict(zip(("B", "H", "L", "D"), shape, strict=True))
            out.append(dp._row("attention", case, timing, timing, "sdpa-default", 1.0, 0.0))
        return out

    monkeypatch.setattr(dp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dp.torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(dp, "attention_rows", lambda quick, rope=False: rows(quick, rope, fail_after=1))
    monkeypatch.setattr(dp, "_GPU_LOCK", dp._GPU_LOCK)  # restored after the test: main() replaces it
    lock = str(tmp_path / "gpu0.lock")
    with pytest.raises(RuntimeError, match="cut short"):
        dp.main(["--only", "attention", "--quick", "--out", str(tmp_path), "--gpu-lock", lock])
    saved = json.loads((tmp_path / "default_peers_h200_quick.json").read_text())["attention"]
    assert saved["complete"] is False and len(saved["results"]) == 1
    assert saved["gpu_lock"] == lock and lock in saved["timing"]  # a file cut short says the GPU was shared too
    monkeypatch.setattr(dp, "attention_rows", rows)
    dp.main(["--only", "attention", "--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "default_peers_h200_quick.json").read_text())["attention"]
    assert saved["complete"] is True and len(saved["results"]) == 2 and saved["summary"]["attention"]["rows"] == 2


def test_each_op_rewrites_its_own_part_of_the_one_file(tmp_path, monkeypatch):
    """One file per GPU: ``--only OP`` rewrites OP's part and keeps every other op's rows."""
    import json

    timing = {"median_us": 2.0, "iqr_us": 0.1}
    case = dict(zip(("B", "H", "L", "D"), dp.attention_grid(quick=True)[0], strict=True))
    linear_case = {"M": 1, "K": 2, "N": 3, "epilogue": "none"}
    monkeypatch.setattr(dp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dp.torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(dp, "_GPU_LOCK", dp._GPU_LOCK)  # restored after the test: main() replaces it
    monkeypatch.setattr(
        dp, "attention_rows", lambda quick, rope=False: [dp._row("attention", case, timing, timing, "sdpa", 1.0, 0.0)]
    )
    monkeypatch.setattr(
        dp, "linear_rows", lambda quick, floors=True: [dp._row("linear", linear_case, timing, timing, "cb", 1.0, 0.0)]
    )
    dp.main(["--only", "attention", "--quick", "--out", str(tmp_path)])
    dp.main(["--only", "linear", "--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "default_peers_h200_quick.json").read_text())
    assert set(saved) == {"attention", "linear"}
    assert [r["op"] for r in saved["attention"]["results"]] == ["attention"]
    assert [r["op"] for r in saved["linear"]["results"]] == ["linear"] and saved["linear"]["complete"] is True


def test_the_file_says_whether_the_gpu_was_shared(tmp_path, monkeypatch):
    """A grid run beside model_vs_compile's compiles (--gpu-lock) says so in its JSON: the lock's
    path and the timing text; alone, neither; without the control, the timing does not claim one."""
    import json

    timing = {"median_us": 2.0, "iqr_us": 0.1}
    case = dict(zip(("B", "H", "L", "D"), dp.attention_grid(quick=True)[0], strict=True))
    monkeypatch.setattr(dp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dp.torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(dp, "_GPU_LOCK", dp._GPU_LOCK)  # restored after the test: main() replaces it
    monkeypatch.setattr(
        dp, "attention_rows", lambda quick, rope=False: [dp._row("attention", case, timing, timing, "sdpa", 1.0, 0.0)]
    )
    saved = tmp_path / "default_peers_h200_quick.json"
    lock = str(tmp_path / "gpu0.lock")
    dp.main(["--only", "attention", "--quick", "--out", str(tmp_path), "--gpu-lock", lock])
    shared = json.loads(saved.read_text())["attention"]
    assert shared["gpu_lock"] == lock and lock in shared["timing"] and "control" in shared["timing"]
    dp.main(["--only", "attention", "--quick", "--out", str(tmp_path), "--no-control"])
    alone = json.loads(saved.read_text())["attention"]
    assert alone["gpu_lock"] is None and "lock" not in alone["timing"] and "control" not in alone["timing"]


def test_each_shape_is_handed_out_with_the_gpu_lock_held(tmp_path, monkeypatch):
    """--gpu-lock: a shape's GPU work never overlaps another process's timing (model_vs_compile's
    children take the same file), and the lock is let go between shapes and after the last."""
    from benchmarks._timing import GpuLock

    path = tmp_path / "gpu0.lock"
    monkeypatch.setattr(dp, "_GPU_LOCK", GpuLock(str(path)))
    seen = []
    shapes = dp._each_locked([(1, 2, 3, 4), (5, 6, 7, 8)])
    for shape in shapes:
        seen.append((shape, held_elsewhere(path)))
    assert seen == [((1, 2, 3, 4), True), ((5, 6, 7, 8), True)]
    assert not held_elsewhere(path), "the lock outlives the grid"
    monkeypatch.setattr(dp, "_GPU_LOCK", GpuLock(None))  # without --gpu-lock nothing is taken
    assert [held_elsewhere(path) for _ in dp._each_locked([(1, 2, 3, 4)])] == [False]


def test_gpu_lock_flag_reaches_the_grid(tmp_path, monkeypatch):
    monkeypatch.setattr(dp.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dp, "_GPU_LOCK", dp._GPU_LOCK)  # restored after the test: main() replaces it
    with pytest.raises(SystemExit):  # no GPU here: it stops after parsing, with the lock set
        dp.main(["--gpu-lock", str(tmp_path / "g.lock"), "--only", "linear_attention"])
    with dp._GPU_LOCK:
        assert (tmp_path / "g.lock").exists()


def test_interleaved_timing_spreads_a_drift_over_both_sides():
    """Two identical ops on a clock that slows at every sample: timed one after the other the later
    side looks slower; interleaved with the order rotated each round, both sides see the same drift
    (equal medians), and every side gets ``reps`` samples after ``warmup`` untimed ones."""
    from benchmarks._timing import interleaved

    clock = {"calls": 0}
    order: list[str] = []

    def measure(name: str) -> float:
        clock["calls"] += 1
        order.append(name)
        return 10.0 + 0.01 * clock["calls"]  # the same op; only the drift differs

    sides = {"ours": lambda: measure("ours"), "peer": lambda: measure("peer")}
    t = interleaved(sides, reps=30, warmup=3)
    assert t["ours"].samples == t["peer"].samples == 30 and len(order) == 66
    assert order[6:10] == ["ours", "peer", "peer", "ours"]  # the order rotates after the warm-up
    assert t["ours"].median_us == pytest.approx(t["peer"].median_us, abs=1e-9)  # ours-first every round: 0.01 apart
    clock["calls"] = 0
    one_then_other = {k: interleaved({k: f}, reps=30, warmup=3)[k].median_us for k, f in sides.items()}
    assert one_then_other["peer"] - one_then_other["ours"] > 0.3  # what sequential timing reports


@pytest.mark.parametrize("control", [True, False], ids=["with-control", "no-control"])
def test_rows_score_ours_and_the_peer_from_one_interleaved_timing(monkeypatch, control):
    """``_time_pair`` times both sides (and, with the control, the peer's second graph) in one
    ``time_graphs`` call, never one after the other, and hands back ours first; the control's
    ratio is peer over peer again."""
    from benchmarks._timing import Timing

    calls = []
    medians = {"ours": 5.0, "peer": 7.0, "peer_again": 7.7}

    def fake_time_graphs(sides, *, reps):
        calls.append((sorted(sides), reps, {k: len(v) for k, v in sides.items()}))
        return {k: Timing(medians[k], medians[k] - 1, medians[k] + 1, 2.0, reps) for k in sides}

    monkeypatch.setattr(dp, "time_graphs", fake_time_graphs)
    monkeypatch.setattr(dp, "_CONTROL", [control])
    ours, peer = dp._time_pair([lambda: None] * 3, [lambda: None] * 2)
    if control:
        assert calls == [(["ours", "peer", "peer_again"], 30, {"ours": 3, "peer": 2, "peer_again": 2})]
        assert peer.pop("control") == {"median_us": 7.7, "iqr_us": 2.0, "ratio": 7.0 / 7.7}
    else:
        assert calls == [(["ours", "peer"], 30, {"ours": 3, "peer": 2})]
    assert ours == {"median_us": 5.0, "iqr_us": 2.0} and peer == {"median_us": 7.0, "iqr_us": 2.0}


def test_summary_measures_misses_against_the_peer_vs_itself_control():
    def row(speedup, met, miss_by, control_ratio):
        return {
            "op": "linear",
            "speedup": speedup,
            "met": met,
            "miss_by": miss_by,
            "peer_us": {"median_us": 5.0, "control": {"ratio": control_ratio}},
        }

    rows = [row(0.995, False, 0.005, 1.01), row(0.9, False, 0.1, 0.99), row(1.2, True, None, 1.0)]
    s = dp.summary(rows)["linear"]["control"]
    assert s["rows"] == 3 and s["median_abs_deviation"] == pytest.approx(0.01)
    assert 0.01 <= s["p95_abs_deviation"] <= 0.011
    assert s["misses_within_p95"] == 1  # 0.005 is within the noise, 0.1 is not
    assert "control" not in dp.summary([{**rows[2], "peer_us": {"median_us": 5.0}}])["linear"]


def test_the_controls_p95_is_the_95th_percentile_of_the_deviations():
    """Over 20 controls deviating 0.1 %, 0.2 %, …, 2 %: the p95 is 1.905 % (inclusive quantile), not
    the largest nor the 85th percentile; a miss of 1.9 points is within it, one of 2 points is not."""
    rows = [
        {"op": "linear", "speedup": 1.0, "met": True, "miss_by": None, "peer_us": {"control": {"ratio": 1 + i / 1000}}}
        for i in range(1, 21)
    ]
    rows += [
        {"op": "linear", "speedup": 0.981, "met": False, "miss_by": 0.019, "peer_us": {"median_us": 1.0}},
        {"op": "linear", "speedup": 0.98, "met": False, "miss_by": 0.02, "peer_us": {"median_us": 1.0}},
    ]
    s = dp.summary(rows)["linear"]["control"]
    assert s["rows"] == 20 and s["p95_abs_deviation"] == pytest.approx(0.01905)
    assert s["median_abs_deviation"] == pytest.approx(0.0105) and s["misses_within_p95"] == 1


@pytest.mark.gpu
@requires_cuda
def test_gpu_time_graphs_times_each_side_in_its_own_graph():
    """On a GPU: two sides timed together, each replay of its own graph: a matmul 512x the work takes
    longer than the small one, every side gets its samples, and ``time_graph`` is the one-side case."""
    import torch

    from benchmarks._timing import time_graph, time_graphs

    small = [torch.randn(256, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    large = [torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    t = time_graphs({"small": [lambda a=a: a @ a for a in small], "large": [lambda a=a: a @ a for a in large]}, reps=9)
    assert t["small"].samples == t["large"].samples == 9
    assert 0 < t["small"].median_us < t["large"].median_us
    one = time_graph([lambda a=a: a @ a for a in large], reps=9)
    assert one.samples == 9 and one.median_us > 0


@pytest.mark.gpu
@requires_cuda
def test_gpu_rows_record_both_sides_kernels_and_the_control(monkeypatch):
    """On a GPU, one small shape per op end to end: each row checks its result, names both sides'
    kernels, says whether they are the same set, and times the peer-vs-itself control."""
    monkeypatch.setattr(dp, "linear_grid", lambda quick=False: [(257, 96, 384, "gelu"), (257, 96, 384, "none")])
    monkeypatch.setattr(dp, "attention_grid", lambda quick=False: [(1, 2, 333, 64)])
    monkeypatch.setattr(dp, "_CONTROL", [True])
    monkeypatch.setattr(dp, "_SINKS", [])
    rows = dp.linear_rows(quick=True, floors=False) + dp.attention_rows(quick=True)
    assert [r["op"] for r in rows] == ["linear", "linear", "attention"]
    for r in rows:
        assert r["rel_err"] <= dp.TOLERANCE
        assert r["ours_kernels"] and r["peer_kernels"] and isinstance(r["same_kernels_as_peer"], bool)
        assert r["same_kernels_as_peer"] == (r["ours_kernels"] == r["peer_kernels"])
        assert 0.5 < r["peer_us"]["control"]["ratio"] < 2.0
    summary = dp.summary(rows)
    assert summary["linear"]["control"]["rows"] == 2 and "peer_kernel_rows" in summary["attention"]
