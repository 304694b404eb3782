"""Workers sharing a GPU: a latency measurement waits for training windows in flight, stops new
ones from starting, and has the GPU alone; the trainer takes its windows through the share and
does not count the pauses as training time. flock locks belong to open file descriptions, so
threads with their own GpuShare contend exactly as worker processes do."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from nas.search.gpu_share import GpuShare, lock_prefix


def _run(*targets, timeout: float = 10) -> None:
    """Run each target in a daemon thread (a failing test must not hang pytest on a held lock)."""
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
        time.sleep(0.15)  # start in order: each one is blocked (or running) before the next
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread is still waiting for a lock"


def test_measurement_drains_training_and_blocks_new_windows(tmp_path):
    prefix = lock_prefix("0", str(tmp_path))
    events: list[str] = []
    trainer_a, measurer, trainer_b = GpuShare(prefix), GpuShare(prefix), GpuShare(prefix)

    def window_a() -> None:
        trainer_a.acquire_shared()
        try:
            events.append("a start")
            time.sleep(0.5)
            events.append("a end")
        finally:
            trainer_a.release_shared(sync=False)

    def measure() -> None:
        with measurer.exclusive() as waited:
            events.append("measure start")
            assert waited > 0.1  # it waited for a's window
            time.sleep(0.3)
            events.append("measure end")

    def window_b() -> None:
        waited = trainer_b.acquire_shared()
        try:
            events.append("b start")
            assert waited > 0.1
        finally:
            trainer_b.release_shared(sync=False)

    _run(window_a, measure, window_b)
    assert events == ["a start", "a end", "measure start", "measure end", "b start"], events


def test_without_the_environment_it_does_nothing(monkeypatch):
    monkeypatch.delenv("NAS_GPU_SHARE", raising=False)
    share = GpuShare()
    assert not share.enabled
    assert share.acquire_shared() == 0.0
    with share.exclusive() as waited:
        assert waited == 0.0
    share.release_shared()


def test_two_trainers_share(tmp_path):
    prefix = lock_prefix("1", str(tmp_path))
    a, b = GpuShare(prefix), GpuShare(prefix)
    a.acquire_shared()
    try:
        done = threading.Event()

        def other() -> None:
            b.acquire_shared()
            done.set()
            b.release_shared(sync=False)

        t = threading.Thread(target=other, daemon=True)
        t.start()
        assert done.wait(5), "a second trainer must not wait for the first"
    finally:
        a.release_shared(sync=False)


def test_an_unusable_lock_turns_sharing_off(tmp_path):
    (tmp_path / "x.gate").mkdir()  # os.open on a directory fails like a foreign read-only file
    assert not GpuShare(str(tmp_path / "x")).enabled


class _RecordingShare(GpuShare):
    """A share whose waits are simulated: each acquire 'waits' ``pause`` seconds of wall clock."""

    def __init__(self, pause: float) -> None:
        super().__init__("")
        self.pause, self.holding, self.acquired, self.released = pause, False, 0, 0

    def acquire_shared(self) -> float:
        if self.holding:
            return 0.0
        time.sleep(self.pause)
        self.holding, self.acquired = True, self.acquired + 1
        return self.pause

    def release_shared(self, sync: bool = True) -> None:
        if self.holding:
            self.holding, self.released = False, self.released + 1


def _train(share, **budget):
    from nas.models import build
    from nas.spec import ArchSpec, LayerSpec, TrainSpec
    from nas.tasks import load_task
    from nas.train import Budget, train

    task = load_task("mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=64,n_test=32")
    arch = ArchSpec(16, [LayerSpec("attention", 1, None, 0, 2.0)], task.vocab_size, task.vocab_size)
    return train(
        build(arch, task, seed=0),
        task,
        TrainSpec("adamw", 3e-3, 0.0, 0.0, 48, 8),
        device="cpu",
        budget=Budget(**budget),
        share=share,
    )


def test_training_takes_windows_and_does_not_count_pauses(monkeypatch):
    """48 steps = 3 windows of 16 (+ the set-up and the evaluation): every acquire is released,
    and 0.5 s pauses (2 s in all) do not eat a 2 s training budget."""
    _train(_RecordingShare(pause=0.0))  # one-time costs (first backward, allocator) first
    share = _RecordingShare(pause=0.5)
    start = time.perf_counter()
    result = _train(share, max_seconds=2.0)
    wall = time.perf_counter() - start
    assert result.steps == 48 and result.stopped == "completed"
    assert share.acquired == share.released == 4 and not share.holding  # set-up + window 1, 2 more, evaluation
    assert result.seconds < wall - 1.9  # the pauses are not training time


def test_training_releases_the_gpu_when_it_fails(monkeypatch):
    from nas.train import TrialTimeout

    share = _RecordingShare(pause=0.0)
    with pytest.raises(TrialTimeout):
        _train(share, deadline=time.monotonic() - 1)
    assert share.acquired == share.released >= 1 and not share.holding


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
