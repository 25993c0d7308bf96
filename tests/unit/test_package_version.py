"""The package says which version it is, the way Python tools look for it."""

from __future__ import annotations

from importlib.metadata import version

import mqd


def test_dunder_version_is_the_installed_distribution_version() -> None:
    """``mqd.__version__`` is the version pip installed (the CLI's ``--version`` reads the same)."""
    assert mqd.__version__ == version("mqd")
    assert mqd.__version__[0].isdigit()
