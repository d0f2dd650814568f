"""The layers of docs/architecture.md held to the code: every import statement of the package and of
the scripts of tools/, at module level or inside a function (or under TYPE_CHECKING), is read with
`ast`; each layer imports exactly the layers its line of the picture names, only layers drawn below
it, and no module's imports lead back to itself, the tools' included."""

from __future__ import annotations

import re

from package_imports import GRAPH, PATHS, ROOT, SCRIPTS

DOC = ROOT / "docs" / "architecture.md"
FIX = "docs/architecture.md's picture of the layers"


def _layer(module: str) -> str:
    """`hmer.training.final` -> `training`, `hmer.model_presets` -> `presets`, `tools.lease` -> `tools`; the
    root package is foundation."""
    parts = module.split(".")
    if parts[0] == "tools":
        return "tools"
    return parts[1] if len(parts) > 1 else "foundation"


def _picture() -> tuple[list[tuple[list[str], set[str] | None]], set[str]]:
    """The picture's layers from the top down, each with the layers its line says it imports (None on
    a line that names none), and the foundation (its last line of names)."""
    block = DOC.read_text().split("## Layers", 1)[1].split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        names = re.match(r"((?:[a-z_]+(?:/|\.py),?\s+)+)", line + " ")
        if not names:
            continue
        layers = [n.strip(",").removesuffix("/").removesuffix(".py") for n in names.group(1).split()]
        listed = {n.strip() for n in line.rsplit(" -> ", 1)[1].split(",")} if " -> " in line else None
        lines.append((layers, listed))
    (foundation, _), layers = lines[-1], lines[:-1]
    return layers, set(foundation)


def test_every_module_is_in_a_layer_of_the_picture():
    layers, foundation = _picture()
    drawn = foundation | {name for names, _ in layers for name in names}
    missing = sorted({_layer(m) for m in PATHS} - drawn - {"foundation"})
    assert not missing, f"{missing} are not in {FIX}: add each where it belongs"


def test_each_layer_imports_exactly_the_layers_its_line_names_and_only_lower_ones():
    layers, foundation = _picture()
    found: dict[str, dict[str, str]] = {}  # layer -> imported layer -> one example
    for module, imported in GRAPH.items():
        for target, line in imported.items():
            a, b = _layer(module), _layer(target)
            a, b = ("foundation" if a in foundation else a), ("foundation" if b in foundation else b)
            if a != b:
                found.setdefault(a, {}).setdefault(b, f"{PATHS[module].relative_to(ROOT)}:{line} imports {target}")
    upward = found.get("foundation", {})
    assert not upward, f"the foundation imports only itself: {sorted(upward.values())}"
    below = set(foundation)
    for names, listed in reversed(layers):  # from the bottom up
        for name in names:
            actual = {b for b in found.get(name, {}) if b != "foundation"}
            listed = listed or set()
            assert actual == listed, (
                f"{name} imports {sorted(actual)} but {FIX} says {sorted(listed)}: "
                f"{sorted(v for k, v in found.get(name, {}).items() if k in actual ^ listed)}")
            assert listed <= below, f"{name} imports {sorted(listed - below)}, drawn above it in {FIX}"
        below |= set(names)


def test_no_module_imports_lead_back_to_itself():
    """No cycle, through module-level or function-level imports alike (Tarjan's strongly
    connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    described = [" <-> ".join(f"{m} ({', '.join(f'{t}:{line}' for t, line in GRAPH[m].items() if t in c)})" for m in c)
                 for c in cycles]
    assert not cycles, f"import cycles: {described}"


def test_the_checks_see_function_level_imports_and_the_picture():
    """The checks above can fail: they see an import inside a function, and the picture's lines."""
    assert "hmer.model_presets" in GRAPH["hmer.cli.data"]  # imported inside a function there
    layers, foundation = _picture()
    assert {"config", "registry"} <= foundation and ["cli"] in [names for names, _ in layers]
    if SCRIPTS:  # (a copy of the checkout without tools/ has none)
        assert "tools.lease" in GRAPH["tools.gpu_campaign"]  # a bare name, beside the script
        assert "hmer.training.carry" in GRAPH["tools.gpu_campaign_steps"]  # inside a function there
        assert layers[0][0] == ["tools"]
    assert all(listed is None for names, listed in layers if "decoding" in names)
