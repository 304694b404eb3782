"""Test helper: whether another process's lock attempt on a GPU lock file would wait now."""

from __future__ import annotations

import fcntl


def held_elsewhere(path) -> bool:
    """Whether another open file description could not take the lock now."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
