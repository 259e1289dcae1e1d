"""State out: a computation's per-key state from a savepoint, as a Spark DataFrame."""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import Any

from runtime.errors import MillstreamError
from runtime.record import MIN_TIME
from runtime.savepoint import read_manifest, tablet_dir

SCHEMA = "key string, key_bytes binary, value binary, value_text string, key_range int"
TYPED_SCHEMA = "key string, key_bytes binary, item string, value string, key_range int"


def read_state(spark: Any, savepoint_dir: str, computation: str, state: str | None = None) -> Any:
    """The per-key state of ``computation`` in the savepoint at ``savepoint_dir`` (written by
    ``millstream savepoint``), as a DataFrame.

    Without ``state``: its ``ctx.state``, one row per key with ``key`` (UTF-8 text, escapes where
    it is not), ``key_bytes``, ``value`` (the bytes), ``value_text`` (the bytes as UTF-8 text,
    null where they are not) and the ``key_range`` that held it. (A flow's stage keeps none:
    :class:`MillstreamError` names the typed states to read instead.)

    With ``state``: the typed state of that name declared on the computation's class (its
    ``ValueState``, ``ListState`` or ``MapState``; in a flow's stage, a ``reduce`` step's value
    by the step's name, a ``process`` step's ``ctx.state`` by its name and its typed states as
    ``<step>/<state>``), decoded with its codec: one row per value,
    list element or map entry, with ``key``, ``key_bytes``, ``item`` (null for a value, the
    index of a list element, the map key as text) and ``value`` (the decoded value as JSON
    text); entries expired at the savepoint's watermark are left out (with a wall-clock TTL:
    by the time it was taken).

    Each tablet's checkpoint is read by one Spark task, so the savepoint directory must be
    readable where the executors run (a local directory for ``local[*]``, else shared storage).
    """
    savepoint_dir = os.path.abspath(savepoint_dir)  # the tasks may not run where this does
    manifest = read_manifest(savepoint_dir)
    paths = [(int(t["key_range"]), tablet_dir(savepoint_dir, computation, int(t["key_range"])))
             for t in manifest["tablets"] if t["computation"] == computation]
    if not paths:
        have = sorted({str(t["computation"]) for t in manifest["tablets"]})
        raise MillstreamError(f"the savepoint of job {manifest['job']!r} has no computation {computation!r} "
                              f"(it has {', '.join(have)})")
    code = json.loads(manifest["topology"])
    spec = next(c for c in code["computations"] if c["name"] == computation)
    spec_path, params = spec["code"], spec.get("params", {})
    if state is None:
        from runtime.flows import FLOW_CODES

        if spec_path in FLOW_CODES:  # (its steps keep typed state only: an empty frame would say nothing)
            from runtime.flows.stage import readable_states
            from runtime.imports import load

            names = sorted(readable_states(load(spec_path, "computation code"), params))
            raise MillstreamError(f"{computation!r} is a stage of a flow, which keeps no ctx.state: read one of "
                                  f"its typed states with state=NAME ({', '.join(names) or 'it has none'})")
        rdd = spark.sparkContext.parallelize(paths, len(paths)).flatMap(_rows)
        return spark.createDataFrame(rdd, SCHEMA)
    _spec(spec_path, params, state)  # a clear error here, not in a task
    wm = int(manifest.get("watermarks", {}).get(computation, MIN_TIME))
    taken = manifest.get("taken")  # (the state as it was then: a wall-clock TTL is judged by it)
    now = int(datetime.datetime.fromisoformat(taken).timestamp() * 1e6) if taken else time.time_ns() // 1000
    items = [(r, p, spec_path, params, state, wm, now) for r, p in paths]
    rdd = spark.sparkContext.parallelize(items, len(items)).flatMap(_typed_rows)
    return spark.createDataFrame(rdd, TYPED_SCHEMA)


def _spec(code: str, params: dict[str, str], name: str) -> Any:
    from runtime.flows.stage import readable_states
    from runtime.imports import load

    specs = readable_states(load(code, "computation code"), params)  # (a flow's stage: its steps', from its plan)
    if name not in specs:
        raise MillstreamError(f"{code} declares no typed state {name!r} (it declares "
                              f"{', '.join(sorted(specs)) or 'none'})")
    return specs[name]


def _text(obj: Any) -> str:
    """A map key as text, as ``millstream state get`` shows it (bytes as UTF-8, else ``0x`` hex)."""
    from runtime.state import json_value

    shown = json_value(obj)
    return shown if isinstance(shown, str) else json.dumps(shown)


def _typed_rows(item: tuple[int, str, str, dict[str, str], str, int, int]
                ) -> list[tuple[str, bytes, str | None, str, int]]:
    from runtime.computation import TimeDomain
    from runtime.state import ELEMENT, ENTRY, VALUE, is_expired, json_value, payload, split_cell
    from worker.storage import saved_entries

    key_range, path, code, params, name, wm, taken = item
    spec = _spec(code, params, name)
    if spec.ttl_domain == TimeDomain.WALL_TIME:
        wm = taken  # (a wall-clock TTL: judged by the clock, when the savepoint was taken)
    out = []
    for skey, stored in saved_entries(path, b"Y"):
        key, sname, rest = split_cell(skey)
        if sname != spec.name or rest[:1] not in (VALUE, ELEMENT, ENTRY) or is_expired(stored, wm):
            continue
        if rest[:1] == VALUE:
            what = None
        elif rest[:1] == ELEMENT:
            what = str(int.from_bytes(rest[1:], "big"))
        else:
            what = _text(spec.key_codec.decode(rest[1:]))
        value = json.dumps(json_value(spec.codec.decode(payload(stored))))
        out.append((key.decode("utf-8", "backslashreplace"), key, what, value, key_range))
    return out


def _rows(item: tuple[int, str]) -> list[tuple[str, bytes, bytes, str | None, int]]:
    from worker.storage import saved_states

    key_range, path = item
    out = []
    for key, value in saved_states(path):
        try:
            text: str | None = value.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        out.append((key.decode("utf-8", "backslashreplace"), key, value, text, key_range))
    return out
