"""No function of mqd/ is over 100 lines (issue 32): a long function is where mechanisms hide from
the code map. ruff's C901/PLR0915 budget (pyproject.toml) bounds complexity and statements; this
bounds length, which neither rule measures."""

from __future__ import annotations

import ast
from pathlib import Path

MQD = Path(__file__).resolve().parents[2] / "mqd"
LIMIT = 100


def long_functions(root: Path, limit: int) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > limit:
                    found.add((path.relative_to(root).as_posix(), node.name))
    return found


def test_no_function_is_over_100_lines() -> None:
    assert long_functions(MQD, LIMIT) == set()


def test_the_check_measures_from_def_to_last_line(tmp_path: Path) -> None:
    """A function of exactly ``limit`` lines passes, one more line fails, async ones too."""
    (tmp_path / "m.py").write_text(
        "def ok():\n" + "    x = 1\n" * 4 + "\n\nasync def long():\n" + "    x = 1\n" * 5
    )
    assert long_functions(tmp_path, 5) == {("m.py", "long")}
