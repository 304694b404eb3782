"""Search spaces as data: the YAML files beside this module, or a user's own file.

``load_space("hybrid_small")`` or ``load_space("my_space.yaml")`` returns a validated
``SearchSpace``; ``list_spaces()`` names the shipped ones.
"""

from __future__ import annotations

from pathlib import Path

from search_spaces._space import Choice, SearchSpace, SpaceError, parse_space, read_space_file

__all__ = ["Choice", "SearchSpace", "SpaceError", "list_spaces", "load_space", "parse_space"]

_HERE = Path(__file__).parent


def list_spaces() -> list[str]:
    """Names of the spaces shipped with the package."""
    return sorted(p.stem for p in _HERE.glob("*.yaml"))


def load_space(name_or_path: str | Path) -> SearchSpace:
    """A shipped space by name, or a YAML file by path. Raises SpaceError naming the problem."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.exists():
        if not path.is_file():
            raise SpaceError(f"{path}: no such search-space file")
        return read_space_file(path)
    shipped = _HERE / f"{text}.yaml"
    if not shipped.is_file():
        raise SpaceError(f"unknown search space {text!r}; shipped spaces are {list_spaces()} (or pass a .yaml path)")
    return read_space_file(shipped)
