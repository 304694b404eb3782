"""``triton.autotune`` with its timings kept in Triton's on-disk cache.

A search measures many candidates whose kernels share shapes; without the disk cache every new
process re-times every config of every shape it meets (a few hundred ms each), which alone would
break the ≤ 2 s per-candidate scoring budget. With it, a shape tuned once on this GPU (same
Triton, kernel source and configs: Triton keys the entry by all of them) is looked up, not timed.
The interpreter never caches (Triton turns it off there). The entry is keyed by the compile
target (e.g. sm_90), not the GPU model: hosts sharing a cache directory across different GPUs of
one architecture should set ``TRITON_CACHE_DIR`` per host. A timing taken while the GPU was busy
stays cached; delete the directory to re-tune.
"""

from __future__ import annotations

import inspect

import triton

__all__ = ["autotune"]

_HAS_DISK_CACHE = "cache_results" in inspect.signature(triton.autotune).parameters


def autotune(configs, key, **kwargs):
    """``triton.autotune(configs, key, ..., cache_results=True)`` where this Triton supports it."""
    if _HAS_DISK_CACHE:
        kwargs.setdefault("cache_results", True)
    return triton.autotune(configs, key, **kwargs)
