"""What a tablet has produced and not yet fully handed over.

A production is *unacknowledged* until its receiver commits it; then *held* until the
leader holds the receiver's progress report that reflects it (its receipt, see
docs/time.md); both hold the tablet's oldest work, hence the watermark. Separately, the
sequences of checkpointed productions give the tablet's *resend floor* (the lowest id it
may still resend), which lets receivers forget older dedup ids; a checkpoint counts as
gone only once its unsynced delete is followed by a synced commit.
"""

from __future__ import annotations

from worker.progress import TimestampBag
from worker.storage import Production

Receipt = tuple[str, int]  # (receiving worker, its first report reflecting the commit)


def ckey_seq(ckey: bytes) -> int:
    """The producer sequence number inside a checkpoint key."""
    return int.from_bytes(ckey[1:9], "big")


class Outbox:
    """In-flight productions of one tablet, for its watermark and its resend floor."""

    def __init__(self) -> None:
        self.unacked = 0
        self._unacked_ts = TimestampBag()
        self._held_ts = TimestampBag()
        self._held: dict[Receipt, list[int]] = {}
        self._ckpt_seqs = TimestampBag()
        self._acked_not_durable: list[int] = []

    def sent(self, productions: list[Production]) -> None:
        self.unacked += len(productions)
        for p in productions:
            self._unacked_ts.add(p.record.timestamp)
            if p.ckey:
                self._ckpt_seqs.add(ckey_seq(p.ckey))

    def acked(self, productions: list[Production], receipt: Receipt | None) -> None:
        """The receiver committed them: hold their timestamps until ``receipt`` is confirmed."""
        self.unacked -= len(productions)
        held = self._held.setdefault(receipt, []) if receipt is not None else None
        for p in productions:
            self._unacked_ts.remove(p.record.timestamp)
            if held is not None:
                held.append(p.record.timestamp)
                self._held_ts.add(p.record.timestamp)
            if p.ckey:
                self._acked_not_durable.append(ckey_seq(p.ckey))

    def release(self, reported: dict[str, int]) -> None:
        """Let go of timestamps whose receiver's covering report the leader holds (or whose
        receiver the leader does not know: its reports count for nothing then)."""
        for receipt in [r for r in self._held if reported.get(r[0], r[1]) >= r[1]]:
            for ts in self._held.pop(receipt):
                self._held_ts.remove(ts)

    def checkpointed(self, productions: list[Production]) -> None:
        """Productions already sent got checkpoints (weak ones whose ack was slow)."""
        for p in productions:
            if p.ckey:
                self._ckpt_seqs.add(ckey_seq(p.ckey))

    def durable_mark(self) -> int:
        """Taken just before a commit is written (on the tablet's thread): the checkpoint
        deletes acknowledged so far, whose unsynced writes that commit makes durable. The
        event loop writes each delete before it appends here, so every one counted is older
        than the commit."""
        return len(self._acked_not_durable)

    def committed(self, mark: int) -> None:
        """A synced commit happened: the first ``mark`` checkpoint deletes are durable now."""
        for seq in self._acked_not_durable[:mark]:
            self._ckpt_seqs.remove(seq)
        del self._acked_not_durable[:mark]

    def resend_floor(self, store_seq: int) -> int:
        oldest = self._ckpt_seqs.min()
        return store_seq + 1 if oldest is None else oldest

    def oldest(self) -> int | None:
        """The oldest timestamp still in hand-over."""
        values = [t for t in (self._unacked_ts.min(), self._held_ts.min()) if t is not None]
        return min(values) if values else None
