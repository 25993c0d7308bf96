"""mqd's developer tooling, kept out of the mqd wheel: the chaos harness (``python -m mqd_dev.chaos``,
``make chaos``) and the one-minute demo (``python -m mqd_dev.demo``, ``make demo``).

Installed editable by ``make install`` as the distribution ``mqd-dev`` (devtools/pyproject.toml).
"""
