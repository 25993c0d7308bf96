"""aiokafka's connection, client and protocol modules, in the mqd command, without its package's own
``__init__``.

``import aiokafka.conn`` first runs ``aiokafka/__init__.py``, which imports the producer and the
consumer (record builders, fetcher, group coordinator, transaction manager, codecs): ~50 ms of CPU
before the Kafka source's first fetch, of which mqd uses nothing (issue 34: spawn to first fetch
<= 0.35 s; the Kafka source was at 0.38 s, the mqd source at 0.34 s). In the mqd command
(``mqd.log.is_mqd_command``, as structlog's rich is hidden there) the package is registered
without running its ``__init__``: its path, so its submodules import as usual, and its version,
which its client names itself with. The first access to a name only the ``__init__`` defines
(``aiokafka.AIOKafkaConsumer``) runs that ``__init__`` on the same module, so nothing is missing,
only paid for later. Anywhere else (an application, the tests) aiokafka imports as it always does.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from mqd.log import is_mqd_command

_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def register_lean() -> bool:
    """In the mqd command, ``aiokafka`` in ``sys.modules`` with its ``__init__`` not run yet;
    True when it was registered so. Anything unexpected leaves the normal import."""
    if "aiokafka" in sys.modules or not is_mqd_command():
        return False
    spec = importlib.util.find_spec("aiokafka")
    if spec is None or spec.loader is None or spec.origin is None or spec.submodule_search_locations is None:
        return False
    try:
        found = _VERSION.search(Path(spec.origin).read_text(encoding="utf-8"))
    except OSError:
        return False
    if found is None:
        return False  # a layout this does not know: the package's own import
    package = importlib.util.module_from_spec(spec)
    package.__version__ = found.group(1)  # type: ignore[attr-defined]  # aiokafka.client reads it

    def rest_of_init(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:  # a submodule (``from aiokafka import errors``): imported as any submodule is
            return importlib.import_module(f"aiokafka.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"aiokafka.{name}":
                raise
        # a name the __init__ defines: run it now, on this module, once
        del package.__dict__["__getattr__"]
        assert spec.loader is not None
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = rest_of_init  # type: ignore[method-assign]
    sys.modules["aiokafka"] = package
    return True
