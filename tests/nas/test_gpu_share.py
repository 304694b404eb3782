"""Workers sharing a GPU: a latency measurement waits for training windows in flight, stops new
ones from starting, and has the GPU alone. flock locks belong to open file descriptions, so
threads with their own GpuShare contend exactly as worker processes do."""

from __future__ import annotations

import threading
import time

from nas.gpu_share import GpuShare, lock_prefix


def test_measurement_drains_training_and_blocks_new_windows(tmp_path):
    prefix = lock_prefix("0", str(tmp_path))
    events: list[tuple[str, float]] = []
    trainer_a, measurer, trainer_b = GpuShare(prefix), GpuShare(prefix), GpuShare(prefix)

    def log(what: str) -> None:
        events.append((what, time.monotonic()))

    def window_a() -> None:
        trainer_a.acquire_shared()
        log("a start")
        time.sleep(0.4)
        log("a end")
        trainer_a.release_shared(sync=False)

    def measure() -> None:
        with measurer.exclusive():
            log("measure start")
            time.sleep(0.3)
            log("measure end")

    def window_b() -> None:
        trainer_b.acquire_shared()
        log("b start")
        trainer_b.release_shared(sync=False)

    threads = [threading.Thread(target=window_a)]
    threads[0].start()
    time.sleep(0.1)  # a is inside its window
    threads.append(threading.Thread(target=measure))
    threads[1].start()
    time.sleep(0.1)  # the measurement is waiting for a
    threads.append(threading.Thread(target=window_b))
    threads[2].start()
    for t in threads:
        t.join(timeout=10)
    order = [what for what, _ in sorted(events, key=lambda e: e[1])]
    assert order == ["a start", "a end", "measure start", "measure end", "b start"], order


def test_without_the_environment_it_does_nothing(monkeypatch):
    monkeypatch.delenv("NAS_GPU_SHARE", raising=False)
    share = GpuShare()
    assert not share.enabled
    share.acquire_shared()
    with share.exclusive():  # would deadlock on a real lock held shared by the same description
        pass
    share.release_shared()


def test_two_trainers_share(tmp_path):
    prefix = lock_prefix("1", str(tmp_path))
    a, b = GpuShare(prefix), GpuShare(prefix)
    a.acquire_shared()
    done = threading.Event()

    def other() -> None:
        b.acquire_shared()
        done.set()
        b.release_shared(sync=False)

    t = threading.Thread(target=other)
    t.start()
    assert done.wait(5), "a second trainer must not wait for the first"
    a.release_shared(sync=False)
    t.join()
