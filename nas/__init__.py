"""hybrid-nas: hardware-aware architecture search over hybrid attention / linear-attention stacks.

``nas.load(path)`` rebuilds an exported architecture; the ``nas`` command runs searches.
"""

from nas.export import load

__all__ = ["load"]
