"""Several tablets' deliveries in one call or frame (``DeliverMany``): how they are grouped,
and how a worker's :class:`~worker.peers.Peers` sends one turn's deliveries (and one turn's
replicated commits, ``ReplicateMany``) to a peer (over a real gRPC server in this process
whose servicer only records what it is sent)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from hypothesis import given
from hypothesis import strategies as st

from runtime import delivery
from runtime.columns import Columns
from runtime.record import Record
from runtime.security import Security
from runtime.streams import STREAM_CREDIT_BYTES, StreamError, refused
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from worker.deliverstream import serve_frames
from worker.peers import Peers


@given(st.lists(st.integers(min_value=1, max_value=3 * delivery.BUNDLE_BYTES), max_size=40))
def test_bundles_keep_order_cover_everything_once_and_stay_under_the_bound(sizes: list[int]) -> None:
    parts = list(delivery.bundles(sizes))
    assert [i for p in parts for i in p] == list(range(len(sizes)))
    for p in parts:
        assert len(p) >= 1
        assert len(p) == 1 or sum(sizes[i] for i in p) <= delivery.BUNDLE_BYTES
    for a, b in zip(parts, parts[1:], strict=False):  # a part ends only where the next one would not fit
        assert sum(sizes[i] for i in a) + sizes[b.start] > delivery.BUNDLE_BYTES


@given(st.lists(st.integers(min_value=0, max_value=700), max_size=30), st.sampled_from([None, 1, 3, 50]))
def test_cut_keeps_order_covers_everything_once_and_stays_under_both_bounds(values: list[int],
                                                                            max_records: int | None) -> None:
    """Deliveries of at most MAX_DELIVERY_BYTES (a larger record alone) and ``max_records``,
    cut only where the next record would not fit: with a bound of 1,000 bytes here."""
    import pytest

    records = [Record(b"k", b"v" * n, i, i.to_bytes(16, "big")) for i, n in enumerate(values)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(delivery, "MAX_DELIVERY_BYTES", 1000)
        parts = list(delivery.cut(records, max_records))
    assert [r for p in parts for r in p] == records
    size = lambda part: sum(map(delivery.record_bytes, part))  # noqa: E731
    for p in parts:
        assert p and (len(p) == 1 or size(p) <= 1000)
        assert max_records is None or len(p) <= max_records
    for a, b in zip(parts, parts[1:], strict=False):
        assert size(a) + delivery.record_bytes(b[0]) > 1000 or len(a) == max_records


class _Recorder(rpc.WorkerServicer):
    """Answers OK to every delivery, and refuses (INVALID_ARGUMENT) any call or frame that
    carries one to the computation ``bad``, as a worker refuses a malformed delivery."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def DeliverStream(self, requests: Any, context: Any) -> Any:
        async def handle(frame: pb.DeliverFrame, size: int, part: Any) -> pb.DeliverAnswerFrame:
            try:
                answers = self._answer(list(frame.deliveries.deliveries))
            except StreamError as e:
                return refused(frame.id, size, e.code(), e.details())
            return pb.DeliverAnswerFrame(id=frame.id, credit=size, answers=pb.DeliverManyResponse(answers=answers))

        async for answer in serve_frames(requests, context, handle, STREAM_CREDIT_BYTES):
            yield answer

    async def Replicate(self, request: pb.ReplicateRequest, context: Any) -> pb.ReplicateResponse:
        return (await self._replicated([request], context))[0]

    async def ReplicateMany(self, request: pb.ReplicateManyRequest, context: Any) -> pb.ReplicateManyResponse:
        return pb.ReplicateManyResponse(answers=await self._replicated(list(request.requests), context))

    async def _replicated(self, reqs: list[pb.ReplicateRequest], context: Any) -> list[pb.ReplicateResponse]:
        self.calls.append([r.computation for r in reqs])
        if any(r.computation == "bad" for r in reqs):
            await context.abort(grpc.StatusCode.INTERNAL, "the copy of bad/0 failed its write")
        return [pb.ReplicateResponse(status=pb.ReplicateResponse.OK, index=r.entries[-1].index) for r in reqs]

    def _answer(self, reqs: list[pb.DeliverRequest]) -> list[pb.DeliverResponse]:
        self.calls.append([r.computation for r in reqs])
        if any(r.computation == "bad" for r in reqs):
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "delivery to bad/0 refused: malformed")
        return [pb.DeliverResponse(status=pb.DeliverResponse.OK, worker_id="w", report_seq=7) for _ in reqs]


