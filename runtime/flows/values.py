"""How a flow's Python values become bytes where they must (DESIGN.md §3b: "between steps the
runtime chooses").

Inside one computation of a flow values are never encoded. Where they cross to another
computation (after a ``key_by``, into a ``sink``) or into state (a reducer's or a window's
accumulator, a join's buffered records), they are packed with :data:`VALUES`: MessagePack
(no pickle, no code: a value built of ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``list``, ``tuple``, ``dict`` and :class:`~runtime.windows.WindowResult`
comes back as it went, tuples as tuples). Anything else is refused with a message that says
how to carry it (encode it, or make it a dict).

:data:`AUTO` is the codec of streams a flow writes without being told one (a window's late
records, a sink's input by default): bytes as they are, text as UTF-8, anything else as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack

from runtime.codecs import JSON
from runtime.errors import UsageError
from runtime.flows.assigners import WindowResult
from runtime.state import NEVER_EXPIRES

_TUPLE, _WINDOW = 1, 2
_TAG_PLAIN, _TAG_TUPLE, _TAG_WINDOW = 0x4D, 0x54, 0x57  # "M", "T", "W": the value's outer shape
_KEPT_LIST = NEVER_EXPIRES + b"M"  # what a stored list starts with (FlowValues.kept_lists)


def _refuse(obj: Any) -> Any:
    if type(obj) is WindowResult:
        return msgpack.ExtType(_WINDOW, _inner.pack(list(obj)))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _inner.pack(list(obj)))
    raise UsageError(
        f"a value of type {type(obj).__name__} cannot travel between the steps of a flow (they carry None, bool, "
        "int, float, str, bytes, list, tuple, dict and WindowResult, nested; no pickle); turn it into one of "
        "those (a dict of its fields, or bytes you encode) in the step that makes it")


def _ext(code: int, data: bytes) -> Any:
    items = msgpack.unpackb(data, ext_hook=_ext, strict_map_key=False)
    return WindowResult(*items) if code == _WINDOW else tuple(items)


_outer = msgpack.Packer(default=_refuse, strict_types=True)
_inner = msgpack.Packer(default=_refuse, strict_types=True)  # for what _refuse packs inside _outer


class FlowValues:
    """The codec of values between a flow's computations and in its operators' state."""

    name = "flow"

    def encode(self, obj: Any) -> bytes:
        t = type(obj)
        if t is WindowResult:
            return b"W" + _outer.pack([obj.start, obj.end, obj.value])
        if t is tuple:
            return b"T" + _outer.pack(list(obj))
        return b"M" + _outer.pack(obj)

    def kept_lists(self, objs: Iterable[list[Any] | None]) -> list[bytes | None]:
        """Lists (an operator's ``[end, acc]``), each as :meth:`encode` and then
        :func:`runtime.state.kept` make it, a stored cell that never expires (None stays None: a
        delete); in one call for a batch's writes, not three per list."""
        head, pack = _KEPT_LIST, _outer.pack
        return [None if o is None else head + pack(o) for o in objs]

    def decode(self, data: bytes) -> Any:
        if not data:
            raise UsageError("an empty value is not one a flow packed; a stream between a flow's steps carries only "
                             "what its producing step wrote")
        tag = data[0]
        try:
            items = msgpack.unpackb(memoryview(data)[1:], ext_hook=_ext, strict_map_key=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
            raise UsageError(f"a value between a flow's steps could not be read ({e}); only the flow's own steps "
                             "write those streams") from None
        if tag == _TAG_PLAIN:
            return items
        if tag == _TAG_TUPLE:
            return tuple(items)
        if tag == _TAG_WINDOW:
            return WindowResult(*items)
        raise UsageError(f"a value between a flow's steps starts with {tag:#x}, which no flow writes")


class Auto:
    """Bytes as they are, ``str`` as UTF-8, anything else as JSON (decoding gives bytes)."""

    name = "auto"

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, bytes):
            return obj
        if isinstance(obj, str):
            return obj.encode("utf-8", "surrogatepass")
        if isinstance(obj, (bytearray, memoryview)):
            return bytes(obj)
        return JSON.encode(list(obj) if isinstance(obj, tuple) else obj)

    def decode(self, data: bytes) -> bytes:
        return data


VALUES = FlowValues()
AUTO = Auto()
