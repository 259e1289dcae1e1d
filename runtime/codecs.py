"""Codecs of typed state (DESIGN.md §3a): how values become the bytes that are stored.

``BYTES``, ``STR``, ``INT``, ``FLOAT`` and ``JSON`` are built in; any object with
``encode(obj) -> bytes`` and ``decode(bytes) -> obj`` is a codec too. Nothing is pickled.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol, runtime_checkable

from runtime.errors import UsageError


@runtime_checkable
class Codec(Protocol):
    def encode(self, obj: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class _Bytes:
    name = "bytes"

    def encode(self, obj: Any) -> bytes:
        if not isinstance(obj, (bytes, bytearray, memoryview)):
            raise UsageError(f"the BYTES codec stores bytes, not {type(obj).__name__}; encode it or pick "
                            "another codec (codecs.STR, codecs.JSON, ...)")
        return bytes(obj)

    def decode(self, data: bytes) -> bytes:
        return data


class _Str:
    name = "str"

    def encode(self, obj: Any) -> bytes:
        if not isinstance(obj, str):
            raise UsageError(f"the STR codec stores str, not {type(obj).__name__}")
        return obj.encode("utf-8", "surrogatepass")

    def decode(self, data: bytes) -> str:
        return data.decode("utf-8", "surrogatepass")


class _Int:
    name = "int"

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, bool) or not isinstance(obj, int):
            raise UsageError(f"the INT codec stores int, not {type(obj).__name__}")
        return str(obj).encode()

    def decode(self, data: bytes) -> int:
        return int(data)


class _Float:
    name = "float"

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            raise UsageError(f"the FLOAT codec stores float, not {type(obj).__name__}")
        return struct.pack(">d", float(obj))

    def decode(self, data: bytes) -> float:
        return float(struct.unpack(">d", data)[0])


class _Json:
    name = "json"

    def encode(self, obj: Any) -> bytes:
        try:
            return json.dumps(obj, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise UsageError(f"the JSON codec cannot store {type(obj).__name__}: {e}") from None

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


BYTES: Codec = _Bytes()
STR: Codec = _Str()
INT: Codec = _Int()
FLOAT: Codec = _Float()
JSON: Codec = _Json()


def check_codec(codec: object, what: str) -> Codec:
    """``codec`` if it has ``encode`` and ``decode``; a clear error otherwise."""
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise UsageError(f"{what}: {codec!r} is not a codec; use codecs.BYTES, STR, INT, FLOAT, JSON, or an "
                        "object with encode(obj) -> bytes and decode(bytes) -> obj")
    return codec  # type: ignore[return-value]
