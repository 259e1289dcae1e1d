"""The producers of an injector that showed a credential, kept apart from everyone else's
(review N4).

A receiver deduplicates by producer: one mark per producer prefix, and the ids of records
that carry no sequence. Every injector-token holder can send records under any prefix it
likes, so one that knows another injector's name (its prefix is a digest of it, so that a
re-run resends the same ids) could send ``prefix‖2**64-1`` and have every real record of
that injector read as a duplicate. A caller whose credential proved a name (``owner``,
runtime/security.py) has each of its producer prefixes replaced, on arrival, by a digest of
the owner and the prefix: its marks and ids live where only callers with the same
credential reach, and a re-run with the credential lands on the same ones. A record's id
keeps its last 8 bytes (a sequenced producer's sequence), so range dedup is unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from runtime.columns import Columns
from runtime.record import WORKER_PRODUCER_BIT

Orders = Mapping[bytes, tuple[int, int]]


def owned_prefix(owner: str, prefix: bytes) -> bytes:
    """``prefix`` (8 bytes) as the receivers keep it for a caller with a credential for
    ``owner``: a producer outside the cluster still (its first bit clear)."""
    name = owner.encode()
    h = hashlib.blake2b(digest_size=8, person=b"millstream-owner")
    h.update(len(name).to_bytes(4, "big"))
    h.update(name)
    h.update(prefix)
    d = h.digest()
    return bytes((d[0] & ~WORKER_PRODUCER_BIT & 0xFF,)) + d[1:]


def owned(owner: str, records: Columns, orders: Orders | None) -> tuple[Columns, dict[bytes, tuple[int, int]] | None]:
    """A delivery's records and producer orders with every producer prefix owned by ``owner``."""
    memo: dict[bytes, bytes] = {}

    def own(prefix: bytes) -> bytes:
        p = memo.get(prefix)
        if p is None:
            p = memo[prefix] = owned_prefix(owner, prefix)
        return p

    if records.producer is not None:
        records = dataclasses.replace(records, producer=own(records.producer))
    elif records.ids is not None:
        records = dataclasses.replace(records, ids=[own(i[:8]) + i[8:] for i in records.ids])
    return records, None if orders is None else {own(p): o for p, o in orders.items()}
