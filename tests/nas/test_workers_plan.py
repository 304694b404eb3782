"""Worker layout: one slot per GPU × workers-per-GPU, or CPU slots."""

from __future__ import annotations

import pytest

from nas.search.workers import Slot, WorkerError, plan_slots


def test_slots_per_gpu_and_cpu():
    assert plan_slots(["0", "1"], 2, None) == [Slot("0", 0), Slot("0", 1), Slot("1", 2), Slot("1", 3)]
    assert plan_slots(["0"], None, None) == [Slot("0", 0)]
    assert plan_slots(None, None, 3) == [Slot(None, 0), Slot(None, 1), Slot(None, 2)]
    assert plan_slots(None, None, None) == [Slot(None, 0)]
    with pytest.raises(WorkerError, match=">= 1"):
        plan_slots(["0"], 0, None)


def test_a_flag_the_other_choice_makes_moot_is_refused():
    """--trials-per-gpu without --gpus, or --workers with them, was ignored without a word."""
    with pytest.raises(WorkerError, match="--trials-per-gpu needs --gpus"):
        plan_slots(None, 2, None)
    with pytest.raises(WorkerError, match="with --gpus, set processes per GPU with --trials-per-gpu"):
        plan_slots(["0"], None, 4)


def test_worker_processes_are_bounded():
    """However the flags combine, one search starts at most MAX_WORKERS processes."""
    from nas.search.setup import MAX_WORKERS

    assert len(plan_slots(None, None, MAX_WORKERS)) == MAX_WORKERS
    with pytest.raises(WorkerError, match=f"--workers asks for 100,000 worker processes; at most {MAX_WORKERS}"):
        plan_slots(None, None, 100_000)
    with pytest.raises(WorkerError, match=r"8 GPU\(s\) x --trials-per-gpu 64 asks for 512 worker processes"):
        plan_slots([str(i) for i in range(8)], 64, None)


def test_cpu_workers_where_a_gpu_was_asked_for_are_refused():
    """--workers 3 on a GPU machine trained 3 CPU processes (a session lost a lease to it)."""
    from nas.search.workers import check_cpu_workers

    three = plan_slots(None, None, 3)
    with pytest.raises(WorkerError, match=r"--workers 3 starts CPU processes, but this machine has a GPU") as e:
        check_cpu_workers(three, "auto", cuda=True)
    assert "--gpus 0 --trials-per-gpu 3" in str(e.value) and "--device cpu" in str(e.value)
    with pytest.raises(WorkerError, match=r"--device cuda:1 asks for a GPU: train on it with --gpus 1 "):
        check_cpu_workers(three, "cuda:1", cuda=True)
    check_cpu_workers(three, "auto", cuda=False)  # no GPU: CPU processes are what auto means
    check_cpu_workers(three, "cpu", cuda=True)  # asked for the CPU
    check_cpu_workers(plan_slots(None, None, 1), "auto", cuda=True)  # one process trains on the device itself
    check_cpu_workers(plan_slots(["0"], 3, None), "auto", cuda=True)  # GPU slots
