"""How record keys and values become typed columns (for the Parquet sink and ``read_stream``).

A *codec* names how a value's bytes are encoded:

- ``"bytes"``: opaque; the ``value`` column is binary.
- ``"text"``: UTF-8 text; the ``value`` column is a string.
- ``"json"``: a UTF-8 JSON document; ``value`` is the text, and the fields of
  a JSON object become typed columns of their own. Declare them
  (``fields="query:string,second:long"``) for types that are the same in every
  file; undeclared fields are inferred per file.

Keys use ``"text"`` (default) or ``"bytes"``. Field types: ``string``,
``long``, ``double``, ``boolean``, ``timestamp`` (microseconds since the epoch
in the JSON document).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from runtime.errors import MillstreamError, TopologyError

VALUE_CODECS = ("bytes", "text", "json")
KEY_CODECS = ("text", "bytes")
RESERVED = ("key", "value", "timestamp")
TIMESTAMP = pa.timestamp("us", tz="UTC")
FIELD_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": TIMESTAMP,
}
SPARK_TYPES = {"string": "string", "long": "bigint", "double": "double", "boolean": "boolean",
               "timestamp": "timestamp"}
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ValueDecodeError(MillstreamError, ValueError):
    """A record's value does not decode with the sink's codec (the record is dead-lettered)."""


def parse_fields(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"a:long,b:string"`` (or a mapping) -> ``{"a": "long", "b": "string"}``, validated."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, str):
        pairs = []
        for item in spec.split(","):
            name, sep, typ = item.strip().partition(":")
            if not sep:
                raise TopologyError(
                    f"field {item.strip()!r} has no type; write NAME:TYPE, e.g. 'count:long'")
            pairs.append((name.strip(), typ.strip().lower()))
    else:
        pairs = [(str(k), str(v).lower()) for k, v in spec.items()]
    out: dict[str, str] = {}
    for name, typ in pairs:
        if not _FIELD.fullmatch(name):
            raise TopologyError(f"field name {name!r} is invalid; use letters, digits and '_'")
        if name in RESERVED:
            raise TopologyError(
                f"field name {name!r} clashes with the {name!r} column every sink writes; rename it")
        if typ not in FIELD_TYPES:
            raise TopologyError(
                f"field {name!r} has type {typ!r}; use one of {', '.join(FIELD_TYPES)}")
        if name in out:
            raise TopologyError(f"field {name!r} is declared twice")
        out[name] = typ
    return out


def format_fields(fields: Mapping[str, str]) -> str:
    return ",".join(f"{k}:{v}" for k, v in fields.items())


@dataclass(frozen=True)
class Codec:
    """A sink's decoding of keys and values into columns."""

    value: str = "bytes"
    key: str = "text"
    fields: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Codec:
        value = params.get("codec", "bytes")
        key = params.get("key_codec", "text")
        if value not in VALUE_CODECS:
            raise TopologyError(f"codec={value!r} is not known; use one of {', '.join(VALUE_CODECS)}")
        if key not in KEY_CODECS:
            raise TopologyError(f"key_codec={key!r} is not known; use one of {', '.join(KEY_CODECS)}")
        fields = parse_fields(params.get("fields"))
        if fields and value != "json":
            raise TopologyError(f"fields= needs codec='json' (got codec={value!r})")
        return cls(value, key, tuple(fields.items()))

    def params(self) -> dict[str, str]:
        out = {"codec": self.value, "key_codec": self.key}
        if self.fields:
            out["fields"] = format_fields(dict(self.fields))
        return out

    # ---------------------------------------------------------------- decoding

    def row(self, key: bytes, value: bytes, timestamp: int) -> dict[str, Any]:
        """One record as a row; raises :class:`ValueDecodeError` if the value does not decode."""
        row: dict[str, Any] = {
            "key": key.decode("utf-8", "backslashreplace") if self.key == "text" else key,
            "timestamp": timestamp,
        }
        if self.value == "bytes":
            row["value"] = value
            return row
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueDecodeError(f"value is not UTF-8 ({e}); use codec='bytes'") from None
        row["value"] = text
        if self.value == "json":
            try:
                doc = json.loads(text)
            except ValueError as e:
                raise ValueDecodeError(f"value is not JSON ({e}): {text[:80]!r}") from None
            if self.fields:
                obj = doc if isinstance(doc, dict) else {}
                for name, typ in self.fields:
                    row[name] = _convert(obj.get(name), typ, name)
            elif isinstance(doc, dict):
                for name, v in doc.items():
                    col = name if name not in RESERVED else "v_" + name
                    if type(v) is int and not -(1 << 63) <= v < (1 << 63):
                        v = str(v)  # no Parquet integer holds it: its digits (the column is text then)
                    row[col] = v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)
        return row

    # ------------------------------------------------------------------ schema

    def schema(self, rows: Iterable[Mapping[str, Any]] = ()) -> pa.Schema:
        """The Arrow schema of a file holding ``rows`` (inferred fields need the rows)."""
        cols = [
            pa.field("key", pa.string() if self.key == "text" else pa.binary(), nullable=False),
            pa.field("value", pa.binary() if self.value == "bytes" else pa.string(), nullable=False),
            pa.field("timestamp", TIMESTAMP, nullable=False),
        ]
        if self.fields:
            cols += [pa.field(n, FIELD_TYPES[t]) for n, t in self.fields]
        elif self.value == "json":
            cols += [pa.field(n, t) for n, t in _infer(rows).items()]
        return pa.schema(cols)

    def spark_ddl(self) -> str:
        """The Spark schema of what this codec writes (declared fields only)."""
        parts = [f"key {'string' if self.key == 'text' else 'binary'}",
                 f"value {'binary' if self.value == 'bytes' else 'string'}",
                 "timestamp timestamp"]
        parts += [f"`{n}` {SPARK_TYPES[t]}" for n, t in self.fields]
        return ", ".join(parts)

    def table(self, rows: list[dict[str, Any]]) -> pa.Table:
        schema = self.schema(rows)
        if self.value == "json" and not self.fields:
            coerce_inferred(rows, schema)
        return pa.Table.from_pylist(rows, schema=schema)


