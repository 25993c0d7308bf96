"""aiokafka's connection, client and protocol modules, in the mqd command, without its package's own
``__init__`` (mqd/package_without_init.py).

``import aiokafka.conn`` first runs ``aiokafka/__init__.py``, which imports the producer and the
consumer (record builders, fetcher, group coordinator, transaction manager, codecs): ~50 ms of CPU
before the Kafka source's first fetch, of which mqd uses nothing (issue 34: spawn to first fetch
<= 0.35 s; the Kafka source was at 0.38 s, the mqd source at 0.34 s). The package is registered
with its version, which its client names itself with, read from the ``__init__``'s own line.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from mqd.log import is_mqd_command
from mqd.package_without_init import register_without_init

_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def register_lean() -> bool:
    """In the mqd command, ``aiokafka`` in ``sys.modules`` with its ``__init__`` not run yet;
    True when it was registered so. Anything unexpected leaves the normal import."""
    if "aiokafka" in sys.modules or not is_mqd_command():
        return False
    spec = importlib.util.find_spec("aiokafka")
    if spec is None or spec.origin is None:
        return False
    try:
        found = _VERSION.search(Path(spec.origin).read_text(encoding="utf-8"))
    except OSError:
        return False
    if found is None:
        return False  # a layout this does not know: the package's own import
    return register_without_init("aiokafka", {"__version__": found.group(1)})  # aiokafka.client reads it
