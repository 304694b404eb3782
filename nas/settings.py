"""Every ``NAS_*`` environment variable, parsed in one place into a frozen ``Settings``.

No other module reads ``os.environ`` for these. ``get()`` parses the environment once and
returns the same object until a ``NAS_*`` variable changes (workers inherit their parent's
environment; tests set variables per test), so callers never re-parse on a hot path.
Stdlib only: any layer may import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["VARIABLES", "Settings", "SettingsError", "get"]

# variable -> what it does (docs/cli.md's table lists the same; a test checks they agree)
VARIABLES: dict[str, str] = {
    "NAS_STORAGE": "default --storage (journal file path or RDB URL); else runs/studies.journal",
    "NAS_ARTIFACTS": "directory for trained weights (Optuna artifacts); default beside the study",
    "NAS_HEARTBEAT_SECONDS": "RDB heartbeat interval in whole seconds >= 1 (default 30; stale after 4 beats)",
    "NAS_LATENCY_CACHE": "measured-latency cache file (default ~/.cache/hybrid-nas/latency.json)",
    "NAS_FAULT": "fault injection for tests: KIND[@TRIAL,...], KIND one of oom, nan, compile, mismatch, timeout, slow",
    "NAS_GPU_SHARE": "set by nas search for workers sharing a GPU: the turn-taking lock files' prefix",
    "NAS_TRAIN_COMPILE": "1: train through torch.compile (pays only for long trainings)",
    "NAS_OPTIM_FUSED": "0: the optimizers take the torch reference path on CUDA (A/B runs)",
    "NAS_TRAIN_GRAPHS": "0: train with eager steps on CUDA instead of replaying a captured CUDA graph (A/B runs)",
    "NAS_LINEAR_TMA": "1/0: force the TMA (tensor-descriptor) linear kernel on or off; unset: per GPU",
}


class SettingsError(ValueError):
    """A ``NAS_*`` variable has a value it cannot take; the message names it."""


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    text = env.get(name, "").strip()
    if text == "":
        return None
    if text not in ("0", "1"):
        raise SettingsError(f"{name}={text!r} must be 0 or 1 (or unset)")
    return text == "1"


@dataclass(frozen=True)
class Settings:
    """The parsed ``NAS_*`` environment (see ``VARIABLES`` for each one's meaning)."""

    storage: str | None = None
    artifacts: str | None = None
    heartbeat_seconds: int = 30
    latency_cache: str | None = None
    fault: str = ""  # parsed by nas.search.faults, which knows the fault kinds
    gpu_share: str | None = None
    train_compile: bool = False
    train_graphs: bool = True  # CUDA training replays a captured step where it can
    optim_fused: bool | None = None  # False: never fuse; None: fuse CUDA groups the kernel supports
    linear_tma: bool | None = None  # None: the kernels choose per GPU

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        heartbeat = env.get("NAS_HEARTBEAT_SECONDS", "30").strip()
        if not heartbeat.isdigit() or int(heartbeat) < 1:
            raise SettingsError(f"NAS_HEARTBEAT_SECONDS={heartbeat!r} must be a whole number of seconds >= 1")
        return cls(
            storage=env.get("NAS_STORAGE") or None,
            artifacts=env.get("NAS_ARTIFACTS") or None,
            heartbeat_seconds=int(heartbeat),
            latency_cache=env.get("NAS_LATENCY_CACHE") or None,
            fault=env.get("NAS_FAULT", "").strip(),
            gpu_share=env.get("NAS_GPU_SHARE") or None,
            train_compile=bool(_flag(env, "NAS_TRAIN_COMPILE")),
            train_graphs=_flag(env, "NAS_TRAIN_GRAPHS") is not False,
            optim_fused=False if _flag(env, "NAS_OPTIM_FUSED") is False else None,
            linear_tma=_flag(env, "NAS_LINEAR_TMA"),
        )


_cached: tuple[tuple[tuple[str, str], ...], Settings] | None = None


def get() -> Settings:
    """The settings of this process's current environment (parsed again only when a ``NAS_*``
    variable changed). Raises SettingsError naming a malformed variable."""
    global _cached
    snapshot = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("NAS_")))
    if _cached is None or _cached[0] != snapshot:
        _cached = (snapshot, Settings.from_env(dict(snapshot)))
    return _cached[1]
