"""``--trials-per-gpu auto``: the count from free memory, host cores and the probe's footprint;
the probe's heaviest candidate; the CLI's checks."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from nas.cli import main
from nas.search import auto_workers
from nas.search.auto_workers import CONTEXT_ALLOWANCE, FILL, Probe, cap_for, choose, heaviest
from nas.space import load_space
from nas.tasks.registry import load_task
from tests.conftest import write_space

GiB = 2**30


def _probe(footprint: float, *free: float) -> Probe:
    return Probe(int(footprint * GiB), tuple(int(f * GiB) for f in free), tuple(80 * GiB for _ in free), 3.0)


def test_the_smallest_bound_wins():
    big = _probe(0.25, 70)  # memory fits dozens
    assert choose(big, cores=16, variants=1) == (8, "cap for single runs")
    assert choose(big, cores=16, variants=2) == (4, "cap for populations of 2")
    assert choose(big, cores=16, variants=6) == (2, "cap for populations of 6")
    assert [cap_for(v) for v in (1, 2, 3, 4, 6, 12)] == [8, 4, 2, 2, 2, 2]  # never below 2: host gaps
    n, why = choose(big, cores=3, variants=1)  # the host: a core per worker
    assert n == 3 and why.startswith("host (3 cores for 1 GPU(s))")
    n, why = choose(_probe(0.25, 70, 70), cores=6, variants=1)  # two GPUs share the cores
    assert n == 3 and "6 cores for 2 GPU(s)" in why


def test_memory_bounds_by_the_fullest_gpu():
    footprint, free = 6.0, (70.0, 20.0)
    n, why = choose(_probe(footprint, *free), cores=64, variants=1)
    per_worker = footprint * GiB + CONTEXT_ALLOWANCE
    assert n == int(FILL * 20 * GiB // per_worker) == 2
    assert why.startswith("memory (20.0 GiB free fits 2 of 6.75 GiB)"), why


def test_one_worker_when_not_even_one_fits():
    n, why = choose(_probe(30, 20), cores=64, variants=1)
    assert n == 1 and "even one worker may run out of memory" in why


def test_the_heaviest_candidates_are_the_spaces_top_draws():
    space = load_space("hybrid_small")
    task = load_task(space.task)
    cands = heaviest(space, task)
    assert [c.arch.layers[0].mixer for c in cands] == ["attention", "linear_attention"]
    for cand in cands:
        arch = cand.arch
        assert arch.d_model == 128 and len(arch.layers) == 4
        assert len({la.mixer for la in arch.layers}) == 1
        assert all(la.mlp_ratio == 4 and la.short_conv == 4 and la.heads == 4 for la in arch.layers)
        assert cand.train.optimizer == "adamw" and cand.train.batch_size == 32
        # the recipe's memory-neutral fields take their mildest value: a probe that diverged would measure nothing
        assert cand.train.lr == 1.0e-3 and cand.train.weight_decay == 0.0 and cand.train.warmup_frac == 0.0
        assert cand.train.seeds == space.seeds and cand.train.lr_multipliers == space.lr_multipliers


def test_the_heaviest_draw_takes_the_widest_precision(tmp_path):
    extra = "precision:\n  kv_dtype: [fp8, bf16]\n"
    space = load_space(write_space(tmp_path, extra=extra))
    attention = heaviest(space, load_task(space.task))[0]
    assert {la.kv_dtype for la in attention.arch.layers} == {"bf16"}


def test_a_failed_probe_leaves_one_worker_per_gpu(monkeypatch):
    def fail(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="Traceback ...\nRuntimeError: no CUDA GPUs\n")

    monkeypatch.setattr(auto_workers.subprocess, "run", fail)
    n, why = auto_workers.trials_per_gpu("s", "x.journal", ["0"], variants=2)
    assert n == 1 and why == "the probe failed (RuntimeError: no CUDA GPUs); 1 per GPU"


def test_the_probes_answer_is_read_from_its_last_line(monkeypatch):
    seen = {}

    def answer(cmd, env, **kwargs):
        seen.update(cmd=cmd, gpus=env["CUDA_VISIBLE_DEVICES"])
        line = json.dumps({"footprint": GiB, "free": [70 * GiB, 60 * GiB], "total": [80 * GiB] * 2, "seconds": 4.0})
        return subprocess.CompletedProcess(cmd, 0, stdout=f"a log line\n{line}\n", stderr="")

    monkeypatch.setattr(auto_workers.subprocess, "run", answer)
    monkeypatch.setattr(auto_workers.os, "sched_getaffinity", lambda pid: set(range(32)))
    n, why = auto_workers.trials_per_gpu("s", "x.journal", ["2", "3"], variants=1, data="d.npz")
    assert seen["gpus"] == "2,3" and seen["cmd"][-2:] == ["--data", "d.npz"]
    assert n == 8 and why == "cap for single runs; probe 4 s"


@pytest.mark.parametrize(
    "stdout",
    ["a log line\n", '{"footprint": 1}\n', '{"footprint": 0, "free": [1], "total": [1], "seconds": 1}\n'],
)
def test_an_unreadable_answer_is_a_failed_probe(monkeypatch, stdout):
    monkeypatch.setattr(
        auto_workers.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, stdout=stdout, stderr="")
    )
    n, why = auto_workers.trials_per_gpu("s", "x.journal", ["0"], variants=1)
    assert n == 1 and why.startswith("the probe failed (") and why.endswith("; 1 per GPU")


def _fake_gpus(monkeypatch, probe):
    """``nas search --gpus 0,1 --trials-per-gpu auto`` on this CPU: two stand-in GPUs, the probe
    ``probe(variants)``, and workers that only report how many were started."""
    from nas.search import workers

    started = []
    monkeypatch.setattr(workers, "parse_gpus", lambda text: text.split(","))
    monkeypatch.setattr(
        auto_workers, "trials_per_gpu", lambda study, storage, gpus, variants, data=None: probe(variants)
    )
    monkeypatch.setattr(
        workers, "run_workers", lambda study, storage, trials, slots, **kw: started.append(slots) or [0]
    )
    return started


def test_search_starts_the_count_auto_chose_on_every_gpu(tmp_path, monkeypatch, capsys):
    started = _fake_gpus(monkeypatch, lambda variants: (3, f"cap for populations of {variants}"))
    space = str(write_space(tmp_path, extra="  seeds: 2\n  lr_multipliers: [1.0]\n"))
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", space, "--storage", storage, "--gpus", "0,1", "--trials-per-gpu", "auto"]
    assert main(argv) == 0
    assert [s.gpu for s in started[0]] == ["0", "0", "0", "1", "1", "1"]
    assert "--trials-per-gpu auto: 3 per GPU, bounded by cap for populations of 2" in capsys.readouterr().out


def test_an_interrupted_probe_leaves_no_new_study_behind(tmp_path, monkeypatch):
    import optuna

    from nas.search.storage import open_storage

    def interrupted(variants):
        raise KeyboardInterrupt

    _fake_gpus(monkeypatch, interrupted)
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path)), "--storage", storage, "--gpus", "0", "--trials-per-gpu"]
    assert main([*argv, "auto"]) == 130  # Ctrl-C's exit code
    assert optuna.get_all_study_names(open_storage(storage)) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_probe_measures_the_heaviest_candidate_on_the_gpu(tmp_path):
    storage = str(tmp_path / "s.journal")
    space = str(write_space(tmp_path, steps=20))
    argv = ["search", "--space", space, "--trials", "1", "--no-baselines", "--storage", storage, "--study", "p"]
    assert main([*argv, "--device", "cpu"]) == 0
    measured = auto_workers.probe("p", storage, ["0"])
    free, total = torch.cuda.mem_get_info(0)
    assert 0 < measured.footprint < total and measured.total == (total,)
    assert 0 < measured.free[0] <= total and measured.seconds > 0
    assert choose(measured, cores=8, variants=1)[0] >= 1
