"""Imports point down the layers drawn in docs/architecture.md.

A package may import its own modules and those of the layers below it. The
imports that still point up are listed in ``KNOWN_UPWARD`` (importing file,
imported module): the test fails on a new one, and on a listed one that is gone
(take it off the list), so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# higher imports lower; spark sits beside the engine and is used by it
LAYERS = {"raystream": 6, "engine": 5, "spark": 4, "actors": 3, "timers": 2, "checkpoint": 1,
          "core": 0}

KNOWN_UPWARD: set[tuple[str, str]] = set()


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "raystream":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "raystream"


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules = [node.module]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    continue
                for module in modules:
                    target = package_of(module)
                    if target is not None and LAYERS[target] > LAYERS[package]:
                        found.add((str(path.relative_to(ROOT)), module))
    return found


def test_imports_point_down_the_layers():
    found = upward_imports()
    new = sorted(found - KNOWN_UPWARD)
    gone = sorted(KNOWN_UPWARD - found)
    assert not new, ("imports that point up the layers of docs/architecture.md (move the "
                     "shared thing down instead):\n" + "\n".join(map(str, new)))
    assert not gone, "no longer imported: take these off KNOWN_UPWARD\n" + "\n".join(map(str, gone))


def test_no_module_imports_another_ones_private_names():
    """A name with a leading underscore belongs to its module: a module that needs
    another's makes it public (or the two share it from a module below both)."""
    found = []
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raystream"):
                    found += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
                              for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)
