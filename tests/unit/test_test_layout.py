"""No test module imports another (issue 32, point 5): what several test modules share lives in
tests/support/ and is imported as ``support.<module>``. Every Python file under tests/ (the test
modules, tests/support/ and conftest.py) is parsed with ``ast`` and each import in it is checked:
``import test_x``, ``from test_x import ...``, ``from e2e.test_x import ...``, ``from e2e import
test_x``, ``from . import test_x`` and ``importlib.import_module("test_x")``/``__import__("test_x")``
fail the test when ``test_x`` is a test module (a ``test_*.py`` under tests/), naming the file and
line. An import of a test module works only when pytest happened to put that module's folder on
sys.path first, imports its tests and fixtures with it, and ties one module's tests to another's
helpers."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def module_names_of_tests(root: Path) -> set[str]:
    """The names the test modules under ``root`` import as (pytest's rootdir-relative basenames)."""
    return {p.stem for p in root.rglob("test_*.py") if "__pycache__" not in p.parts}


def _parts(module: str | None) -> list[str]:
    return module.split(".") if module else []


def imports_of_test_modules(source: str, filename: str, names: set[str]) -> list[str]:
    """``file:line: what`` for each import in ``source`` of a module in ``names``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.stmt | ast.expr):  # an import is a statement, import_module() a call
            continue
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [part for alias in node.names for part in _parts(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            # the module's own path, and each name taken from it (it may be a submodule: `from e2e
            # import test_x`, `from . import test_x`)
            imported = _parts(node.module) + [alias.name for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if called in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                imported = _parts(arg.value) if isinstance(arg.value, str) else []
        for name in imported:
            if name in names:
                found.append((node.lineno, f"{filename}:{node.lineno}: imports the test module {name}"))
    return [hit for _line, hit in sorted(found)]


def test_no_test_module_imports_another() -> None:
    """Every Python file under tests/ is free of imports of test modules; a failure lists each
    offending import with its file and line (move the shared helper into tests/support/)."""
    names = module_names_of_tests(TESTS)
    assert len(names) > 100  # the walk found the test modules (a wrong root would pass vacuously)
    files = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)
    found = [
        hit
        for path in files
        for hit in imports_of_test_modules(path.read_text(), str(path.relative_to(TESTS)), names)
    ]
    assert found == [], "test modules imported (shared helpers belong in tests/support/):\n" + "\n".join(
        found
    )


def test_test_module_names_are_unique() -> None:
    """No two test modules under tests/ share a file name (issue 32: tests/unit/ mirrors the package
    in folders without ``__init__.py``, as tests/integration/ does): pytest's default import mode
    imports each as its base name, so a second ``test_x.py`` fails the run that collects both with
    "import file mismatch". A failure lists each name with its files."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if "__pycache__" not in path.parts:
            by_name.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    assert len(by_name) > 100  # the walk found the test modules
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}, "test modules sharing a file name (rename one):\n" + "\n".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items())
    )


def test_the_check_finds_each_form_of_import() -> None:
    """The checker itself: each way of importing a test module is found, with its line; imports of
    support modules, of modules that merely start with ``test`` and of names that are not modules
    are not."""
    names = {"test_a", "test_b"}
    source = "\n".join(
        [
            "import test_a",
            "import test_b as b",
            "from test_a import helper",
            "from e2e.test_b import fixture as fixture",
            "from e2e import test_a",
            "from . import test_b",
            "import importlib; importlib.import_module('test_a')",
            "__import__('unit.test_b')",
            "from support.fake_kafka import drain",
            "import test_c, testing",
            "from support.x import test_helper",
            "importlib.import_module(name)",
        ]
    )
    found = imports_of_test_modules(source, "t.py", names)
    assert [line.split(":")[1] for line in found] == [str(n) for n in range(1, 9)]
    assert imports_of_test_modules("from support.delta import land_values\n", "t.py", names) == []
