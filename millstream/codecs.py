"""Codecs of typed state: ``BYTES``, ``STR``, ``INT``, ``FLOAT``, ``JSON``, or any object with
``encode(obj) -> bytes`` and ``decode(bytes) -> obj`` (the :class:`Codec` protocol).
Implemented in ``runtime.codecs``."""

from runtime.codecs import BYTES, FLOAT, INT, JSON, STR, Codec

__all__ = ["BYTES", "FLOAT", "INT", "JSON", "STR", "Codec"]
