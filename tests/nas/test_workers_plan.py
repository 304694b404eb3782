"""Worker layout: one slot per GPU × workers-per-GPU, or CPU slots."""

from __future__ import annotations

import pytest

from nas.search.workers import Slot, WorkerError, plan_slots


def test_slots_per_gpu_and_cpu():
    assert plan_slots(["0", "1"], 2, 1) == [Slot("0", 0), Slot("0", 1), Slot("1", 2), Slot("1", 3)]
    assert plan_slots(None, 1, 3) == [Slot(None, 0), Slot(None, 1), Slot(None, 2)]
    with pytest.raises(WorkerError, match=">= 1"):
        plan_slots(["0"], 0, 1)


def test_worker_processes_are_bounded():
    """However the flags combine, one search starts at most MAX_WORKERS processes."""
    from nas.search.setup import MAX_WORKERS

    assert len(plan_slots(None, 1, MAX_WORKERS)) == MAX_WORKERS
    with pytest.raises(WorkerError, match=f"--workers asks for 100,000 worker processes; at most {MAX_WORKERS}"):
        plan_slots(None, 1, 100_000)
    with pytest.raises(WorkerError, match=r"8 GPU\(s\) x --trials-per-gpu 64 asks for 512 worker processes"):
        plan_slots([str(i) for i in range(8)], 64, 1)
