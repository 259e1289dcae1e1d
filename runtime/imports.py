"""Loading user code named by ``module:attr`` import paths."""

from __future__ import annotations

import importlib
import re
from typing import Any

from runtime.errors import ImportPathError

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_syntax(path: str, what: str) -> None:
    """Raise :class:`ImportPathError` unless ``path`` looks like ``module:attr``."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ImportPathError(
            f"{what} {path!r} is not an import path; write it as 'package.module:Name' "
            "(a module importable on every worker, a colon, then the attribute)"
        )


def load(path: str, what: str = "import path") -> Any:
    """Import ``module:attr`` and return the attribute."""
    check_syntax(path, what)
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as e:
        raise ImportPathError(
            f"{what} {path!r}: cannot import module {module_name!r} ({e}); "
            "make sure it is installed or on PYTHONPATH where it runs"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportPathError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}; "
                "check the name after the colon"
            ) from None
    return obj
