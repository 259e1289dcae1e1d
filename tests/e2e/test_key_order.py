"""Per-producer key order (DESIGN.md §2) through backpressure, retries and rounds in flight.

Records of one key from one producer (an injector, or a tablet's productions) must reach
user code in the order that producer sent them. Here every worker answers a share of all
deliveries BUSY (the ``busy`` fault of runtime/faults.py), so injector rounds in flight
and tablets' productions are refused and retried at random, and each stage
(tests.jobs:InOrder) reports any record of a key that comes after a later one of its
producer. Exactly-once stages keep order by their producers' marks; an at-least-once
reader and records with the caller's own ids have no marks to lean on, and are checked too.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

from injectors import Injector
from runtime import Topology
from runtime.record import derived_id
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until

BASE_TS = 1_700_000_000_000_000
KEYS = 16
END_OF_TIME = (1 << 63) - 1


def _topology(out: str) -> Topology:
    t = Topology("key-order")
    step = "tests.jobs:InOrder"
    # Two exactly-once stages after the injector's sequenced records, then a sink.
    t.add_computation("first", step, inputs={"in": None}, outputs=["s1", "disorder"], key_ranges=2,
                      params={"name": "first", "out": "s1"})
    t.add_computation("second", step, inputs={"s1": None}, outputs=["s2", "disorder"], key_ranges=2,
                      params={"name": "second", "out": "s2"})
    t.add_computation("final", "runtime.sinks:FileSink", inputs={"s2": None}, key_ranges=1,
                      params={"path": os.path.join(out, "final")})
    # The same records at an at-least-once reader, and records with the caller's ids.
    t.add_computation("loose", step, inputs={"loose": None}, outputs=["disorder"], key_ranges=2,
                      exactly_once=False, params={"name": "loose"})
    t.add_computation("opaque", step, inputs={"ids": None}, outputs=["disorder"], key_ranges=2,
                      params={"name": "opaque"})
    t.add_computation("disorders", "runtime.sinks:FileSink", inputs={"disorder": None}, key_ranges=1,
                      params={"path": os.path.join(out, "disorder")})
    return t


def _send(c: Cluster, stream: str, n: int, own_ids: bool) -> int:
    """``n`` records over KEYS keys, each key's values its rising send indexes, in full rounds
    of 40 with up to 4 in flight; returns the peak of rounds in flight."""
    with Injector(c.masters_arg, stream, f"order-{stream}", batch_size=40, max_in_flight=4, timeout=120) as inj:
        for i in range(n):
            rid = derived_id(b"order", str(i).encode()) if own_ids else None
            inj.send(b"k%d" % (i % KEYS), b"%d" % i, BASE_TS + i, id=rid)
    return inj.peak_in_flight  # finished: every round is done


def test_each_key_is_processed_in_send_order_through_busy_retries_and_rounds_in_flight(tmp_path: object) -> None:
    c = Cluster(str(tmp_path), workers=0)
    c.start()
    try:
        # Three deliveries in twenty are refused and retried; an injector's take 10 ms more
        # (a network's round trip), so its next rounds fill and leave before it is answered.
        c.add_faulty_workers(2, "busy 15", "delay-injector 10")
        out = os.path.join(c.data_dir, "out")
        c.client.submit(_topology(out))
        c.wait_assigned()
        n = 4000
        errors: list[BaseException] = []

        def send_other(stream: str, own_ids: bool) -> None:
            try:
                _send(c, stream, n, own_ids)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        others = [threading.Thread(target=send_other, args=("ids", True)),
                  threading.Thread(target=send_other, args=("loose", False))]
        for t in others:
            t.start()
        peak = _send(c, "in", n, own_ids=False)
        for t in others:
            t.join(180)
        assert not errors, errors
        assert peak >= 2, "the rounds never overlapped: nothing here tested several in flight"

        # Both injectors finished: once nothing upstream of the sinks is left, their
        # watermarks reach the end of time.
        def drained() -> bool:
            comps = c.client.status()["computations"]
            return all(comps[s]["low_watermark"] == END_OF_TIME for s in ("final", "loose", "opaque", "disorders"))
        wait_until(drained, 120, "every record through every stage")
        final = os.path.join(out, "final")
        seen: dict[str, list[int]] = {}
        for row in read_file_sink(final):
            seen.setdefault(str(row["key"]), []).append(int(str(row["value"])))
        for key, values in seen.items():
            assert values == sorted(values), f"{key}: the sink saw {values[:40]}..."
        assert sorted(v for vs in seen.values() for v in vs) == list(range(n))
        disorder = [row["value"] for row in read_file_sink(os.path.join(out, "disorder"))]
        assert disorder == [], f"records after a later one of their producer, by reader: {Counter(str(d).split()[0] for d in disorder)}: {disorder[:10]}"
    finally:
        c.close()
