"""hybrid-nas: hardware-aware architecture search over hybrid attention / linear-attention stacks.

``nas.load(path)`` rebuilds an exported architecture; the ``nas`` command runs searches.

The package face is lazy (as Optuna's ``_LazyImport``): ``import nas`` or ``import nas.spec``
loads neither torch nor optuna; ``nas.load`` resolves its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["load"]

_LAZY = {"load": "nas.results.export"}

if TYPE_CHECKING:
    from nas.results.export import load


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nas' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
