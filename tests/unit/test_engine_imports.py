"""The source seam holds: the consumer engine's modules import nothing HTTP- or broker-specific
(mqd.client, mqd.protocol, mqd.format, mqd.metadata, mqd.broker, mqd.sources, aiohttp), so a second
source plugs in without touching them. The facade alone names the sources, lazily, inside the one
function that chooses from consumer.source."""

from __future__ import annotations

import ast
from pathlib import Path

import mqd.consumer

ENGINE = Path(mqd.consumer.__file__).parent
FORBIDDEN = (
    "mqd.client",
    "mqd.protocol",
    "mqd.format",
    "mqd.metadata",
    "mqd.broker",
    "mqd.sources",
    "aiohttp",
)
# the lazy imports of the source the config chooses (consumer.source), in one function
ALLOWED = {
    ("consumer.py", "_default_source", "mqd.sources.mqd_broker"),
    ("consumer.py", "_default_source", "mqd.sources.kafka"),
}


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, enclosing function or None) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, func) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                out.append((child.module, func))
                out.extend((f"{child.module}.{a.name}", func) for a in child.names)
            visit(child, func)

    visit(tree, None)
    return out


def test_engine_imports_nothing_broker_specific() -> None:
    """No engine module imports a forbidden module (other than the one allowed lazy import)."""
    files = sorted(ENGINE.glob("*.py"))
    assert {f.name for f in files} >= {
        "budget.py",
        "consumer.py",
        "fetcher.py",
        "membership.py",
        "offset_reset.py",
        "process_queue.py",
        "rebalance.py",
        "source.py",
        "subscription_state.py",
    }
    bad = []
    for f in files:
        for module, func in imports(f):
            hit = any(module == m or module.startswith(m + ".") for m in FORBIDDEN)
            if hit and not any(
                (f.name, func) == (a[0], a[1]) and (module == a[2] or module.startswith(a[2] + "."))
                for a in ALLOWED
            ):
                bad.append(f"{f.name}: {module} (in {func or 'module scope'})")
    assert bad == []


def test_the_rule_sees_imports() -> None:
    """The check itself finds imports at module scope and inside functions."""
    found = imports(ENGINE / "consumer.py")
    assert ("mqd.sources.mqd_broker", "_default_source") in found
    assert any(m == "mqd.consumer.fetcher" and f is None for m, f in found)
