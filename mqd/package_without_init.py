"""A third-party package's submodules, in the mqd command, without running the package's ``__init__``.

Some packages' ``__init__`` imports everything they have so that ``from package import Name`` works
for every name: ``import aiokafka.conn`` first imports aiokafka's producer and consumer (~50 ms of
CPU), ``from prometheus_client import Counter`` first imports its HTTP servers, WSGI and ASGI apps
and push gateway (``http.server``, ``wsgiref``, ``urllib.request``: ~14 ms), none of which mqd
uses before its first fetch or in a burst run at all (issue 34: the fixed cost per run). In the
mqd command (``mqd.log.is_mqd_command``, as structlog's rich is hidden there) such a package is put
in ``sys.modules`` without running its ``__init__``: its path, so its submodules import as usual
(mqd imports them by their full names), and any attributes the caller gives (aiokafka's version).
The first access to a name only the ``__init__`` defines runs that ``__init__`` on the same module,
once: nothing is missing, only paid for later. Anywhere else (an application, the tests) the
package imports as it always does.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

from mqd.log import is_mqd_command

__all__ = ["register_without_init"]


def register_without_init(name: str, attributes: Mapping[str, object] | None = None) -> bool:
    """In the mqd command, package ``name`` in ``sys.modules`` with its ``__init__`` not run yet and
    ``attributes`` set on it; True when it was registered so. A package already imported, one not
    installed, or any other process keeps the normal import."""
    if name in sys.modules or not is_mqd_command():
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    package = importlib.util.module_from_spec(spec)
    for attr, value in (attributes or {}).items():
        setattr(package, attr, value)

    def rest_of_init(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:  # a submodule (``from aiokafka import errors``): imported as any submodule is
            return importlib.import_module(f"{name}.{attr}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{name}.{attr}":
                raise
        # a name the __init__ defines: run it now, on this module, once
        del package.__dict__["__getattr__"]
        assert spec.loader is not None
        spec.loader.exec_module(package)
        return getattr(package, attr)

    package.__getattr__ = rest_of_init  # type: ignore[method-assign]
    sys.modules[name] = package
    return True
