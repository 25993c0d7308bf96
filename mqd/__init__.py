"""mqd: pull a partitioned message queue and land it, exactly once, as Parquet for Spark."""

from mqd.log import library_default
from mqd.package_without_init import register_without_init

# The one place the version is written (pyproject.toml reads it): a lookup through
# importlib.metadata cost every process ~35 ms of CPU before its first fetch (issue 34).
__version__ = "0.1.0"

library_default()  # quiet unless the application configures logging (mqd/log.py)
# its __init__ imports its HTTP servers and push gateway (~14 ms of CPU), which mqd does not use
register_without_init("prometheus_client")

__all__ = ["__version__"]
