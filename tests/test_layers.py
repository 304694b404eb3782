"""The import graph of the project's packages has no circles, and the package face is light.

Every ``import`` of a project module (module level or inside a function: a lazy import is still
a dependency) is an edge. Importing ``a.b.c`` also runs ``a/b/__init__.py``, so it is an edge
to each enclosing package too, except the importer's own ancestors (a package's ``__init__``
re-exporting its submodules, which import their siblings, is not a circle). The same graph is
then collapsed to the layers of ARCHITECTURE (``nas.search``, ``nas.latency``, ``kernels``…),
where a circle (say ``nas.search`` ↔ ``nas.results``) fails too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nas", "kernels", "search_spaces", "hardware_profiles")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets.add(prefix)
            targets.update(f"{prefix}.{alias.name}" for alias in node.names)  # "from pkg import module"
    edges = set()
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            module = ".".join(parts[:i])
            if module in modules and module != name and module not in ancestors:
                edges.add(module)
    return edges


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "nas" and len(parts) > 1:
        return ".".join(parts[:2])
    if parts[0] == "kernels" and len(parts) > 1 and parts[1] != "errors" and not parts[1].startswith("_"):
        return ".".join(parts[:2])
    return parts[0] if parts[0] != "kernels" else "kernels"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_finds_a_circle_when_there_is_one():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_module_graph_has_no_circles():
    graph = _graph()
    assert "nas.models.triton_model" in graph and graph["nas.search.study"], "the walk found the modules"
    cycle = _find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_layer_graph_has_no_circles():
    layers: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _layer(module)
        layers.setdefault(mine, set()).update(t for t in map(_layer, targets) if t != mine)
    cycle = _find_cycle(layers)
    assert cycle is None, "circle between layers: " + " -> ".join(cycle)
    assert not any(t.startswith("nas") for k, ts in layers.items() if not k.startswith("nas") for t in ts), (
        "kernels, search_spaces and hardware_profiles never import nas"
    )


@pytest.mark.parametrize("statement", ["import nas.spec", "import nas", "import nas.cli"])
def test_package_face_does_not_load_torch_or_optuna(statement):
    code = (
        f"{statement}; import sys; heavy = [m for m in ('torch', 'optuna') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