def _run(comps: list[str]) -> tuple[list[tuple[int, Any]], list[list[str]]]:
    async def main() -> tuple[list[tuple[int, Any]], list[list[str]]]:
        server = grpc.aio.server()
        recorder = _Recorder()
        rpc.add_WorkerServicer_to_server(recorder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        peers = Peers(Security())
        try:
            rec = Columns.of_records([Record(b"k", b"v", 1, bytes(16))])
            outs = await asyncio.gather(*(peers.deliver(f"127.0.0.1:{port}", c, 0, 1, rec, None) for c in comps))
        finally:
            await peers.close()
            await server.stop(None)
        return list(outs), recorder.calls
    return asyncio.run(main())


def test_one_turns_deliveries_to_a_peer_go_in_one_frame_answered_in_order() -> None:
    outs, calls = _run(["a", "b", "c"])
    assert calls == [["a", "b", "c"]]
    assert outs == [(delivery.Status.OK, ("w", 7))] * 3


def test_a_refused_delivery_does_not_hold_back_the_others_of_its_frame() -> None:
    outs, calls = _run(["a", "bad", "c"])
    assert calls[0] == ["a", "bad", "c"]  # refused whole, then each went alone
    assert sorted(map(tuple, calls[1:])) == [("a",), ("bad",), ("c",)]
    assert outs[0] == outs[2] == (delivery.Status.OK, ("w", 7))
    assert outs[1] == (delivery.Status.UNREACHABLE, None)


def _replicate(comps: list[str]) -> tuple[list[Any], list[list[str]]]:
    """One commit (index 3) of each of ``comps``' tablets, replicated to one follower worker
    in one turn; the answers and the calls its servicer got."""
    async def main() -> tuple[list[Any], list[list[str]]]:
        server = grpc.aio.server()
        recorder = _Recorder()
        rpc.add_WorkerServicer_to_server(recorder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        peers = Peers(Security())
        try:
            reqs = [pb.ReplicateRequest(computation=c, key_range=0, token=1, entries=[pb.ReplicaEntry(index=3)])
                    for c in comps]
            outs = await asyncio.gather(*(peers.replicate(f"127.0.0.1:{port}", r) for r in reqs))
        finally:
            await peers.close()
            await server.stop(None)
        return list(outs), recorder.calls
    return asyncio.run(main())


def test_one_turns_commits_to_a_follower_worker_go_in_one_call_answered_in_order() -> None:
    """Eight tablets' commits (W1's round: four counters and four sinks) cost one unary call
    to their follower worker, not eight (performance study, section 2.2)."""
    outs, calls = _replicate([f"c{i}" for i in range(8)])
    assert calls == [[f"c{i}" for i in range(8)]]
    assert [(o.status, o.index) for o in outs] == [(pb.ReplicateResponse.OK, 3)] * 8


def test_one_copy_failing_does_not_fail_the_other_tablets_replication() -> None:
    outs, calls = _replicate(["a", "bad", "c"])
    assert calls[0] == ["a", "bad", "c"]  # failed whole, then each went alone
    assert sorted(map(tuple, calls[1:])) == [("a",), ("bad",), ("c",)]
    assert outs[1] is None and outs[0].status == outs[2].status == pb.ReplicateResponse.OK
