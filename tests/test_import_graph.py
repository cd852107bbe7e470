"""The import graph of energon_pack: layers only import downwards, no module loop, no folder loop.

Every ``import`` / ``from ... import`` of an ``energon_pack`` module counts, lazy ones inside
functions included. A new module must be placed in ``LAYERS``.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "energon_pack"

#: Lowest first. A module may import modules of its own layer or of lower ones.
LAYERS: list[tuple[str, list[str]]] = [
    ("base: no package imports", [
        "__init__", "alignment", "errors", "tables", "cache", "workers", "qwen.family", "pinning", "skip_log", "stage_times",
        "energon_fixes",
    ]),
    ("config and pure cores", [
        "config", "loss_reduction", "dataset_path", "visual", "conversation", "packing.algorithms",
        "packing.planner", "packing.budget", "packing.global_plan", "plan.file",
    ]),
    ("Qwen-VL model family", ["qwen.*"]),
    ("sample types, rows, statistics, data", [
        "samples", "encoded", "thd", "stats", "step", "prepare", "synthetic", "packing.simulate",
    ]),
    ("the packing stage", ["packing.wrapper", "state_check"]),
    ("Energon task encoder", ["task_encoder"]),
    ("pack plans", ["plan", "plan.*"]),
    ("loader", ["loader"]),
    ("trainer integrations", ["bridge", "bridge.*"]),
    ("commands and tools", ["inspect_dataset", "demo", "simulate_cli", "tools", "tools.*", "cli"]),
]
#: Sub-packages that no import path may leave and re-enter.
FOLDERS = ("bridge", "packing", "plan", "qwen", "tools")


def module_names() -> list[str]:
    """Dotted names below energon_pack, e.g. ``packing.wrapper``; a package is its ``__init__``."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        names.append(".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts))
    return names


def imports_of(name: str, known: set[str]) -> set[str]:
    """Package modules that module ``name`` imports (anywhere in its source)."""
    relative = name.replace(".", "/")
    path = PACKAGE / f"{relative}.py"
    if not path.exists():
        path = PACKAGE / relative / "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("energon_pack"):
            base = node.module.removeprefix("energon_pack").lstrip(".")
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                found.add(candidate if candidate in known else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("energon_pack."):
                    found.add(alias.name.removeprefix("energon_pack."))
    return {module for module in found if module and module != name}


def graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {name: imports_of(name, known) for name in names}


def layer_of(name: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"module energon_pack.{name} has no layer: add it to LAYERS in {__file__}")


def test_imports_never_go_up_a_layer():
    wrong = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not wrong, "imports from a lower layer to a higher one:\n" + "\n".join(wrong)


def test_no_module_loop():
    edges = graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import loop: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        for target in sorted(edges[module]):
            visit(target, path + [module])
        done.add(module)

    for module in edges:
        visit(module, [])


def test_no_path_leaves_a_folder_and_comes_back():
    edges = graph()
    for folder in FOLDERS:
        inside = {m for m in edges if m == folder or m.startswith(f"{folder}.")}
        outside = {target for module in inside for target in edges[module]} - inside
        reached: set[str] = set()
        while outside - reached:
            module = (outside - reached).pop()
            reached.add(module)
            back = edges[module] & inside
            assert not back, f"{folder}/ -> ... -> {module} -> {sorted(back)}: a loop through folder {folder}/"
            outside |= edges[module]


def test_the_graph_is_read():
    """Guards the checks above: known edges are found, lazy imports included."""
    edges = graph()
    assert "packing.planner" in edges["packing.wrapper"] and "alignment" in edges["config"]
    assert "cli" not in {target for targets in edges.values() for target in targets}
    assert "demo" in edges["cli"]  # imported inside a function
