"""The README's layout is the architecture: a module imports only from its own group and the groups
listed under it (every import of the package, at the top of a module or inside a function)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "finetune"


def readme_layers() -> dict[str, int]:
    """Each module (`commands.run`, `layout`) and its group's depth in the README, 0 at the top."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("    finetune/ ") : text.index("    tests/ ")]
    depth, layers = -1, {}
    for line in block.splitlines():
        if line.startswith("      # "):
            depth += 1
        elif match := re.match(r"^      ([\w/]+)\.py ", line):
            layers[match.group(1).replace("/", ".")] = depth
    return layers


def package_imports(path: Path) -> set[str]:
    """The package's modules `path` imports, by their dotted names under finetune."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "finetune":
            if node.module in ("finetune", "finetune.commands"):
                prefix = node.module.removeprefix("finetune").lstrip(".")
                imported |= {f"{prefix}.{alias.name}".lstrip(".") for alias in node.names}
            else:
                imported.add(node.module.removeprefix("finetune."))
        elif isinstance(node, ast.Import):
            imported |= {
                alias.name.removeprefix("finetune.")
                for alias in node.names
                if alias.name.startswith("finetune.")
            }
    return imported


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        if not name.endswith("__init__") and name != "__main__":
            found[name] = path
    return found


def test_every_module_is_in_one_layer_of_the_readme():
    assert sorted(readme_layers()) == sorted(modules())


def test_no_module_imports_from_a_layer_above_its_own():
    layers = readme_layers()
    upward = [
        f"{name} ({layers[name]}) imports {imported} ({layers[imported]})"
        for name, path in modules().items()
        for imported in sorted(package_imports(path))
        if imported in layers and layers[imported] < layers[name]
    ]
    assert upward == []


def test_the_ground_floor_imports_nothing_of_the_package_but_itself():
    layers = readme_layers()
    floor = max(layers.values())
    ground = {name for name, depth in layers.items() if depth == floor}
    assert {"callbacks", "errors", "layout"} <= ground
    reaching_up = {name: package_imports(modules()[name]) - ground for name in ground}
    assert {name: found for name, found in reaching_up.items() if found} == {}
