"""Worker layout: one slot per GPU × workers-per-GPU, or CPU slots."""

from __future__ import annotations

import pytest

from nas.search.workers import Slot, WorkerError, plan_slots


def test_slots_per_gpu_and_cpu():
    assert plan_slots(["0", "1"], 2, 1) == [Slot("0", 0), Slot("0", 1), Slot("1", 2), Slot("1", 3)]
    assert plan_slots(None, 1, 3) == [Slot(None, 0), Slot(None, 1), Slot(None, 2)]
    with pytest.raises(WorkerError, match=">= 1"):
        plan_slots(["0"], 0, 1)
