"""How an injector routes its records: to the readers of its stream, by the key each
reader's key extractor gives (run here, on the producing side, as DESIGN.md §2 says), a
record an extractor fails on to that reader's dead letters instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from itertools import repeat

from runtime import kernels
from runtime.columns import Columns
from runtime.errors import UsageError
from runtime.imports import CodePolicy
from runtime.keyspace import key_hashes
from runtime.record import Record, derived_id
from runtime.routing import SKIP, KeyExtractor, RoutingTable
from runtime.topology import dead_letter, dead_letter_stream
from runtime.wire import millstream_pb2 as pb

log = logging.getLogger(__name__)
# Destination -> (its records, each one's index in the records routed).
Routed = dict[tuple[str, int], tuple[Columns, Sequence[int]]]


class Routes:
    """One injector's routing of its stream's records."""

    def __init__(self, name: str, stream: str, code_policy: CodePolicy = CodePolicy()) -> None:
        self.name = name
        self.stream = stream
        self._extractors: dict[str, KeyExtractor] = {}
        self._code_policy = code_policy  # where key extractors may come from
        self._extractor_failures: dict[str, int] = {}  # reader -> records its key extractor failed on
        self._reach: tuple[RoutingTable | None, set[str]] = (None, set())

    def table(self, routing: pb.Routing) -> RoutingTable:
        """The routing table of ``routing``, with its key extractors loaded (under the code
        policy: review N10)."""
        table = RoutingTable(routing)
        table.load_extractors(self._extractors, self._code_policy)
        return table

    def reads(self, routing: RoutingTable, computation: str) -> bool:
        """Whether ``computation`` still takes this stream's records (a reader, or a reader of
        a reader's dead letters) under ``routing``."""
        cached, reach = self._reach
        if cached is not routing:
            reach = self.reached(routing, routing.readers(self.stream))
            self._reach = (routing, reach)
        return computation in reach

    def route_with(self, records: Columns, routing: RoutingTable) -> dict[tuple[str, int], Columns]:
        """``records`` by destination tablet, each destination's in their order
        (:meth:`route_indexed` without the indexes)."""
        return {dest: cols for dest, (cols, _) in self.route_indexed(records, routing).items()}

    def route_indexed(self, records: Columns, routing: RoutingTable) -> Routed:
        """``records`` by destination tablet, each destination's in their order, as columns,
        with each one's index in ``records``: every key is hashed once whatever the number of
        readers, and a reader with one range takes the columns as they are. A record a
        reader's key extractor fails on goes to that reader's dead letters
        (``<reader>.dead_letter``) instead, right after it, and to every other reader as
        usual: one reader's bug does not stop the stream (review N5). Each record carries the
        stream it goes on (Record.stream at the reader); a flow's key extractor may drop a
        record for its reader (a filter before its key_by: routing.SKIP)."""
        if records.streams is None:
            records = replace(records, streams=self.stream)
        hashes: list[int] | None = None
        # Destination -> what goes there: (the indexes in ``records`` of what the reader keyed,
        # None for all; which of those go there, None for all; those records).
        pieces: dict[tuple[str, int], list[tuple[list[int] | None, list[int] | None, Columns]]] = {}
        failures: list[tuple[int, str, BaseException]] = []  # (record index, reader, error)
        for comp, extractor in routing.subscriptions(self.stream):
            taken: list[int] | None = None  # the records this reader takes (None: all)
            routed = records
            if extractor is not None:
                taken, routed = _extracted(comp, extractor, records, failures)
            sole = routing.sole_range(comp)
            if sole is not None:
                pieces.setdefault((comp, sole), []).append((taken, None, routed))
                continue
            if extractor is None:
                hashes = key_hashes(records.keys) if hashes is None else hashes
                ranges = routing.ranges_of(comp, hashes)
            else:
                ranges = routing.ranges_of(comp, key_hashes(routed.keys))
            groups = kernels.group(ranges)
            for r, ix in groups.items():
                if len(groups) == 1:
                    pieces.setdefault((comp, r), []).append((taken, None, routed))
                else:
                    pieces.setdefault((comp, r), []).append((taken, ix, routed.select(ix)))
        letters: dict[tuple[str, int], list[tuple[int, Record]]] = {}
        for i, reader, error in sorted(failures, key=lambda f: f[0]):  # (stable: readers in order)
            letter = self.dead_letter(reader, records.record(i), error)
            for comp, kr, key in routing.route_fields(dead_letter_stream(reader), letter.key, letter.value,
                                                      letter.timestamp, None, self._lost_dead_letter):
                letters.setdefault((comp, kr), []).append(
                    (i, Record(key, letter.value, letter.timestamp, letter.id, dead_letter_stream(reader))))
        out: Routed = {}
        for dest in [*pieces, *(d for d in letters if d not in pieces)]:
            parts = pieces.get(dest, [])
            if len(parts) == 1 and dest not in letters:
                keyed, chosen, cols = parts[0]
                where: Sequence[int] = range(len(cols)) if chosen is None else chosen
                out[dest] = (cols, where if keyed is None else [keyed[i] for i in where])
                continue
            # Several readings of the stream to one tablet, or dead letters among them: in the
            # order of the records they come from, each record's dead letters after it.
            merged: list[tuple[int, int, Record]] = []
            for keyed, chosen, cols in parts:
                where = range(len(cols)) if chosen is None else chosen
                if keyed is not None:
                    where = [keyed[i] for i in where]
                merged += zip(where, repeat(0), cols.records())
            merged += ((i, 1, letter) for i, letter in letters.get(dest, ()))
            merged.sort(key=lambda m: m[:2])
            out[dest] = (Columns.of_records([m[2] for m in merged]), [m[0] for m in merged])
        return out

    def dead_letter(self, reader: str, r: Record, error: BaseException) -> Record:
        """What goes to ``<reader>.dead_letter`` for a record ``reader``'s key extractor failed on."""
        text = f"{type(error).__name__}: {error}"
        n = self._extractor_failures[reader] = self._extractor_failures.get(reader, 0) + 1
        log.log(logging.WARNING if str(n).rstrip("0") == "1" else logging.DEBUG,
                "injector %s: the key extractor of %r on %r failed (%d times): %s; the record goes to %s",
                self.name, reader, self.stream, n, text, dead_letter_stream(reader))
        letter = dead_letter(error, reader, r.value, stream=self.stream, producer="injector/" + self.name)
        # An opaque id (no producer's order): derived, so a retried round sends the same one.
        return Record(r.key, letter, r.timestamp, derived_id(b"dead-letter", reader.encode(), r.id))

    def _lost_dead_letter(self, reader: str, error: BaseException) -> None:
        log.error("injector %s: a dead letter is lost: the key extractor of %r, a reader of dead letters, "
                  "failed: %s: %s", self.name, reader, type(error).__name__, error)

    @staticmethod
    def reached(routing: RoutingTable, readers: set[str]) -> set[str]:
        """The computations records of ``readers`` may go to: them, and the readers of their
        dead letters."""
        return readers.union(*(routing.readers(dead_letter_stream(c)) for c in readers))

def _extracted(reader: str, extractor: KeyExtractor, records: Columns,
               failures: list[tuple[int, str, BaseException]]) -> tuple[list[int] | None, Columns]:
    """``records`` keyed by ``reader``'s key extractor: the indexes of those it keyed (None:
    all) and them with their new keys. Each record it fails on (raises, or returns no
    bytes) is added to ``failures``; anything it raises is caught, as for any user code."""
    keys, values, timestamps = records.keys, records.values, records.timestamps
    taken: list[int] = []
    extracted: list[bytes] = []
    for i, rid in enumerate(records.all_ids()):
        try:
            key = extractor(Record(keys[i], values[i], timestamps[i], rid))
            if key is SKIP:  # a flow's filter before the reader's key_by dropped it
                continue
            if not isinstance(key, bytes):
                raise UsageError(f"the key extractor of {reader!r} returned {type(key).__name__}, not bytes; "
                                 "return the key as bytes (encode it)")
        except BaseException as e:
            failures.append((i, reader, e))
            continue
        taken.append(i)
        extracted.append(key)
    if len(taken) == len(records):
        return None, replace(records, keys=extracted)
    out = records.select(taken)
    out.keys = extracted
    return taken, out
