"""Lazy module imports: a module object that is imported on its first attribute access.

Why: ``mqd run`` sends its first fetch before it pays for what that fetch does not need (issue 16).
pyarrow and numpy cost about 0.2-0.3 s to import, and every module on the start path (the consumer,
the landing's claim chain read for start positions) names them only inside functions. A module
writes, in place of ``import pyarrow as pa``::

    if TYPE_CHECKING:
        import pyarrow as pa
    else:
        pa = lazy_import("pyarrow")

and its function bodies stay as they were. The first ``pa.<name>`` imports pyarrow and turns the
placeholder into a plain module holding the real module's names, so later accesses cost what a
module attribute costs (nothing per record on the hot path). A name the real module gains later
(a submodule imported afterwards) is still found, through the module-level ``__getattr__``.

The placeholder is a second module object: it holds the names as they were when it loaded, so a
name rebound on the real module afterwards (a test's monkeypatch of ``mqd.wire.format.x``) is not seen
through it; patch the importing module's attribute instead.

A module-level use (a constant such as ``pa.schema(...)`` at import time) imports at once: such
modules stay off the start path (``tests/integration/daemon/test_startup_imports.py`` checks it).
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

__all__ = ["lazy_import"]

_lock = threading.Lock()  # a landing thread and the loop may touch a placeholder at once


class _LazyModule(types.ModuleType):
    """The placeholder: its class is swapped to ``types.ModuleType`` once loaded."""

    def __getattr__(self, attr: str) -> Any:
        real = _load(self)
        return getattr(real, attr)


def _load(placeholder: types.ModuleType) -> types.ModuleType:
    name = placeholder.__name__
    real = importlib.import_module(name)  # thread-safe: the import system's module locks
    with _lock:
        if type(placeholder) is _LazyModule:
            names = dict(real.__dict__)
            # names set on the real module later (a submodule imported since) are looked up there
            names["__getattr__"] = lambda attr: getattr(real, attr)
            placeholder.__dict__.update(names)
            placeholder.__class__ = types.ModuleType  # type: ignore[assignment]  # as importlib's LazyLoader
    return real


def lazy_import(name: str) -> types.ModuleType:
    """The module ``name`` if it is imported already, else a placeholder that imports it when an
    attribute is first read."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    return _LazyModule(name, f"lazy placeholder of {name}")
