"""The ``millstream`` command (cli/main.py): the top of the package graph. It imports the
master, the worker, the injectors, the bench and the demo; nothing imports it (the layering
test, tests/unit/test_layering.py, keeps it so)."""
