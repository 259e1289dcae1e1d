"""How a flow names the code and objects its steps were given, so that workers (and
injectors, for the keys of an input) can load them again: functions and classes by import
path, codecs by name or path, windows and aggregators as small JSON documents. No pickle.

A function or class must be defined at module level, where a worker can import it: a lambda,
a closure or a nested function is refused when the step is added, in one line saying so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from runtime import codecs
from runtime.errors import UsageError
from runtime.flows.assigners import Collect, Count, Max, Mean, Min, Session, Sliding, Sum, Tumbling, _Windows
from runtime.imports import path_of as code_path

Loader = Callable[[str, str], Any]  # (import path, what it is for) -> the object


# ---------------------------------------------------------------------------- codecs

_BUILTIN_CODECS = {"bytes": codecs.BYTES, "str": codecs.STR, "int": codecs.INT, "float": codecs.FLOAT,
                   "json": codecs.JSON}


def codec_ref(codec: Any, what: str) -> str:
    """A codec's name: a built-in's (``"json"``), else the import path of a module-level object."""
    codecs.check_codec(codec, what)
    for name, builtin in _BUILTIN_CODECS.items():
        if codec is builtin:
            return name
    from runtime.flows.values import AUTO, VALUES

    if codec is AUTO:
        return "auto"
    if codec is VALUES:
        return "flow"
    module = type(codec).__module__
    mod = sys.modules.get(module)
    for attr, value in vars(mod).items() if mod is not None else ():
        if value is codec:
            return f"{module}:{attr}"
    raise UsageError(f"{what}: codec {codec!r} is not one of codecs.BYTES, STR, INT, FLOAT, JSON and not a "
                     f"module-level object of {module!r}; define it at module level (CODEC = MyCodec()) and pass that")


def load_codec(ref: str, load: Loader) -> Any:
    builtin = _BUILTIN_CODECS.get(ref)
    if builtin is not None:
        return builtin
    from runtime.flows.values import AUTO, VALUES

    if ref == "auto":
        return AUTO
    if ref == "flow":
        return VALUES
    return codecs.check_codec(load(ref, "codec"), f"codec {ref!r}")


# -------------------------------------------------------------- windows, aggregators

def windows_doc(windows: Any, what: str) -> dict[str, Any]:
    if isinstance(windows, Tumbling):
        return {"kind": "tumbling", "size": windows.size, "lateness": windows.lateness}
    if isinstance(windows, Sliding):
        return {"kind": "sliding", "size": windows.size, "period": windows.period, "lateness": windows.lateness}
    if isinstance(windows, Session):
        return {"kind": "session", "gap": windows.gap, "lateness": windows.lateness}
    raise UsageError(f"{what}: {windows!r} is not windows; pass Tumbling(size), Sliding(size, period) or "
                     "Session(gap) from runtime.windows")


def windows_of(doc: dict[str, Any]) -> _Windows:
    kind = doc["kind"]
    if kind == "tumbling":
        return Tumbling(doc["size"], allowed_lateness=doc["lateness"])
    if kind == "sliding":
        return Sliding(doc["size"], doc["period"], allowed_lateness=doc["lateness"])
    if kind == "session":
        return Session(doc["gap"], allowed_lateness=doc["lateness"])
    raise UsageError(f"unknown windows {kind!r} in a flow's plan")


_BUILTIN_AGGREGATORS = {"count": Count, "sum": Sum, "min": Min, "max": Max, "mean": Mean, "collect": Collect}


def aggregator_doc(agg: Any, what: str) -> dict[str, Any]:
    """An aggregator as ``{"builtin": name}`` or ``{"class": path, "fields": vars}`` (its fields
    must be JSON values: it is rebuilt on each worker without calling ``__init__``)."""
    if isinstance(agg, type):
        raise UsageError(f"{what}: pass an aggregator object, e.g. {agg.__name__}(), not the class")
    for name in ("create", "add", "merge"):
        if not callable(getattr(agg, name, None)):
            raise UsageError(f"{what}: {agg!r} is not an aggregator: it needs create(), add(acc, value) and "
                             "merge(a, b) (and may define result(acc)); see runtime.windows.Count")
    for name, cls in _BUILTIN_AGGREGATORS.items():
        if type(agg) is cls:
            return {"builtin": name}
    fields = dict(vars(agg)) if hasattr(agg, "__dict__") else {}
    try:
        codecs.JSON.encode(fields)
    except UsageError:
        raise UsageError(f"{what}: the fields of {type(agg).__name__} ({sorted(fields)}) must be JSON values: the "
                         "aggregator is rebuilt on each worker from its class and its fields") from None
    return {"class": code_path(type(agg), what), "fields": fields}


def aggregator_of(doc: dict[str, Any], load: Loader) -> Any:
    builtin = doc.get("builtin")
    if builtin is not None:
        return _BUILTIN_AGGREGATORS[builtin]()
    if doc.get("class") == "runtime.windows:Collect":  # a plan written before Collect was a builtin
        return Collect()
    cls = load(doc["class"], "aggregator")
    agg = cls.__new__(cls)
    agg.__dict__.update(doc.get("fields", {}))
    return agg


# ------------------------------------------------------------------ what a plan loads


def code_paths(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """Every import path a stage's plan (runtime/flows/compile.py) has its workers load, as
    ``(what, path)``: its steps' functions and classes, their codecs and aggregators, and its
    entries' (so a master can refuse, at submit, code a worker's policy would refuse)."""
    out: list[tuple[str, str]] = []

    def codec(what: str, ref: str | None) -> None:
        if ref and ref not in _BUILTIN_CODECS and ref not in ("auto", "flow"):
            out.append((f"codec of {what}", ref))

    for stream, entry in plan.get("entries", {}).items():
        codec(f"stream {stream!r}", entry.get("codec"))
        out += [(f"{kind} of stream {stream!r}", path) for kind, path in entry.get("prefix", [])]
    out += [(f"key_by {name!r}", path) for name, path in plan.get("keys", {}).values()]
    for name, doc in plan.get("steps", {}).items():
        what = f"step {name!r} ({doc.get('kind')})"
        out += [(what, doc[field]) for field in ("fn", "cls") if doc.get(field)]
        if doc.get("key"):  # (an emit keying the next stage's input)
            out.append((f"key_by {name!r}", doc["key"]))
        codec(what, doc.get("codec"))
        agg = doc.get("agg") or {}
        if agg.get("class") and agg["class"] != "runtime.windows:Collect":  # (that one: see aggregator_of)
            out.append((f"aggregator of {what}", agg["class"]))
    return out
