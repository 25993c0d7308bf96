"""The Spark side of mqd: the Structured Streaming job (job.py), its session (session.py) and the
checks ``mqd config check`` runs without Spark (static_checks.py).

pyspark is the optional extra ``mqd[spark]`` (about 490 MB): a daemon-only or broker-only host installs
mqd without it. No module here imports pyspark at module level; ``pyspark_problem`` lets ``mqd spark``
say how to install it instead of failing with a traceback.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'mqd[spark]'"


def pyspark_problem() -> str | None:
    """None when pyspark imports, else a one-line message that names the extra to install."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"error: mqd spark needs pyspark, which is not installed ({exc}); install: {INSTALL_HINT}"
    return None
