"""Frame streams (``Worker.DeliverStream``, ``Worker.ReplicateStream``; issue 29), without I/O:
what both ends of a stream count, shared by the senders (runtime/links.py) and the receiver
(worker/deliverstream.py).

A sender keeps one long-lived stream per worker instead of one unary call per delivery
(a bidi stream costs about half the CPU per round trip: docs/performance-history.md, "Issue 29:
streams"). Each frame carries what one ``DeliverMany`` (or ``ReplicateMany``) would; the
receiver handles frames side by side and answers each when its work is done, in any order,
by id. A delivery frame that asks for it (``answer_each``) is answered in parts, each
delivery as soon as it is done: a slow tablet holds only its own deliveries, not the frame's
others.

Flow control is by credit, in bytes of encoded frames: the receiver's first message grants
the stream :data:`STREAM_CREDIT_BYTES`, each answer gives its frame's size back, and a
sender puts a frame on the wire only within its credit (one larger than the whole grant goes
alone, once nothing else is in flight), first fit: a frame that fits goes even past a larger
one waiting (docs/architecture.md says why). A receiver refuses a stream that overdraws. A frame
answered in parts gives its credit back with them (``credit_each``): each part its own
deliveries' encoded size, the last the rest, so a slow delivery holds only its own bytes of
the grant (an older receiver gives it all back with the last part; ``more`` marks the others).

A frame the receiver refuses as it would refuse the call (a malformed record, a producer
token from an injector) is answered with the status code, and the stream goes on; a stream
that breaks fails every frame in flight on it, as a failed call would
(``runtime.delivery.failed``: UNREACHABLE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from runtime.wire import millstream_pb2 as pb

STREAM_CREDIT_BYTES = 32 * 1024 * 1024  # a stream's grant: two full frames (delivery.BUNDLE_BYTES)
FRAME_TIMEOUT_S = 30.0  # a frame not answered by then fails, as a DeliverMany call's deadline

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class AnswerFrame(Protocol):
    """What an answer frame of either stream carries (``DeliverAnswerFrame``,
    ``ReplicateAnswerFrame``)."""

    @property
    def id(self) -> int: ...
    @property
    def credit(self) -> int: ...
    @property
    def code(self) -> int: ...
    @property
    def details(self) -> str: ...


class StreamError(grpc.RpcError):
    """A frame's failure, as the unary call would have raised it: refused by the receiver
    (its status code and details), its stream broken, or no answer in time."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def refusal(answer: AnswerFrame) -> StreamError | None:
    """The refusal an answer carries, if any."""
    if not answer.code:
        return None
    return StreamError(_CODES.get(answer.code, grpc.StatusCode.UNKNOWN), answer.details)


def refused(frame_id: int, size: int, code: grpc.StatusCode, details: str,
            kind: Callable[..., Any] = pb.DeliverAnswerFrame) -> Any:
    """The answer (a ``kind``, ``DeliverAnswerFrame`` by default) refusing frame ``frame_id``
    (of ``size`` bytes, given back) with ``code``."""
    return kind(id=frame_id, credit=size, code=code.value[0], details=details)


class SenderWindow:
    """A sender's count of one stream: frame ids, the credit granted, what is in flight."""

    def __init__(self) -> None:
        self.granted = 0    # 0 until the receiver's grant arrives: nothing may go before
        self.credit = 0     # bytes it may still put on the wire (< 0 under one oversized frame)
        self.in_flight: dict[int, int] = {}  # frame id -> its size
        self._last_id = 0

    def frame(self, deliveries: pb.DeliverManyRequest) -> tuple[pb.DeliverFrame, int]:
        """The next frame carrying ``deliveries``, and its size in bytes (what it costs)."""
        frame: pb.DeliverFrame
        frame, size = self.next(lambda i: pb.DeliverFrame(id=i, deliveries=deliveries))
        return frame, size

    def next(self, make: Callable[[int], Any]) -> tuple[Any, int]:
        """The next frame, ``make(its id)``, and its size in bytes (what it costs)."""
        self._last_id += 1
        frame = make(self._last_id)
        return frame, frame.ByteSize()

    def unmake(self, frame_id: int) -> None:
        """The frame :meth:`next` just made does not go: its id is the next one's."""
        if frame_id == self._last_id:
            self._last_id -= 1

    def fits(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes may go now."""
        return self.granted > 0 and (size <= self.credit or not self.in_flight)

    def sent(self, frame_id: int, size: int) -> None:
        assert self.fits(size), f"frame {frame_id} of {size} B over the credit {self.credit} B"
        self.credit -= size
        self.in_flight[frame_id] = size

    def answered(self, answer: AnswerFrame) -> None:
        """Count an answer in: its credit back, its frame no longer in flight unless the
        answer is a part of its frame's (:func:`is_part`): that frame stays, holding the rest."""
        if answer.id == 0:
            self.granted += answer.credit
        elif not is_part(answer):
            if self.in_flight.pop(answer.id, None) is None:
                raise ValueError(f"an answer to frame {answer.id}, which is not in flight on this stream")
        else:
            left = self.in_flight.get(answer.id)
            if left is None:
                raise ValueError(f"an answer to frame {answer.id}, which is not in flight on this stream")
            if answer.credit >= left:
                raise ValueError(f"a part of frame {answer.id}'s answer gives back {answer.credit} B of "
                                 f"the {left} B it holds, leaving nothing for its last part")
            self.in_flight[answer.id] = left - answer.credit
        self.credit += answer.credit


def is_part(answer: AnswerFrame) -> bool:
    """Whether ``answer`` is a part of its frame's answer, more to come
    (``DeliverFrame.answer_each``): marked ``more``, or, from an older receiver, without credit.
    (Replication answers have neither: they answer their frame whole.)"""
    return bool(answer.id) and (getattr(answer, "more", False) or not answer.credit)


class ReceiverWindow:
    """A receiver's count of one stream: the bytes of frames not yet answered, within the grant."""

    def __init__(self, grant: int = STREAM_CREDIT_BYTES) -> None:
        self.grant = grant
        self.outstanding = 0
        self.frames = 0

    def admit(self, size: int) -> bool:
        """Take a frame of ``size`` bytes in; False if the sender overdrew its credit."""
        if self.frames and self.outstanding + size > self.grant:
            return False
        self.outstanding += size
        self.frames += 1
        return True

    def answered(self, size: int) -> None:
        """A frame answered, the last ``size`` bytes of it given back."""
        self.outstanding -= size
        self.frames -= 1
        assert self.outstanding >= 0 and self.frames >= 0, "answered more than was admitted"

    def released(self, size: int) -> None:
        """``size`` bytes of a frame given back with a part of its answer; the frame stays."""
        self.outstanding -= size
        assert self.outstanding >= 0, "released more than was admitted"
