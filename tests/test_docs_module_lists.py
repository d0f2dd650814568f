"""The documents' lists of modules held to the package: docs/architecture.md's "modules, by layer"
names every module of `hmer` under its folder, and docs/studies.md's tables of `hmer.studies` and of
`hmer.store` every module of those packages; none names a module that is not there.

A plug-in (`package_imports.plug_ins`: a module that registers a variant and that no other module
imports, such as a study of `hmer.studies.suite` or a decoder added to `hmer.model`) may be named and
need not be: it is found by the name it registers, and adding one is one file (docs/architecture.md,
"Add a decoder in one file"; docs/studies.md, "Add a study in one file";
tests/test_docs_one_file.py adds each in a copy of the checkout)."""

from __future__ import annotations

import re

import pytest
from package_imports import MODULES, ROOT, plug_ins

ARCHITECTURE = ROOT / "docs" / "architecture.md"
STUDIES = ROOT / "docs" / "studies.md"


def _modules() -> set[str]:
    """Every module and subpackage of `hmer` by dotted name, less the package itself and `__main__`
    (`python -m` of a package)."""
    return {name for name in MODULES if "." in name and not name.endswith(".__main__")}


def _named(text: str) -> list[str]:
    """The backticked names of a list item that stand outside any parentheses: the module names
    (what is in parentheses describes the module before it). Backticks hide their contents, so
    `run_study(name)` opens no parenthesis."""
    names, depth, in_code, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == "`":
            if in_code and depth == 0:
                names.append(text[start:i])
            in_code, start = not in_code, i + 1
        elif not in_code:
            depth += {"(": 1, ")": -1}.get(char, 0)
    return names


def _architecture_list() -> dict[str, list[str]]:
    """docs/architecture.md's list of modules by layer: a package (`hmer.data`, `hmer` for the
    foundation) to the names its item gives, and a top-level module (`hmer.model_presets`) to []."""
    block = ARCHITECTURE.read_text().split("The modules, by layer:", 1)[1].split("\n\n", 2)[1]
    items = re.split(r"^- ", block, flags=re.MULTILINE)[1:]
    listed = {}
    for item in items:
        label, _, rest = " ".join(item.split()).partition(": ")
        if label == "Foundation":
            listed["hmer"] = _named(rest)
        elif label.startswith("`") and label.endswith("/`"):
            listed["hmer." + label.strip("`/")] = _named(rest)
        elif label.startswith("`") and label.endswith(".py`"):
            listed["hmer." + label.strip("`").removesuffix(".py")] = []
        else:
            raise AssertionError(f"docs/architecture.md: a list item of no layer: {label!r}")
    return listed


def test_the_architecture_list_names_every_module():
    listed = _architecture_list()
    named = (set(listed) - {"hmer"}) | {f"{package}.{name}" for package, names in listed.items() for name in names}
    modules = _modules()
    missing = sorted(modules - named - plug_ins())
    assert not missing, (f"docs/architecture.md's list of modules by layer does not name {', '.join(missing)}: "
                         "add each to its folder's item")
    stale = sorted(named - modules)
    assert not stale, f"docs/architecture.md's list of modules by layer names {', '.join(stale)}, not in src/hmer"


@pytest.mark.parametrize("package, heading", [("hmer.studies", "## How the library is laid out"),
                                              ("hmer.store", "## The committed store's upkeep")])
def test_the_studies_tables_name_every_module_of_their_package(package, heading):
    section = STUDIES.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = {f"{package}.{name}" for row in rows for name in _named(row)}
    modules = {m for m in _modules() if m.startswith(f"{package}.") and m.count(".") == 2}
    missing = sorted(modules - named - plug_ins())
    assert not missing, f"docs/studies.md's table of {package} modules lacks {', '.join(missing)}"
    stale = sorted(named - modules)
    assert not stale, f"docs/studies.md's table of {package} modules names {', '.join(stale)}, not in the package"


def test_plug_ins_are_the_modules_that_register_and_that_nothing_imports():
    """The exception above can fail to apply: a module others import, or one that registers nothing,
    is no plug-in, and the lists must name it."""
    found = plug_ins()
    assert {"hmer.studies.suite.ablate_direction", "hmer.studies.suite.sweep"} <= found
    assert "hmer.evaluation.metrics" not in found  # registers the papers' metrics, and is imported
    assert "hmer.training.fingerprint_training" not in found  # imported by nothing, and registers nothing
    assert "hmer.studies.suite" not in found
