"""What a tablet has produced and not yet fully handed over.

A production is *unacknowledged* until its receiver commits it; then *held* until the
leader holds the receiver's progress report that reflects it (its receipt, see
docs/time.md); both hold the tablet's oldest work, hence the watermark.
"""

from __future__ import annotations

from runtime.delivery import Receipt
from worker.progress import TimestampBag
from worker.storage import Production


class Outbox:
    """In-flight productions of one tablet, for its watermark."""

    def __init__(self) -> None:
        self.unacked = 0
        self._unacked_ts = TimestampBag()
        self._held_ts = TimestampBag()
        self._held: dict[Receipt, list[int]] = {}

    def sent(self, productions: list[Production]) -> None:
        self.unacked += len(productions)
        for p in productions:
            self._unacked_ts.add(p.record.timestamp)

    def acked(self, productions: list[Production], receipt: Receipt | None) -> None:
        """The receiver committed them: hold their timestamps until ``receipt`` is confirmed."""
        self.unacked -= len(productions)
        held = self._held.setdefault(receipt, []) if receipt is not None else None
        for p in productions:
            self._unacked_ts.remove(p.record.timestamp)
            if held is not None:
                held.append(p.record.timestamp)
                self._held_ts.add(p.record.timestamp)

    def release(self, reported: dict[str, int]) -> None:
        """Let go of timestamps whose receiver's covering report the leader holds (or whose
        receiver the leader does not know: its reports count for nothing then)."""
        for receipt in [r for r in self._held if reported.get(r[0], r[1]) >= r[1]]:
            for ts in self._held.pop(receipt):
                self._held_ts.remove(ts)

    def oldest(self) -> int | None:
        """The oldest timestamp still in hand-over."""
        values = [t for t in (self._unacked_ts.min(), self._held_ts.min()) if t is not None]
        return min(values) if values else None
