"""Loading user code named by ``module:attr`` import paths, from allowed modules only.

A topology names its code by import path, and every worker imports it. Whoever can submit
a topology must not be able to make workers import and call anything on their path
(``sys:exit``, ``os:fork``, ``pdb:set_trace``): workers load code only from the module
prefixes an operator allowed (:class:`CodePolicy`, ``millstream worker --allow-code``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
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


# What every worker may load without being told: millstream's own sinks and examples.
BUILT_IN_CODE = ("runtime.sinks", "spark_bridge.parquet_sink", "examples")


class CodeNotAllowedError(ImportPathError):
    """An import path names a module outside the allowed prefixes."""


@dataclass(frozen=True)
class CodePolicy:
    """The module prefixes user code may come from (``"pkg"`` allows ``pkg`` and
    ``pkg.anything``; ``"*"`` allows every module, for trusted single-user setups)."""

    allowed: tuple[str, ...] = BUILT_IN_CODE

    @classmethod
    def parse(cls, text: str | None, extra: Iterable[str] = ()) -> CodePolicy:
        """From a comma-separated flag value; the built-in prefixes are always allowed."""
        given = [p.strip() for p in (text or "").split(",") if p.strip()]
        for p in given:
            if p != "*" and not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", p):
                raise ImportPathError(f"--allow-code entry {p!r} is not a module prefix; "
                                      "give dotted module names such as my_jobs or my_pkg.jobs")
        return cls(tuple(dict.fromkeys([*BUILT_IN_CODE, *given, *extra])))

    def permits(self, module: str) -> bool:
        return any(p == "*" or module == p or module.startswith(p + ".") for p in self.allowed)

    def check(self, path: str, what: str) -> None:
        module = path.partition(":")[0]
        if not self.permits(module):
            raise CodeNotAllowedError(
                f"{what} {path!r}: module {module!r} is not allowed on this worker (allowed: "
                f"{', '.join(self.allowed)}); start workers with --allow-code {module.split('.')[0]} "
                "(or MILLSTREAM_ALLOW_CODE) if this code is meant to run here")


def load(path: str, what: str = "import path", policy: CodePolicy | None = None) -> Any:
    """Import ``module:attr`` and return the attribute (``policy``: refuse modules outside it
    before importing anything; None: the caller's own code, no restriction)."""
    check_syntax(path, what)
    if policy is not None:
        policy.check(path, what)
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as e:
        raise ImportPathError(
            f"{what} {path!r}: cannot import module {module_name!r} ({e}); "
            "make sure it is installed or on PYTHONPATH where it runs"
        ) from None
    except (Exception, SystemExit) as e:  # the module's own code failed (or called sys.exit)
        raise ImportPathError(
            f"{what} {path!r}: importing module {module_name!r} raised {type(e).__name__}: {e}"
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
