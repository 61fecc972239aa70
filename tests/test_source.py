"""The package's source, read as text: what no linter here catches."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "finetune"


def redefined_methods(source: str) -> list[str]:
    """Methods a class body defines twice (the later silently replaces the earlier), property setters
    and deleters aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = [
            item.name
            for item in node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not any(isinstance(d, ast.Attribute) for d in item.decorator_list)  # @x.setter
        ]
        found += [f"{node.name}.{name}" for name, count in Counter(methods).items() if count > 1]
    return found


def test_no_class_defines_a_method_twice():
    """A second `_run_epoch` in FinetuneTrainer once replaced the first, and every resumed run's
    train_loss with it; ruff's F811 did not flag it."""
    twice = {
        str(path.relative_to(PACKAGE)): methods
        for path in sorted(PACKAGE.rglob("*.py"))
        if (methods := redefined_methods(path.read_text()))
    }
    assert twice == {}


def test_a_method_defined_twice_is_found():
    source = "class A:\n    def f(self):\n        pass\n\n    def f(self):\n        pass\n"
    assert redefined_methods(source) == ["A.f"]
