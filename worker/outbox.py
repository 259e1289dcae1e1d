"""What a tablet has produced and not yet fully handed over, by shipment (one outgoing
delivery of one commit, worker/storage.py).

A production is *unacknowledged* until its receiver commits it; then *held* until the
leader holds the receiver's progress report that reflects it (its receipt, see
docs/time.md); both hold the tablet's oldest work, hence the watermark. Its checkpoint is
deleted only once it is let go of: a tablet that closes (a failed batch, a move, a split)
with productions held leaves them checkpointed, so whoever opens it next re-sends them and
holds them again (the receiver drops them as duplicates) instead of forgetting the hold
(review N21).
"""

from __future__ import annotations

from runtime.delivery import Receipt
from runtime.receipts import HeldReceipts, TimestampBag
from worker.storage import Shipment


class Outbox:
    """In-flight productions of one tablet, for its watermark: counted in records, their
    timestamps kept by shipment (its oldest)."""

    def __init__(self) -> None:
        self.unacked = 0  # records
        self._unacked_ts = TimestampBag()
        self._held: HeldReceipts[Shipment] = HeldReceipts()

    def sent(self, shipments: list[Shipment]) -> None:
        for s in shipments:
            self.unacked += len(s.cols)
            self._unacked_ts.add(s.oldest)

    def replaced(self, old: list[Shipment], new: list[Shipment]) -> None:
        """Re-routing cut unacknowledged shipments ``old`` into ``new`` (runtime/courier.py)."""
        for s in old:
            self.unacked -= len(s.cols)
            self._unacked_ts.remove(s.oldest)
        self.sent(new)

    def acked(self, shipments: list[Shipment], receipt: Receipt | None) -> list[Shipment]:
        """The receiver committed them (or never will: ``receipt`` None): hold their
        timestamps until ``receipt`` is confirmed. Returns those let go of now."""
        for s in shipments:
            self.unacked -= len(s.cols)
            self._unacked_ts.remove(s.oldest)
        if receipt is None:
            return shipments
        for s in shipments:
            self._held.hold(receipt, s.oldest, s)
        return []

    def release(self, reported: dict[str, int]) -> list[Shipment]:
        """Let go of shipments whose receiver's covering report the leader holds (or whose
        receiver the leader does not know: its reports count for nothing then); returns them."""
        return self._held.release(reported)

    @property
    def held(self) -> int:
        """Records acknowledged whose receipt is not confirmed yet."""
        return sum(len(s.cols) for s in self._held.items())

    def oldest(self) -> int | None:
        """The oldest timestamp still in hand-over."""
        values = [t for t in (self._unacked_ts.min(), self._held.oldest()) if t is not None]
        return min(values) if values else None
