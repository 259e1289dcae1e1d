"""An injector's rounds: records taken from its queue together, delivered together.

Several rounds may be in flight at once (``max_in_flight``). What keeps a producer's records
in order at each tablet however they travel is the delivery core's (runtime/courier.py):
rounds enter it in the order they were taken, each record with its *place* in the injector's
send order (``Round.first`` plus its index), so the core keeps each key's records in send order
through re-routing, and chains the deliveries in flight to one tablet (each names the last
sequence before it, ``after``; the tablet holds it until that one is committed). Rounds
finish in the injector in take order, so "committed" always means a prefix of its sequence.

A round that fails for good (not committed within the injector's ``timeout``, refused, the
injector closed) fails every round in flight with it, and every round taken until their
records are queued again (one sent meanwhile would pass them, and they would be dropped as
duplicates): their records go back to the front of the queue, in order, and are sent again
under the same ids once the caller retries. A round's records for one tablet are a
:class:`Chunk`; what the rounds queued in the delivery core has an owner (:class:`Sending`),
let go of when a round fails.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from runtime.columns import Columns
from runtime.errors import InjectionError, MillstreamError


@dataclass(eq=False)
class Round:
    """Records taken from the queue together, in queue order; ``index`` is the take order,
    ``first`` the place of its first record in the injector's send order."""

    index: int
    records: Columns
    min_ts: int
    first: int = 0
    done: bool = False           # finished: committed, or given back (``returned``)
    returned: bool = False       # failed for good: its records go back to the queue
    # The delivery shell's (injectors/tablets.py), on its loop:
    finished: threading.Event = field(default_factory=threading.Event)  # committed, or ``error``
    error: MillstreamError | None = None
    released: bool = False       # its thread handed it over (it may be sent)
    # A receiver answered it under a routing this newer: it is done once the injector has
    # that routing (and has sent it to every reader that one adds).
    needs_version: int = 0
    readers: set[str] = field(default_factory=set)  # the computations it went to
    outstanding: dict[int, Any] = field(default_factory=dict)  # id -> its parcels not committed yet


@dataclass(eq=False, slots=True)
class Chunk:
    """A round's records for one tablet (a parcel, runtime/parcels.py): ``order`` is each
    record's place in the injector's send order."""

    computation: str
    key_range: int
    cols: Columns
    producers: tuple[bytes, ...]
    order: list[int] | None


class Sending:
    """The owner of what the injector sends (runtime/parcels.py): one until a round fails for
    good; then what it queued is let go of (``closing``) and the rounds after have a new one."""

    token = 0

    def __init__(self, name: str) -> None:
        self.name = name
        self.closing = False


class Interrupted(InjectionError):
    """A round failed because its caller was interrupted (Ctrl-C in a flush): the caller knows,
    so no later call raises it again; the records are queued again as for any failure."""
