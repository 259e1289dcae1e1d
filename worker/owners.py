"""The producers of an injector that showed a credential, kept apart from everyone else's
(review N4).

A receiver deduplicates by producer: one mark per producer prefix, and the ids of records
that carry no sequence. Every injector-token holder can send records under any prefix it
likes, so one that knows another injector's name (its prefix is a digest of it, so that a
re-run resends the same ids) could send ``prefix‖2**64-1`` and have every real record of
that injector read as a duplicate. A caller whose credential proved a name (``owner``,
runtime/security.py) has each of its producer prefixes replaced, on arrival, by a digest of
the prefix keyed with the credential's MAC: a prefix nobody without the credential can
compute, so no other caller can send under it, and a re-run with the credential lands on
the same ones. (An unkeyed digest of the name and the prefix would not do: both are known,
and a caller without a credential could send the result as it is.) A record's id keeps its
last 8 bytes (a sequenced producer's sequence), so range dedup is unchanged.

The key is the credential, made with the worker token: a new worker token makes new
credentials, and moves every owner's producers at the receivers as turning a credential on
does (a replay of what was sent before counts again).
"""

from __future__ import annotations

import dataclasses
import hashlib

from runtime.columns import Columns
from runtime.delivery import Orders
from runtime.record import WORKER_PRODUCER_BIT
from runtime.security import Owner


def owned_prefix(owner: Owner, prefix: bytes) -> bytes:
    """``prefix`` (8 bytes) as the receivers keep it for a caller whose credential proved
    ``owner``: a producer outside the cluster still (its first bit clear)."""
    d = hashlib.blake2b(prefix, digest_size=8, key=owner.key, person=b"millstream-owner").digest()
    return bytes((d[0] & ~WORKER_PRODUCER_BIT & 0xFF,)) + d[1:]


def owned(owner: Owner, records: Columns, orders: Orders | None) -> tuple[Columns, dict[bytes, tuple[int, int]] | None]:
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
