"""The code's own imports: no import cycle between modules or packages, and no layer importing one above it.

Read from the source with `ast` (imports inside functions count: a lazy import is still a dependency a
reader has to follow). The layers, bottom to top, are ARCHITECTURE.md's."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("adaptune", "components", "pipelines", "bench")
# Bottom to top; a module may import its own layer and those below it. "adaptune" is the package's
# entry points (cli, __main__, healthcheck), above every subpackage; bench (the benchmarks, their drivers and
# the stand-ins the tests share) is above everything it measures, and nothing imports it but the tests.
LAYERS = ("adaptune.core", "adaptune.model", "adaptune.data", "adaptune.fused", "adaptune.train", "adaptune.report", "adaptune.sweep",
          "adaptune.serve", "adaptune", "components", "pipelines", "bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports: `from a.b import c` is a.b.c where that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest layer name that is the module or a package holding it."""
    matches = [index for index, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")]
    best = max(matches, key=lambda index: len(LAYERS[index]), default=None)
    if best is None or (LAYERS[best] == "adaptune" and module.count(".") > 1):
        raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS and ARCHITECTURE.md")
    return best


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    """The package a module belongs to for the package-level check: adaptune's subpackages, components, pipelines."""
    parts = module.split(".")
    if parts[0] == "adaptune" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0] if parts[0] != "adaptune" or len(parts) == 1 else ("adaptune." + parts[1] if (REPO / "adaptune" / parts[1]).is_dir() else "adaptune")


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{module} (layer {LAYERS[layer_of(module)]}) imports {target} (layer {LAYERS[layer_of(target)]})"
              for module, targets in sorted(import_graph().items()) for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        packages.setdefault(package_of(module), set()).update(package_of(target) for target in targets)
    for package, targets in packages.items():
        targets.discard(package)
    assert cycles(packages) == []


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    graph = {"adaptune.core.a": {"adaptune.model.b"}, "adaptune.model.b": {"adaptune.core.a"}, "adaptune.core.c": set()}
    assert cycles(graph) == [["adaptune.core.a", "adaptune.model.b"]]
    assert layer_of("adaptune.model.b") > layer_of("adaptune.core.a")
    assert layer_of("adaptune.report") == layer_of("adaptune.report.tables") < layer_of("adaptune.sweep") < layer_of("adaptune.cli")
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from adaptune.sweep.plan import plan\n    import adaptune.core.files\n")
    assert imported_modules(source, project_modules()) == {"adaptune.sweep.plan", "adaptune.core.files"}


def test_every_module_is_in_a_layer() -> None:
    for module in project_modules():
        layer_of(module)


if __name__ == "__main__":  # the report's figures: python tests/test_layers.py
    graph = import_graph()
    print("cycles:", cycles(graph))
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                print("upward:", module, "->", target)


def test_every_project_import_names_something_that_exists() -> None:
    """Imports inside functions are only run when the function is: a name moved away must fail here."""
    import importlib

    modules = project_modules()
    readers = {**modules, **{f"tests/{path.name}": path for path in sorted((REPO / "tests").glob("*.py"))},
               **{f"analysis/{path.name}": path for path in sorted((REPO / "analysis").glob("*.py"))}}
    missing = []
    for module, path in readers.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in PACKAGES:
                imported = importlib.import_module(node.module)
                missing += [f"{module}: from {node.module} import {alias.name}" for alias in node.names
                            if not hasattr(imported, alias.name) and f"{node.module}.{alias.name}" not in modules]
            elif isinstance(node, ast.Import):
                missing += [f"{module}: import {alias.name}" for alias in node.names
                            if alias.name.split(".")[0] in PACKAGES and alias.name not in modules]
    assert missing == []


def test_nothing_outside_tests_imports_tests() -> None:
    """The tests may import the project (bench included); no project module imports the tests."""
    found = []
    for module, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{module}: {name}" for name in names if name.split(".")[0] == "tests"]
    assert found == []


def test_no_module_imports_another_modules_private_names() -> None:
    """An underscored name is its module's own: another module that needs it needs a public name (tests may reach in)."""
    found = []
    for module, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in PACKAGES:
                found += [f"{module}: from {node.module} import {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and node.module != module]
    assert found == []
