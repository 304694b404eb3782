"""Task names, spec strings and configs → Task.

A spec is ``NAME``, ``NAME:key=value,key=value`` or a path to a ``.npz`` / ``.txt`` file (which may
also take ``:key=value,...``; a path holding ':' past a drive letter, or ',', is given as
``npz:path=...``). Values are parsed by the type of the parameter they set (int, float, bool as
true/false, str), so ``mqar:vocab_size=1.5`` is an error rather than a surprise.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nas.tasks.base import Task, TaskError
from nas.tasks.files import _read as read_file
from nas.tasks.files import load_npz, load_text
from nas.tasks.mad import in_context_recall, noisy_in_context_recall, selective_copying
from nas.tasks.mqar import mqar, mqar_long

__all__ = ["list_tasks", "load_task", "task_file", "task_from_config", "task_moved"]

_TASKS: dict[str, Callable[..., Task]] = {
    "mqar": mqar,
    "mqar_long": mqar_long,
    "mad_recall": in_context_recall,
    "mad_noisy_recall": noisy_in_context_recall,
    "mad_selective_copy": selective_copying,
    "npz": load_npz,
    "text": load_text,
}
_SUFFIXES = {".npz": "npz", ".txt": "text"}
_BOOLS = {"true": True, "false": False}
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")  # C:\ or C:/ starts a path, not a task name


def list_tasks() -> list[str]:
    """Every registered task name (``npz`` and ``text`` need ``path=``)."""
    return sorted(_TASKS)


def _what(kind: type) -> str:
    return {bool: "true/false", int: "an int", float: "a float"}.get(kind, "a string")


def _from_text(raw: str, kind: type) -> Any:
    """Parse ``raw`` as ``kind``; ValueError/KeyError if it is not one (``1e3`` is an int, ``1.5`` is not)."""
    if kind is bool:
        return _BOOLS[raw.lower()]
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            number = float(raw)
            if not number.is_integer():
                raise
            return int(number)
    return kind(raw)


def _coerce(name: str, key: str, value: Any, kind: type) -> Any:
    """``value`` as the parameter's type: strings are parsed, typed values (from a config) only checked."""
    if isinstance(value, str) and kind is not str:
        try:
            return _from_text(value, kind)
        except (KeyError, ValueError, OverflowError):
            raise TaskError(f"{name}: {key}={value!r} is not {_what(kind)}") from None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is str and isinstance(value, str))
        or (kind is float and number)
        or (kind is int and number and float(value).is_integer())
    )
    if not ok:
        raise TaskError(f"{name}: {key}={value!r} is not {_what(kind)}")
    return kind(value)


def _build(name: str, params: dict[str, Any]) -> Task:
    if name not in _TASKS:
        raise TaskError(f"unknown task {name!r}; known: {', '.join(list_tasks())} (or a path to a .npz/.txt file)")
    fn = _TASKS[name]
    hints = typing.get_type_hints(fn)
    signature = inspect.signature(fn).parameters
    unknown = sorted(set(params) - set(signature))
    if unknown:
        raise TaskError(f"{name}: unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(signature))}")
    missing = [k for k, p in signature.items() if p.default is inspect.Parameter.empty and k not in params]
    if missing:
        raise TaskError(f"{name}: missing parameter(s) {', '.join(missing)}")
    return fn(**{k: _coerce(name, k, v, hints[k]) for k, v in params.items()})


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    """(name, raw params) of a spec string: split at the first ':' (past a Windows drive letter)."""
    spec = spec.strip()
    cut = spec.find(":", 2 if _DRIVE.match(spec) else 0)
    head, params = (spec, "") if cut < 0 else (spec[:cut].strip(), spec[cut + 1 :])
    raw: dict[str, str] = {}
    last = None
    for piece in params.split(","):
        item = piece.strip()
        key, eq, value = (part.strip() for part in item.partition("="))
        if last == "path" and not eq:  # a comma inside the path (``npz:path=a,b.npz``, ``a,,b``): part of it
            raw["path"] = f"{raw['path']},{piece}"
            continue
        if not item:
            continue
        if not eq or not key:
            raise TaskError(f"task spec {spec!r}: expected key=value, got {item!r}")
        if key in raw:
            raise TaskError(f"task spec {spec!r}: {key!r} given twice")
        raw[key] = value
        last = key
    if "path" in raw:  # a trailing ',' (or ', ') after the path separated nothing
        raw["path"] = raw["path"].rstrip().rstrip(",").rstrip()
    suffix = next((s for s in _SUFFIXES if head.lower().endswith(s)), None)
    if suffix is None:
        return head, raw
    if "path" in raw:
        raise TaskError(f"task spec {spec!r}: the path is given twice")
    return _SUFFIXES[suffix], {"path": head, **raw}


def task_file(spec: str) -> str | None:
    """The data file path a spec names (``d.npz:test_frac=0.2`` → ``d.npz``, ``npz:path=d.npz`` too),
    as written; None for a synthetic task or a spec that does not parse."""
    try:
        name, params = _parse(spec)
    except TaskError:
        return None
    return params.get("path") if name in ("npz", "text") else None


def load_task(spec: str, *, seed: int = 0) -> Task:
    """The task a spec names, e.g. ``mqar``, ``mqar:num_kv_pairs=16,seq_len=128``, ``data.npz``,
    ``corpus.txt:seq_len=256``. A ``seed=`` in the spec overrides ``seed``."""
    name, params = _parse(spec)
    if not name:
        raise TaskError(f"task spec {spec!r} names no task; known: {', '.join(list_tasks())}")
    return _build(name, {"seed": seed, **params})


def task_from_config(config: dict[str, Any]) -> Task:
    """Rebuild a task from its ``Task.config`` (e.g. read back from an export's JSON)."""
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise TaskError(f"task config must be a dict with a 'name', got {config!r}")
    return _build(config["name"], {k: v for k, v in config.items() if k != "name"})


def task_moved(config: dict[str, Any], elsewhere: str | None, *, explicit: bool = True) -> tuple[Task, str | None]:
    """``task_from_config(config)``, or for a data file the same task read from ``elsewhere`` (where
    the file is on this host: moved, mounted elsewhere), accepted only with the recorded SHA-256.
    Returns (task, the error the recorded path gives when ``elsewhere`` served instead, else None).

    ``explicit`` (``--data``): the path given is the one read, and one that does not hold the
    recorded bytes is a TaskError even while the recorded path still does (it was silently passed
    over). Otherwise (a resume's ``--task``, which its caller compares as a task itself) the
    recorded path is read first and ``elsewhere`` only when it fails."""
    if elsewhere is None or "sha256" not in config:
        return task_from_config(config), None
    here = str(Path(elsewhere).expanduser().resolve())
    if here == config.get("path"):
        return task_from_config(config), None
    if not explicit:
        try:
            return task_from_config(config), None
        except TaskError as e:
            try:
                return task_from_config({**config, "path": here}), str(e)
            except TaskError as other:
                raise TaskError(f"{e}, and {other}") from None
    recorded = str(config.get("path"))
    try:  # only hashed: for the note, or the message (the task is never built from both)
        read_file(recorded, str(config["sha256"]))
        gone = None
    except TaskError as e:
        gone = str(e)
    try:
        task = task_from_config({**config, "path": here})
    except TaskError as other:
        if gone is not None:
            raise TaskError(f"{gone}, and {other}") from None
        raise TaskError(f"{other} (the recorded {recorded} holds the data: leave the path out)") from None
    return task, gone
