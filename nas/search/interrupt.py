"""Ctrl-C bookkeeping shared by the CLI's SIGINT handler and the search loop.

The handler raises KeyboardInterrupt wherever the main thread happens to be. Raised inside an
import or a class body (a trial imports some of torch's modules lazily), it can
reach the search loop wrapped in another exception — Python reports "Error calling __set_name__"
as a RuntimeError caused by the KeyboardInterrupt — and the run would exit 1 with its trial left
running. So the handler also records the request, and ``is_interrupt`` recognises either.
"""

from __future__ import annotations

__all__ = ["request", "requested", "is_interrupt", "reset"]

_requested = False


def request() -> None:
    """Record that the user asked to stop (the SIGINT handler calls this before raising)."""
    global _requested
    _requested = True


def requested() -> bool:
    return _requested


def reset() -> None:
    """Forget a request (tests; a CLI run that starts over in the same process)."""
    global _requested
    _requested = False


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, the user's Ctrl-C."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return _requested and not isinstance(exc, SystemExit)