def _convert(v: Any, typ: str, name: str) -> Any:
    if v is None:
        return None
    ok = {
        "string": isinstance(v, str),
        "long": isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63),
        "double": isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": isinstance(v, bool),
        "timestamp": isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63),
    }[typ]
    if not ok:
        raise ValueDecodeError(f"field {name!r} is declared {typ} but the value holds {v!r}")
    if typ == "double":
        v = float(v)
        if math.isnan(v):
            return None
    return v


def _infer(rows: Iterable[Mapping[str, Any]]) -> dict[str, pa.DataType]:
    seen: dict[str, set[type]] = {}
    for r in rows:
        for name, v in r.items():
            if name in RESERVED:
                continue
            kinds = seen.setdefault(name, set())
            if v is not None:
                kinds.add(type(v))
    out: dict[str, pa.DataType] = {}
    for name, kinds in seen.items():
        if kinds <= {bool} and kinds:
            out[name] = pa.bool_()
        elif kinds and kinds <= {int}:
            out[name] = pa.int64()
        elif kinds and kinds <= {int, float}:
            out[name] = pa.float64()
        else:
            out[name] = pa.string()
    return out


def coerce_inferred(rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Make inferred columns hold what their type says (ints as floats, mixed as strings)."""
    for f in schema:
        if f.name in RESERVED:
            continue
        if pa.types.is_floating(f.type):
            for r in rows:
                v = r.get(f.name)
                if v is not None:
                    r[f.name] = float(v)
        elif pa.types.is_string(f.type):
            for r in rows:
                v = r.get(f.name)
                if v is not None and not isinstance(v, str):
                    r[f.name] = json.dumps(v)
