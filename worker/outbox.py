"""What a tablet has produced and not yet fully handed over.

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
from worker.progress import TimestampBag
from worker.storage import Production


class Outbox:
    """In-flight productions of one tablet, for its watermark."""

    def __init__(self) -> None:
        self.unacked = 0
        self._unacked_ts = TimestampBag()
        self._held_ts = TimestampBag()
        self._held: dict[Receipt, list[Production]] = {}

    def sent(self, productions: list[Production]) -> None:
        self.unacked += len(productions)
        for p in productions:
            self._unacked_ts.add(p.record.timestamp)

    def acked(self, productions: list[Production], receipt: Receipt | None) -> list[Production]:
        """The receiver committed them (or never will: ``receipt`` None): hold their
        timestamps until ``receipt`` is confirmed. Returns those let go of now."""
        self.unacked -= len(productions)
        for p in productions:
            self._unacked_ts.remove(p.record.timestamp)
        if receipt is None:
            return productions
        self._held.setdefault(receipt, []).extend(productions)
        for p in productions:
            self._held_ts.add(p.record.timestamp)
        return []

    def release(self, reported: dict[str, int]) -> list[Production]:
        """Let go of productions whose receiver's covering report the leader holds (or whose
        receiver the leader does not know: its reports count for nothing then); returns them."""
        out: list[Production] = []
        for receipt in [r for r in self._held if reported.get(r[0], r[1]) >= r[1]]:
            held = self._held.pop(receipt)
            for p in held:
                self._held_ts.remove(p.record.timestamp)
            out += held
        return out

    @property
    def held(self) -> int:
        """Productions acknowledged whose receipt is not confirmed yet."""
        return sum(len(ps) for ps in self._held.values())

    def oldest(self) -> int | None:
        """The oldest timestamp still in hand-over."""
        values = [t for t in (self._unacked_ts.min(), self._held_ts.min()) if t is not None]
        return min(values) if values else None
