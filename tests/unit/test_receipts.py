"""Receipts held (runtime/receipts.py): the one rule a tablet's outbox and an injector's
watermark both let go of committed deliveries by."""

from __future__ import annotations

from runtime.receipts import HeldReceipts


def test_a_receipt_is_let_go_of_once_the_leader_holds_its_report_or_does_not_know_its_worker() -> None:
    held: HeldReceipts[str] = HeldReceipts()
    held.hold(("w1", 5), 100, "a")
    held.hold(("w1", 5), 90, "b")
    held.hold(("w1", 7), 80, "c")
    held.hold(("w2", 3), 70, "d")
    assert held.oldest() == 70 and len(held) == 4
    assert held.release({"w1": 4, "w2": 2}) == []  # older reports: still held
    assert sorted(held.release({"w1": 6, "w2": 2})) == ["a", "b"]
    assert held.oldest() == 70
    assert held.release({"w1": 6}) == ["d"], "a worker the leader does not know holds nothing"
    assert held.oldest() == 80 and held.items() == ["c"]
    assert held.release({"w1": 9}) == ["c"] and held.oldest() is None and not held
