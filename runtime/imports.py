"""Loading user code named by ``module:attr`` import paths, from allowed modules only.

A topology names its code by import path, and every worker imports it. Whoever can submit
a topology must not be able to make workers import and call anything on their path
(``sys:exit``, ``os:fork``, ``pdb:set_trace``): workers load code only from the module
prefixes an operator allowed (:class:`CodePolicy`, ``millstream worker --allow-code``), and
injectors load key extractors under one too (``Injector(allow_code=...)``).

Under a policy, the part after the colon names something *defined in* an allowed module:
an attribute of the module, or of a class defined there (``module:Class.attr``). A walk
through anything else (``runtime.sinks:os.sys.exit`` reached ``sys.exit`` through a module
the sinks import; review N10) is refused, and so is an object whose ``__module__`` is not
allowed (a function the allowed module imported from elsewhere).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from runtime.errors import ImportPathError

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_syntax(path: str, what: str) -> None:
    """Raise :class:`ImportPathError` unless ``path`` looks like ``module:attr``."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ImportPathError(
            f"{what} {path!r} is not an import path; write it as 'package.module:Name' "
            "(a module importable on every worker, a colon, then the attribute)"
        )


# What every worker may load without being told: millstream's own sinks and examples. Only
# millstream's own copies: a package of the same name elsewhere on the path (any project's
# ``examples``) is not built in (review N10).
BUILT_IN_CODE = ("runtime.sinks", "runtime.flows", "spark_bridge.parquet_sink", "examples")
_OWN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=64)
def _is_own(top: str) -> bool:
    """Whether the top-level package ``top`` is millstream's own (found, not imported)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    where = list(spec.submodule_search_locations or ()) or ([spec.origin] if spec.origin else [])
    return any(os.path.dirname(os.path.abspath(w)) == _OWN_ROOT for w in where)


class CodeNotAllowedError(ImportPathError):
    """An import path names a module outside the allowed prefixes."""


@dataclass(frozen=True)
class CodePolicy:
    """The module prefixes user code may come from (``"pkg"`` allows ``pkg`` and
    ``pkg.anything``; ``"*"`` allows every module, for trusted single-user setups)."""

    allowed: tuple[str, ...] = BUILT_IN_CODE
    where: Literal["worker", "injector"] = "worker"  # who loads (says how to allow more)

    @classmethod
    def parse(cls, text: str | None, extra: Iterable[str] = (),
              where: Literal["worker", "injector"] = "worker") -> CodePolicy:
        """From a comma-separated flag value; the built-in prefixes are always allowed."""
        given = [p.strip() for p in (text or "").split(",") if p.strip()]
        for p in given:
            if p != "*" and not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", p):
                raise ImportPathError(f"--allow-code entry {p!r} is not a module prefix; "
                                      "give dotted module names such as my_jobs or my_pkg.jobs")
        return cls(tuple(dict.fromkeys([*BUILT_IN_CODE, *given, *extra])), where)

    def permits(self, module: str) -> bool:
        for p in self.allowed:
            if p == "*" or module == p or module.startswith(p + "."):
                if p not in BUILT_IN_CODE or _is_own(module.partition(".")[0]):
                    return True
        return False

    def check(self, path: str, what: str) -> None:
        module = path.partition(":")[0]
        if not self.permits(module):
            top = module.split(".")[0]
            how = (f"start workers with --allow-code {top} (or MILLSTREAM_ALLOW_CODE)" if self.where == "worker"
                   else f"pass allow_code=[{top!r}] to the Injector (spark_bridge.inject(allow_code=...), "
                        "millstream inject-files --allow-code)")
            raise CodeNotAllowedError(
                f"{what} {path!r}: module {module!r} is not allowed "
                f"{'on this worker' if self.where == 'worker' else 'in this injector'} (allowed: "
                f"{', '.join(self.allowed)}); {how} if this code is meant to run here")


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
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if i and policy is not None and not (isinstance(obj, type) and policy.permits(obj.__module__)):
            raise CodeNotAllowedError(
                f"{what} {path!r}: {'.'.join(parts[:i])!r} is not a class defined in an allowed module; "
                f"name the code where it is defined ('module:Name' or 'module:Class.attr')")
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportPathError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}; "
                "check the name after the colon"
            ) from None
    if policy is not None:
        defined_in = None if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
        if not isinstance(defined_in, str) or not policy.permits(defined_in):
            found = "a module" if isinstance(obj, ModuleType) else f"defined in {defined_in!r}"
            raise CodeNotAllowedError(
                f"{what} {path!r} is {found}, not code of an allowed module ({', '.join(policy.allowed)}); "
                "name the code where it is defined, in a module allowed here")
    return obj


def path_of(obj: Any, what: str) -> str:
    """The ``module:name`` path of a module-level function or class (a clear error otherwise;
    a path given as a string is checked and returned)."""
    if isinstance(obj, str):
        check_syntax(obj, what)
        return obj
    name = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if not callable(obj) or not isinstance(name, str) or not isinstance(module, str):
        raise ImportPathError(f"{what}: {obj!r} is not a function or class; pass one defined at module level")
    if getattr(obj, "__name__", None) == "<lambda>":
        raise ImportPathError(f"{what}: a lambda cannot be loaded by the workers; define it with def at module "
                              "level (e.g. `def page_of(v): return v['page']`) and pass that")
    if "<locals>" in name:
        raise ImportPathError(f"{what}: {name} is defined inside a function; define it at module level so the "
                              "workers can import it (they load it by its module path)")
    if not _reachable(module, name, obj):
        raise ImportPathError(f"{what}: {module}:{name} cannot be imported back (a bound method, a decorated or "
                              f"renamed function is not {name!r} of module {module!r}); pass a function or class "
                              "defined at module level under its own name")
    return f"{module}:{name}"


def _reachable(module: str, name: str, obj: Any) -> bool:
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except Exception:
            return False
    found: Any = mod
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return found is obj
