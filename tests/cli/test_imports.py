"""The CLI's modules import each other without a circle (issue 39): ``app.py`` builds the parser
from the registry (``cli/commands/__init__.py``), each command module imports only the shared
argument, store-option and table modules. Every import line counts, inside a function too."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "raycompat" / "cli"


def _module(path: Path) -> str:
    parts = path.relative_to(CLI.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each CLI module -> the CLI modules it imports."""
    modules = {_module(p): p for p in CLI.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    return next((c for c in map(lambda n: visit(n, []), sorted(graph)) if c), None)


def test_the_cli_modules_import_each_other_without_a_circle():
    graph = import_graph()
    assert "raycompat.cli.commands.search" in graph["raycompat.cli.commands"]  # the walk works
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_check_finds_a_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
