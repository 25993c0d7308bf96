"""mqd: pull a partitioned message queue and land it, exactly once, as Parquet for Spark."""

from importlib.metadata import PackageNotFoundError, version

from mqd.log import library_default

library_default()  # quiet unless the application configures logging (mqd/log.py)

try:
    __version__ = version("mqd")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
