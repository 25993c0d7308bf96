"""The operator's edges: the ``mqd`` command, the admin endpoint with its status page, ``mqd top``,
the views of the status JSON they share, ``mqd produce`` and ``mqd offsets``.

Nothing is imported here: the runner imports the admin endpoint only once the daemon's first fetch
is out (tests/integration/daemon/test_startup_imports.py), so this package stays off the start path.
"""
