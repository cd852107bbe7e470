"""The import graph of energon_pack: layers only import downwards, no module loop, no folder loop;
and the tests mirror it: a tests folder per package folder, helpers only in ``tests/support``.

Every ``import`` / ``from ... import`` of an ``energon_pack`` module counts, lazy ones inside
functions included. A new module must be placed in ``LAYERS``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

PACKAGE = REPO / "energon_pack"
TESTS = REPO / "tests"
#: Test folders named for what they prove rather than for a package folder.
CROSS_CUTTING = {"golden", "loader", "tutorials", "package"}

#: Lowest first: a package folder (or a module at the package root) may import its own modules and
#: those of lower entries, never of higher ones. A new folder or root module must be placed here.
LAYERS: list[tuple[str, list[str]]] = [
    ("the root's base: errors, lazy public names", ["__init__", "errors"]),
    ("core: shared types and small helpers", ["core"]),
    ("config: the packing configuration", ["config"]),
    ("identity: every fingerprint and their comparison", ["identity"]),
    ("qwen: the Qwen-VL family (media, tokens, pixels, rope)", ["qwen"]),
    ("formats: the dataset formats read in place, and the reader dispatch", ["formats"]),
    ("rows: THD row assembly", ["rows"]),
    ("metrics: trainer log figures of rows (loss per source, shares, fill)", ["metrics"]),
    ("packing: pure bin selection, budgets, simulator", ["packing"]),
    ("runtime: the Energon task encoder and packing stage", ["runtime"]),
    ("plan: global pack plans", ["plan"]),
    ("loader: get_packing_loader", ["loader"]),
    ("data: prepare, inspect, synthetic", ["data"]),
    ("bridge: Megatron-Bridge", ["bridge"]),
    ("tools: benchmarks", ["tools"]),
    ("cli: the energon-pack command", ["cli"]),
]
#: Sub-packages that no import path may leave and re-enter.
FOLDERS = tuple(sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()))
#: Most modules at the package root besides sub-packages.
MAX_ROOT_MODULES = 8


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


def unit_of(name: str) -> str:
    """The folder of a module (``packing.budget`` -> ``packing``), or the root module itself."""
    return name.split(".")[0]


def layer_of(name: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit_of(name) in units:
            return index
    raise AssertionError(f"energon_pack.{name} is in no layer: add {unit_of(name)!r} to LAYERS in {__file__}")


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
    assert "packing.planner" in edges["runtime.packing_stage"] and "core.alignment" in edges["config.values"]
    assert "cli" not in {unit_of(target) for module, targets in edges.items() if unit_of(module) != "cli" for target in targets}
    assert "cli.demo" in edges["cli"]  # imported inside a function


def test_every_folder_and_root_module_has_a_layer():
    placed = {unit for _, units in LAYERS for unit in units}
    assert {unit_of(name) for name in graph()} == placed
    assert len(FOLDERS) >= 8, FOLDERS


def test_the_root_holds_few_modules():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}; move some into a layer folder"


def _test_folders() -> set[str]:
    return {path.name for path in TESTS.iterdir() if (path / "__init__.py").exists()} - {"support"}


def test_every_package_folder_has_its_tests_folder():
    missing = sorted(set(FOLDERS) - _test_folders())
    assert not missing, f"package folders without a tests folder: {missing}; add tests/<folder>/ with __init__.py"


def test_every_tests_folder_mirrors_a_package_folder_or_a_cross_cutting_suite():
    strays = sorted(_test_folders() - set(FOLDERS) - CROSS_CUTTING)
    assert not strays, f"tests folders {strays} match no package folder; name them after one, or add to CROSS_CUTTING"


def test_tests_hold_only_test_modules_and_helpers_only_support():
    top = sorted(path.name for path in TESTS.glob("*.py") if path.name not in {"__init__.py", "conftest.py"})
    assert not top, f"{top} at the top of tests/: move tests into their folder, helpers into tests/support/"
    helpers = sorted(str(path.relative_to(TESTS)) for folder in _test_folders() for path in (TESTS / folder).glob("*.py")
                     if not path.name.startswith("test_") and path.name != "__init__.py")
    assert not helpers, f"helpers outside tests/support/: {helpers}"


def _imported_test_modules(source: str) -> set[str]:
    """The ``tests.*`` modules that Python ``source`` imports which are not under ``tests.support``.

    Example: ``"from tests.loader.test_loader_resume import W"`` -> ``{"tests.loader.test_loader_resume"}``.
    """
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
        if isinstance(node, ast.ImportFrom) and node.module == "tests":
            names = [f"tests.{alias.name}" for alias in node.names]
        found |= {name for name in names if name.startswith("tests.") and not name.startswith("tests.support")}
    return found


def test_support_and_tests_import_no_test_module():
    """A test module shares helpers through ``tests/support`` only; support never imports a test."""
    offenders = {str(path.relative_to(TESTS)): sorted(found) for path in sorted(TESTS.rglob("*.py"))
                 if (found := _imported_test_modules(path.read_text(encoding="utf-8")))}
    assert not offenders, f"imports of test modules (move what they share into tests/support/): {offenders}"


def test_the_test_import_check_finds_one():
    """Guards the check above: test modules are found, support modules are not."""
    assert _imported_test_modules("from tests.loader.test_loader_resume import W\nimport tests.cli.test_cli") == {
        "tests.loader.test_loader_resume", "tests.cli.test_cli"}
    assert _imported_test_modules("from tests import test_x\nfrom tests.support.paths import REPO") == {"tests.test_x"}
