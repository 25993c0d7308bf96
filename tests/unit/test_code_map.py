"""docs/architecture.md is a map kept true (issue 32, point 5).

The rules, so a failure says what to write:

- **Every module is on the map.** Each ``.py`` file under ``mqd/`` is named in docs/architecture.md,
  either by its repo path (``mqd/landing/sink.py``) anywhere on the page, or in backticks by its path
  relative to a package whose ``###`` section heading names that package in backticks: under
  ``### Landing (`mqd/landing/`)`` the row `` `sink.py` `` names ``mqd/landing/sink.py``, and under
  ``### Consumer engine (`mqd/consumer/`)`` the text `` `allocation/sticky.py` `` names
  ``mqd/consumer/allocation/sticky.py``. Two kinds need no line of their own: a package's
  ``__init__.py`` once the package itself is named (``mqd/x/`` or, in a section, ``x/``), and a
  private ``_*.py`` module once its package is named.
- **Every path named exists.** Any word that looks like a repo path (it starts with ``mqd/``,
  ``tests/``, ``docs/``, ``bench/`` or ``devtools/``), in backticks or not, in docs/architecture.md
  or in docs/decisions/*.md, names a file or folder that exists. Patterns are allowed: ``*``, ``?``
  and ``[...]`` are globs, and a placeholder such as ``<area>``, ``…`` or ``...`` matches anything; a
  pattern must match at least one path.
- **History is marked.** A decision may name a path that is gone (the code moved on after the
  decision). Write ``(historical)`` right after the path, e.g. `` `mqd/old_module.py` (historical)``;
  the check skips it. In a decision that is still current, fix the path instead.
- **The page stays a map**: at most 300 lines.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
DECISIONS = ROOT / "docs" / "decisions"
MAX_LINES = 300

# a word that looks like a repo path; not preceded by a path character, so a URL's tail or the
# relative part of a longer path does not count
_REPO_PATH = re.compile(r"(?<![\w/.\-])((?:mqd|tests|docs|bench|devtools)/[\w./<>*?\[\]…\-]*)")
_HISTORICAL = re.compile(r"`?\s*\(historical\)")
_SECTION = re.compile(r"^### .*$", re.MULTILINE)
_BACKTICKED = re.compile(r"`([^`\n]+)`")


def modules(root: Path = ROOT) -> list[str]:
    """Every .py file of the mqd package, as a repo path."""
    return sorted(
        p.relative_to(root).as_posix() for p in (root / "mqd").rglob("*.py") if "__pycache__" not in p.parts
    )


def package_sections(text: str) -> dict[str, set[str]]:
    """For each package a ``###`` heading names (``mqd/landing/``): every backticked word of its sections."""
    found: dict[str, set[str]] = {}
    heads = list(_SECTION.finditer(text))
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[head.end() : end]
        for pkg in _BACKTICKED.findall(head.group(0)):
            if pkg.startswith("mqd") and pkg.endswith("/"):
                found.setdefault(pkg, set()).update(_BACKTICKED.findall(body))
    return found


def is_named(path: str, text: str, sections: dict[str, set[str]]) -> bool:
    """Whether ``path`` (a module, or a package folder ending in ``/``) is named on the page."""
    if re.search(rf"(?<![\w/.\-]){re.escape(path)}(?![\w/])", text):
        return True
    for pkg, words in sections.items():
        if path.startswith(pkg) and path != pkg and path[len(pkg) :] in words:
            return True
    return False


def unnamed_modules(text: str, root: Path = ROOT) -> list[str]:
    sections = package_sections(text)
    missing = []
    for module in modules(root):
        folder, _, name = module.rpartition("/")
        if name.startswith("_") and is_named(folder + "/", text, sections):
            continue  # __init__.py, __main__.py and private modules: named by their package
        if not is_named(module, text, sections):
            missing.append(module)
    return missing


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """Repo paths named in ``text`` that match nothing under ``root`` (historical ones skipped)."""
    missing = []
    for m in _REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".,;:")
        if _HISTORICAL.match(text, m.end()):
            continue
        pattern = re.sub(r"<[^>]*>|…|\.\.\.", "*", path)
        if not glob.glob(pattern, root_dir=root):
            missing.append(path)
    return missing


def test_every_module_of_mqd_is_on_the_map() -> None:
    missing = unnamed_modules(MAP.read_text(encoding="utf-8"))
    assert not missing, (
        f"modules without a line in docs/architecture.md (see this test's docstring): {missing}"
    )


def test_every_path_the_map_and_the_decisions_name_exists() -> None:
    problems = {}
    for doc in [MAP, *sorted(DECISIONS.glob("*.md"))]:
        missing = missing_paths(doc.read_text(encoding="utf-8"))
        if missing:
            problems[doc.relative_to(ROOT).as_posix()] = missing
    assert not problems, f"paths that do not exist (fix them, or mark a gone one '(historical)'): {problems}"


def test_the_map_stays_a_map() -> None:
    lines = MAP.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/architecture.md has {lines} lines; decisions go to docs/decisions/"


def test_every_decision_has_a_number_a_title_and_a_status() -> None:
    names = sorted(p.name for p in DECISIONS.glob("*.md") if p.name != "README.md")
    index = (DECISIONS / "README.md").read_text(encoding="utf-8")
    numbers = []
    for name in names:
        assert re.fullmatch(r"\d{3}-[a-z0-9-]+\.md", name), name
        text = (DECISIONS / name).read_text(encoding="utf-8")
        assert text.startswith(f"# {name[:3]}. "), f"{name}: the title line is '# {name[:3]}. <title>'"
        status = re.search(r"^Status: (current|superseded)", text, re.MULTILINE)
        assert status, f"{name}: no 'Status: current' / 'Status: superseded by NNN' line"
        for later in re.findall(r"superseded (?:in part )?by (\d{3})", text.split("\n\n", 2)[1]):
            assert any(n.startswith(later + "-") for n in names), (
                f"{name}: superseded by {later}, which is no file"
            )
        assert f"({name})" in index, f"{name} is not in docs/decisions/README.md"
        numbers.append(int(name[:3]))
    assert numbers == list(range(1, len(numbers) + 1)), "decision numbers run 001, 002, ... without a gap"


def test_the_checks_catch_a_module_without_a_line(tmp_path: Path) -> None:
    """The rules above, on a tree of their own: a module added without a map line is found."""
    for rel in ["mqd/__init__.py", "mqd/a.py", "mqd/pkg/__init__.py", "mqd/pkg/b.py", "mqd/pkg/_c.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    page = "### Top (`mqd/`)\n\n| `a.py` | a |\n\n### Pkg (`mqd/pkg/`)\n\n| `b.py` | b |\n"
    assert unnamed_modules(page, tmp_path) == []
    (tmp_path / "mqd" / "pkg" / "new.py").write_text("")
    assert unnamed_modules(page, tmp_path) == ["mqd/pkg/new.py"]
    assert unnamed_modules(page + "\nAlso `mqd/pkg/new.py`.\n", tmp_path) == []
    assert missing_paths(
        "`mqd/pkg/b.py`, `mqd/gone.py` (historical), `mqd/gone.py`, `mqd/<x>/_c.py`", tmp_path
    ) == ["mqd/gone.py"]
