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


def runtime_imports() -> dict[str, set[str]]:
    """Module -> the raystream modules it imports when it runs (at module level or in a
    function; not those under ``if TYPE_CHECKING:``, which only the type checker reads)."""
    modules = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("raystream", *parts) if package != "raystream" else parts)
            modules[name.removesuffix(".__init__")] = path

    def resolve(name: str) -> str | None:  # a module, or the module a name is defined in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        found = graph.setdefault(name, set())
        for node in ast.walk(tree):
            if (id(node) in typing_only or not isinstance(node, ast.ImportFrom) or node.level
                    or not (node.module or "").startswith("raystream")):
                continue
            module = node.module or ""
            for target in [resolve(f"{module}.{a.name}") for a in node.names] + [resolve(module)]:
                # a package importing its own modules (its __init__) is no cycle
                if target and target != name and not target.startswith(f"{name}.") \
                        and not name.startswith(f"{target}.") and target != "raystream":
                    found.add(target)
    return graph


def test_no_import_cycles_at_run_time():
    """No two modules need each other when they run: a function-level import that hides a
    cycle is still one (the thing both need moves to a module of its own)."""
    graph = runtime_imports()
    cycles = []
    for start in graph:  # a depth-first search from each module for a path back to it
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for target in graph.get(node, ()):
                if target == start:
                    cycles.append(" -> ".join([*path, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:20])


def test_the_job_master_implements_what_subtasks_call():
    """Subtasks reach their job master only through actors/master_gateway.py: every
    method of its JobMasterEndpoint is the job master's, with the same parameters."""
    import inspect

    from raystream.actors.master_gateway import JobMasterEndpoint
    from raystream.engine.job_master import JobMaster

    master = JobMaster.__ray_metadata__.modified_class  # the class under Ray's actor wrapper
    methods = [n for n, v in vars(JobMasterEndpoint).items()
               if callable(v) and not n.startswith("_")]
    assert len(methods) == 6
    for name in methods:
        expected = list(inspect.signature(getattr(JobMasterEndpoint, name)).parameters)
        got = [p for p in inspect.signature(getattr(master, name)).parameters
               if p != "_ray_trace_ctx"]  # (Ray's tracing adds it to actor methods)
        assert got == expected, name
