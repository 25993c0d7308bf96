"""The source seam holds: the consumer engine's modules (mqd/consumer/, its subpackages too) import
nothing HTTP- or broker-specific (mqd.wire, the mqd broker's wire package; mqd.broker, mqd.sources,
aiohttp), so a second source plugs in without touching them. No engine module names a
source implementation, nor the sources' factory: the callers build the source with
mqd.sources.open_source and hand it in (the Consumer has no default source)."""

from __future__ import annotations

import ast
from pathlib import Path

import mqd.consumer
import mqd.sources

ENGINE = Path(mqd.consumer.__file__).parent
FORBIDDEN = (
    "mqd.wire",
    "mqd.broker",
    "mqd.sources",
    "aiohttp",
)
# the source implementations: never imported by the engine, anywhere
IMPLEMENTATIONS = ("mqd.sources.mqd_broker", "mqd.sources.kafka")
# no exception: the engine imports nothing of the sources, not even their factory
ALLOWED: set[tuple[str, str | None, str]] = set()


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
    """No engine module imports a forbidden module, at module scope or inside a function."""
    files = sorted(ENGINE.rglob("*.py"))
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
            if hit and (str(f.relative_to(ENGINE)), func, module) not in ALLOWED:
                bad.append(f"{f.relative_to(ENGINE)}: {module} (in {func or 'module scope'})")
    assert bad == []


def test_engine_names_no_source_implementation() -> None:
    """No module of mqd/consumer/ imports mqd.sources.mqd_broker or mqd.sources.kafka (or anything
    under them), wherever the import sits; the implementations are what the seam's factory,
    mqd.sources.open_source, knows."""
    implementations = {p.name for p in Path(mqd.sources.__file__).parent.iterdir() if p.is_dir()}
    assert {m.rsplit(".", 1)[1] for m in IMPLEMENTATIONS} == implementations - {"__pycache__"}
    bad = [
        f"{f.relative_to(ENGINE)}: {module} (in {func or 'module scope'})"
        for f in sorted(ENGINE.rglob("*.py"))
        for module, func in imports(f)
        if any(module == m or module.startswith(m + ".") for m in IMPLEMENTATIONS)
    ]
    assert bad == []


def test_the_rule_sees_imports(tmp_path: Path) -> None:
    """The check itself finds imports at module scope and inside functions."""
    f = tmp_path / "m.py"
    f.write_text("import mqd.consumer.fetcher\n\ndef g():\n    from mqd.sources import open_source\n")
    found = imports(f)
    assert ("mqd.consumer.fetcher", None) in found
    assert ("mqd.sources.open_source", "g") in found
    assert any(m == "mqd.consumer.fetcher" and fn is None for m, fn in imports(ENGINE / "consumer.py"))
