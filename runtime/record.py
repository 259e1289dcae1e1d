"""Records and their identifiers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class Record:
    """One element of a stream.

    ``key`` and ``value`` are opaque bytes; ``timestamp`` is event time in
    microseconds since the Unix epoch; ``id`` is 16 unique bytes, stable across
    retries, which receivers use to drop duplicates.
    """

    key: bytes
    value: bytes
    timestamp: int
    id: bytes


# Bounds on one record (key, value): it must fit one delivery (gRPC messages are capped at
# 64 MiB, runtime/wire) with room for the rest of its batch. Checked where records are made:
# ctx.produce, ctx.state, Injector.send.
MAX_VALUE_BYTES = 16 << 20
MAX_KEY_BYTES = 64 << 10


def producer_prefix(producer: str) -> bytes:
    """The 8-byte prefix shared by every id one producer mints."""
    return hashlib.blake2b(producer.encode(), digest_size=8).digest()


def sequence_id(prefix: bytes, seq: int) -> bytes:
    """A record id made of a producer prefix and that producer's sequence number."""
    return prefix + seq.to_bytes(8, "big")


def derived_id(*parts: bytes) -> bytes:
    """A record id derived deterministically from other identifiers."""
    h = hashlib.blake2b(digest_size=ID_BYTES)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()
