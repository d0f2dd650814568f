"""The package's modules, the scripts of tools/, and the imports between them, read with `ast`
(nothing is imported): what tests/test_layers.py holds to the picture of the layers, and what
tests/test_docs_module_lists.py reads to tell a plug-in from a module that others build on.

A script of tools/ runs with its folder first on the path (`python tools/gpu_campaign.py`), so it
imports another by its bare name (`from lease import Lease`); it is named here `tools.<name>`, and
its layer is `tools`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hmer"
TOOLS = ROOT / "tools"


def package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its `__init__`)."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def tool_scripts() -> dict[str, Path]:
    """Every script of tools/ as `tools.<name>` (none in a copy of the checkout without the folder)."""
    return {f"tools.{path.stem}": path for path in sorted(TOOLS.glob("*.py"))}


MODULES = package_modules()
SCRIPTS = tool_scripts()
PATHS = {**MODULES, **SCRIPTS}  # every node of the graph: the package's modules and the tools


def module_imports(name: str) -> dict[str, int]:
    """The modules of the package and the scripts of tools/ that module `name` (either) imports, at
    module level or inside a function, each with the line of its first import."""
    path = PATHS[name]
    package = "" if name in SCRIPTS else name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            # `from . import distributed` imports the submodule; `from .setup import build` the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]
        else:
            continue
        for target in targets:
            if name in SCRIPTS and f"tools.{target}" in SCRIPTS:  # `import lease`, beside the script
                target = f"tools.{target}"
            while target and target not in PATHS:  # hmer.data.vocab.Vocab -> hmer.data.vocab; torch -> ""
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {name: module_imports(name) for name in PATHS}


def registers(name: str) -> bool:
    """Whether module `name` registers a variant as it runs: a definition decorated with, or a
    statement of its top level calling, `NAME.register(...)` on a name it imports (a registry of
    `hmer.registry`, `hmer.studies.spec.STUDIES`)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}

    def registration(node: ast.AST | None) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                and isinstance(node.func.value, ast.Name) and node.func.value.id in imported)

    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and any(map(registration, node.decorator_list)):
            return True
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) and registration(node.value):
            return True
    return False


def plug_ins() -> set[str]:
    """The modules that register a variant and that no other module imports: their package imports
    every one of its modules (`hmer.registry.import_submodules`), and each is found by the name it
    registers (`hmer models`, `hmer study`), so nothing else needs to name it."""
    imported = {target for targets in GRAPH.values() for target in targets}
    return {name for name in MODULES if name not in imported and registers(name)}
