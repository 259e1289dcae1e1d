"""An injector's rounds in flight, and the order that lets several be in flight at once.

Receivers deduplicate an injector's records by one number per producer: the highest
sequence each tablet committed (worker/dedup.py). So a tablet must commit a producer's
records in sequence order, or a later record committed first would make the earlier ones
look like duplicates. With one round in flight that holds by itself. With several, each
delivery names the last sequence of the delivery before it to the same tablet (``after``
in its order), and the tablet answers OUT_OF_ORDER until that one is committed there: a
round may overtake another on the wire, never in a tablet.

The chain holds only while every round in flight was routed with one routing version (a
split or merge renames destinations). So a round starts while others are in flight only
if it is routed with theirs and none of them has failed; a round whose first attempt did
not succeed everywhere retries only once every round before it is done, which is the
situation of a single round in flight (``after`` 0 is then true). Rounds also finish in
order, so "committed" always means a prefix of the injector's sequence.

The chain is also what keeps each key's records in send order (DESIGN.md §2): a round that
overtakes another on the wire waits at the tablet. It binds only deliveries that list a
producer (records with the caller's own ids list none) at exactly-once readers (the others
keep no marks to check ``after`` against). A round with any other delivery is not
``ordered``: it goes only once every round before it is done, and no round joins it, as a
single round in flight; its retries then overtake nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime import delivery
from runtime.columns import Columns
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb

Pending = dict[tuple[str, int, int], Columns]  # (computation, range, chunk) -> its records
Orders = dict[tuple[str, int, int], list[pb.ProducerOrder]]
Tails = dict[tuple[str, int], dict[bytes, int]]  # tablet -> producer -> last sequence sent to it


@dataclass(eq=False)
class Round:
    """Records taken from the queue together, in queue order; ``index`` is the take order."""

    index: int
    records: Columns
    min_ts: int
    routing: RoutingTable        # the version it was taken under (first attempt)
    prepared: bool = False       # routed and ordered (the next round may be taken)
    slow: bool = False           # its first attempt did not succeed everywhere
    ordered: bool = True         # every delivery ordered by the chain at an exactly-once reader
    done: bool = False           # finished: committed, or given back (``returned``)
    returned: bool = False       # failed for good: its records go back to the queue
    pending: Pending = field(default_factory=dict)
    orders: Orders = field(default_factory=dict)


def chained_orders(pending: Pending, sequenced: dict[bytes, int], tails: Tails) -> tuple[Orders, Tails]:
    """Each delivery's place in its producers' orders: the first chunk to a tablet follows the
    last sequence ``tails`` says was sent there (0: nothing in flight), a later chunk follows
    the one before it. Returns the orders and the tails after these deliveries (``tails`` is
    not changed: a round that fails before sending leaves no mark on the chain)."""
    out: Orders = {}
    after: Tails = {}
    for dest in sorted(pending):
        tablet = dest[:2]
        before = after.setdefault(tablet, dict(tails.get(tablet, {})))
        here = _last_sequences(pending[dest], sequenced)
        out[dest] = delivery.to_orders({p: (before.get(p, 0), 0) for p in here})
        before.update(here)
    return out, after


def _last_sequences(columns: Columns, sequenced: dict[bytes, int]) -> dict[bytes, int]:
    """The last sequence of each of ``sequenced``'s producers among ``columns``' records: one
    look in the sequenced form, a scan from the end of the ids otherwise."""
    if columns.producer is not None:
        seqs = columns.seqs
        return {columns.producer: seqs[-1]} if seqs and columns.producer in sequenced else {}
    here: dict[bytes, int] = {}
    for rid in reversed(columns.all_ids()):  # each producer's last record here, from the end
        prefix = rid[:8]
        if prefix in sequenced and prefix not in here:
            here[prefix] = int.from_bytes(rid[8:], "big")
            if len(here) == len(sequenced):
                break
    return here


def ordered(pending: Pending, orders: Orders, routing: RoutingTable) -> bool:
    """Whether the chain keeps every delivery of a round in order at its tablet: each lists a
    producer and goes to an exactly-once reader (worker/batch.py checks ``after`` there)."""
    computations = routing.computations
    return all(orders.get(dest) and dest[0] in computations and computations[dest[0]].exactly_once
               for dest in pending)
