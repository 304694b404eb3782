"""Reading the small YAML files users write (hardware profiles here, search spaces in ``nas.space``):
UTF-8 text of bounded size, safe loading only, and a key given twice is an error rather than
"the last one wins" (PyYAML's rule, under which a second ``depth:`` or ``memory_bandwidth_gb_s:``
further down silently replaces the first).

Errors are ``YamlFileError`` whose message leaves the file's name to the caller, which names it in
its own error type (``ProfileError``, ``SpaceError``).
"""

from __future__ import annotations

import re
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_FILE_BYTES", "MAX_NODES", "DuplicateKey", "TooLarge", "YamlFileError", "load_unique", "read_text"]

MAX_FILE_BYTES = 1 << 20  # such a file is a few KB; a bigger one is the wrong file (a data set?)
# Values in the document once its aliases are expanded. A 533-byte "billion laughs" (nine levels
# of an anchor listing the previous one nine times) expands to 9^8 = 43 million values: the message
# quoting one took 2.4 GB and 8 s, a level more about 20 GB. The largest shipped file holds ~600.
MAX_NODES = 100_000


class YamlFileError(ValueError):
    """The file cannot be read as such a YAML file; the message says why, without the file's name."""


class DuplicateKey(yaml.YAMLError):
    """A mapping key given twice: ``key``, and the lines of its ``first`` and ``second`` appearance."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class TooLarge(yaml.YAMLError):
    """The document expands (through its aliases) to more than ``MAX_NODES`` values, or an alias
    holds itself."""


def _check_expanded_size(root: yaml.Node) -> None:
    """``TooLarge`` unless ``root`` expands to at most ``MAX_NODES`` values, counted without
    expanding anything (an alias is the same node object each time it is used: its size is
    computed once and added at each use)."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            size[key] = 1
            continue
        items = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(n)] for n in items)
            if size[key] > MAX_NODES:
                raise TooLarge(f"its aliases expand to more than {MAX_NODES:,} values; such a file is a few KB")
            continue
        if key in size:
            continue
        if key in on_path:
            raise TooLarge("an alias is used inside its own anchor")
        on_path.add(key)
        stack.append((node, True))
        for child in items:
            if id(child) in on_path:
                raise TooLarge("an alias is used inside its own anchor")
            if id(child) not in size:
                stack.append((child, False))


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<' merges may be overridden (YAML's rule); other key kinds fail below
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


# YAML 1.1's base-60 numbers are not read as numbers: `steps: [1:30]` was silently 90 steps (and
# `1:30.5` the float 90.5). Such a value stays text, which the field's check then refuses.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_UniqueKeyLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_unique(text: str) -> Any:
    """``yaml.safe_load(text)``, but ``DuplicateKey`` for a key given twice in one mapping; other
    problems raise PyYAML's own errors (``TooLarge`` is one), for the caller to word."""
    loader = _UniqueKeyLoader(text)  # reading starts here: a control character fails already
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node)  # before anything is built from it
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_text(path: Path | Traversable, what: str) -> str:
    """The UTF-8 text of ``path``, at most ``MAX_FILE_BYTES``; ``what`` names the kind of file in
    the message of a too-large one (``a search-space file``)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise YamlFileError(f"cannot read the file ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise YamlFileError(f"larger than {MAX_FILE_BYTES >> 20} MiB; {what} is a few KB of YAML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YamlFileError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
