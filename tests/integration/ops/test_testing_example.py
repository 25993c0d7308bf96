"""mqd.testing's usage example (its module docstring, which the README shows) runs as written: it
starts real brokers, produces, and stops them."""

from __future__ import annotations

import textwrap

import mqd.testing


def _example() -> str:
    doc = mqd.testing.__doc__
    assert doc is not None
    block = doc.split("::\n", 1)[1].split("\n\nIn a pytest suite", 1)[0]
    return textwrap.dedent(block)


def test_the_documented_example_runs() -> None:
    """The code block of the docstring, executed as a script, passes its own assertion; it is the
    15-line example (so the README's copy stays short)."""
    code = _example()
    assert "LocalCluster(" in code and "assert " in code
    assert len(code.strip().splitlines()) <= 20
    exec(compile(code, "mqd.testing example", "exec"), {"__name__": "__main__"})
