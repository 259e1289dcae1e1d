"""What a caller's role lets it do to a worker's dedup data, through the real gRPC token check
and the worker's servicer, on an in-process core (real RocksDB)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from runtime import Record
from runtime.delivery import request
from runtime.record import producer_prefix, sequence_id
from runtime.security import Owner, Security, injector_credential
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc
from tests.core.corekit import make_core
from tests.core.jobs import Collector
from tests.core.test_worker_core import BASE, routing
from worker.core import WorkerCore
from worker.sender import OK
from worker.server import WorkerServicer

TOKENS = {"worker": "w-secret", "injector": "i-secret", "operator": "o-secret"}
LAST_SEQ = (1 << 64) - 1


@asynccontextmanager
async def _served(core: WorkerCore, require_credentials: bool = False
                  ) -> AsyncIterator[Callable[..., Any]]:
    """The core behind a real server that checks role tokens; yields a stub maker per role
    (and injector credential)."""
    server = grpc.aio.server(interceptors=Security(role_tokens=TOKENS).server_interceptors())
    rpc.add_WorkerServicer_to_server(WorkerServicer(core, require_credentials=require_credentials), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channels: list[grpc.aio.Channel] = []

    def stub(role: str | None, credential: str | None = None, raw: bool = False) -> Any:
        """A stub for ``role``'s token (None: no token), or with ``raw`` its channel."""
        security = Security(token=TOKENS[role] if role else None, injector_credential=credential)
        channels.append(security.aio_channel(f"127.0.0.1:{port}"))
        return channels[-1] if raw else rpc.WorkerStub(channels[-1])

    try:
        yield stub
    finally:
        for ch in channels:
            await ch.close()
        await server.stop(None)


def _outputs() -> list[bytes]:
    return [v for n, _, v in Collector.seen if n == "out"]


def test_n4_an_injector_cannot_black_hole_a_tablets_output_at_its_readers(tmp_path: object) -> None:
    """Review N4: one record ``P||2**64-1`` of producer tablet P, sent with the injector's
    token, used to set P's mark at its reader to the last sequence, so every real record of P
    then read as a duplicate. It is refused (PERMISSION_DENIED), and P's records commit."""

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        echo = core.tablets[("echo", 0)].prefix  # the producer the collector hears from
        forged = request("collect", 0, 1, [Record(b"k", b"forged", BASE, sequence_id(echo, LAST_SEQ))],
                         {echo: (0, 0)}, sender="injector/mallory")
        async with _served(core) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub("injector").Deliver(forged)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "only the worker role sends its records" in (refused.value.details() or "")
            # The operator's token is no worker's either.
            with pytest.raises(grpc.aio.AioRpcError, match="producer inside the cluster"):
                await stub("operator").Deliver(forged)
            # The real producer's records, through its input: each reaches the collector.
            me = producer_prefix("injector/src")
            real = [Record(b"k%d" % i, b"real %d" % i, BASE + i, sequence_id(me, i)) for i in (1, 2, 3)]
            answer = await stub("injector").Deliver(request("echo", 0, 1, real, {me: (0, 0)}, "injector/src"))
            assert answer.status == OK
            deadline = asyncio.get_running_loop().time() + 10
            while len(_outputs()) < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        assert sorted(_outputs()) == [b"real 1", b"real 2", b"real 3"]
        assert core.tablets[("collect", 0)].store.marks()[echo].seq == 3
        await core.close_all()

    asyncio.run(main())


def test_n4_a_tablets_mark_set_under_no_token_gives_way_to_its_owner(tmp_path: object) -> None:
    """A tablet producer's mark written under token 0 (by an injector, before the role check
    existed) is not a mark any owner set: the first delivery under a real token starts it
    again instead of reading every record as a duplicate."""
    from runtime.record import worker_producer

    p = worker_producer(producer_prefix("tablet\x00up/0"))

    def from_p(seq: int) -> Record:
        return Record(b"k", b"r%d" % seq, BASE + seq, sequence_id(p, seq))

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("collect", "tests.core.jobs:Collector", ["in"], [], {"name": "out"})))
        assert await core.deliver("collect", 0, 1, [from_p(LAST_SEQ)], {p: (0, 0)}) == OK  # the old hole
        Collector.seen = []
        assert await core.deliver("collect", 0, 1, [from_p(1), from_p(2)], {p: (0, 3)}) == OK
        mark = core.tablets[("collect", 0)].store.marks()[p]
        assert (mark.seq, mark.token) == (2, 3)
        await core.close_all()

    asyncio.run(main())
    assert _outputs() == [b"r1", b"r2"]


def test_n4_holds_on_a_delivery_stream_for_every_frame_of_an_injectors_stream(tmp_path: object) -> None:
    """The roles of a ``DeliverStream`` are the stream's token's, checked once when it opens
    and applied to each frame as to a call: an injector's frame naming a tablet producer is
    refused (PERMISSION_DENIED) and the stream goes on; the same frame from a worker is taken."""
    from runtime.delivery import Status, answered
    from runtime.links import delivery_stream
    from runtime.record import worker_producer
    from runtime.streams import StreamError

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        echo = core.tablets[("echo", 0)].prefix
        forged = request("collect", 0, 1, [Record(b"k", b"forged", BASE, sequence_id(echo, LAST_SEQ))],
                         {echo: (0, 0)}, sender="injector/mallory")
        me = producer_prefix("injector/src")
        real = request("echo", 0, 1, [Record(b"k", b"real", BASE, sequence_id(me, 1))], {me: (0, 0)},
                       "injector/src")
        async with _served(core) as stub:
            injector = delivery_stream(stub("injector"))
            with pytest.raises(StreamError, match="only the worker role sends its records") as refused:
                await injector.send(pb.DeliverManyRequest(deliveries=[forged]))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            both = await injector.send(pb.DeliverManyRequest(deliveries=[real]))  # the same stream goes on
            assert [answered(a).status for a in both.answers.answers] == [Status.OK]
            assert injector.broken is None
            await injector.close()
            worker = delivery_stream(stub("worker"))
            up = worker_producer(producer_prefix("tablet\x00up/0"))  # another producer's tablet
            own = request("collect", 0, 1, [Record(b"k", b"own", BASE, sequence_id(up, 1))], {up: (0, 1)},
                          sender="up")
            taken = await worker.send(pb.DeliverManyRequest(deliveries=[own]))
            assert [answered(a).status for a in taken.answers.answers] == [Status.OK]
            await worker.close()
            deadline = asyncio.get_running_loop().time() + 10
            while len(_outputs()) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait
        assert sorted(_outputs()) == [b"own", b"real"]
        await core.close_all()

    asyncio.run(main())


def test_replication_streams_and_bundles_are_the_worker_roles_only(tmp_path: object) -> None:
    """``ReplicateStream`` (issue 29) and ``ReplicateMany`` carry commits to followers: another
    role's token is refused (``ReplicateMany`` was missing from the role table, so any token
    could call it); a worker's stream is answered, frame by frame."""
    from runtime.links import FrameStream
    from worker.peers import replication_stream

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {})))
        req = pb.ReplicateRequest(computation="echo", key_range=0, token=1, follower="nobody")
        async with _served(core) as stub:
            for role in ("injector", "operator"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub(role).ReplicateMany(pb.ReplicateManyRequest(requests=[req]))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                stream: FrameStream[Any, Any] = replication_stream(stub(role))
                with pytest.raises(grpc.RpcError) as broken:
                    await stream.send(pb.ReplicateManyRequest(requests=[req]))
                assert broken.value.code() == grpc.StatusCode.PERMISSION_DENIED
                await stream.close()
            worker = replication_stream(stub("worker"))
            answers = await worker.send(pb.ReplicateManyRequest(requests=[req, req]))
            assert [a.status for a in answers.answers] == [pb.ReplicateResponse.WRONG_WORKER] * 2
            await worker.close()
        await core.close_all()

    asyncio.run(main())


def test_a_refused_call_is_refused_without_its_request_being_parsed(tmp_path: object) -> None:
    """A call the token check refuses never has its message parsed (review 3's list: it was
    parsed in full, up to 64 MiB, before the refusal): bytes that are no protobuf at all get
    the refusal, not an error from parsing them; a stream's chunks are not asked for."""
    garbage = b"\xff" * (1 << 20)  # a varint that never ends: no message parses from it

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(("echo", "tests.core.jobs:Echo", ["in"], ["out"], {})))
        async with _served(core) as stub:
            raw = stub("injector", raw=True)
            replicate = raw.unary_unary("/millstream.v1.Worker/ReplicateMany")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await replicate(garbage)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
            load = raw.stream_unary("/millstream.v1.Worker/LoadTablet")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await load(iter([garbage, garbage]))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub(None, raw=True).unary_unary("/millstream.v1.Worker/ReplicateMany")(garbage)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
        await core.close_all()

    asyncio.run(main())


async def _outputs_reach(n: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while len(_outputs()) < n and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # poll interval of this deadline-bounded wait


def test_n4_an_injector_with_a_credential_is_not_silenced_by_another_holder_of_the_token(tmp_path: object) -> None:
    """Review N4's residual: an injector's prefix is a digest of its name, so any holder of the
    injector token who knows the name could send ``P||2**64-1`` first and every real record of
    that injector then read as a duplicate. It still can to an injector without a credential
    (shown first). An injector that shows one (``millstream credential team-a``) has its
    producers kept apart: its records all arrive, and its own re-send is still a duplicate."""
    from worker.owners import owned_prefix

    victim = producer_prefix("injector/team-a")
    credential = injector_credential(TOKENS["worker"], "team-a")

    def rec(seq: int, text: bytes) -> Record:
        return Record(b"k%d" % (seq % 10), text, BASE + seq % 10, sequence_id(victim, seq))

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(
            ("echo", "tests.core.jobs:Echo", ["in"], ["out"], {}),
            ("collect", "tests.core.jobs:Collector", ["out"], [], {"name": "out"})))
        async with _served(core) as stub:
            mallory, team_a = stub("injector"), stub("injector", credential)
            hole = await mallory.Deliver(request("echo", 0, 1, [rec(LAST_SEQ, b"forged")], {victim: (0, 0)}))
            assert hole.status == OK
            # Without a credential, the real injector is silenced: its record is a "duplicate".
            plain = await mallory.Deliver(request("echo", 0, 1, [rec(1, b"lost")], {victim: (0, 0)}))
            assert plain.status == OK and plain.duplicates == 1
            # With one, each of its records arrives.
            real = [rec(i, b"real %d" % i) for i in (1, 2, 3)]
            answer = await team_a.Deliver(request("echo", 0, 1, real, {victim: (0, 0)}, "injector/team-a"))
            assert answer.status == OK and answer.duplicates == 0
            await _outputs_reach(4)
            # Its own re-send (a re-run) lands on the same marks: a duplicate, not a second copy.
            again = await team_a.Deliver(request("echo", 0, 1, real[:1], {victim: (0, 0)}, "injector/team-a"))
            assert again.duplicates == 1
            # What mallory can compute from public data (the name, the prefix) is not where the
            # marks are: a digest of them, sent as it is, moves a mark of its own.
            guess = hashlib.blake2b(victim, digest_size=8, person=b"millstream-owner").digest()
            guess = bytes((guess[0] & 0x7F,)) + guess[1:]
            rec_guess = Record(b"k", b"guessed", BASE, sequence_id(guess, LAST_SEQ))
            assert (await mallory.Deliver(request("echo", 0, 1, [rec_guess], {guess: (0, 0)}))).status == OK
            later = Record(b"k4", b"real 4", BASE + 4, sequence_id(victim, 4))
            assert (await team_a.Deliver(request("echo", 0, 1, [later], {victim: (0, 3)}))).duplicates == 0
            await _outputs_reach(6)
        assert sorted(_outputs()) == [b"forged", b"guessed", b"real 1", b"real 2", b"real 3", b"real 4"]
        marks = core.tablets[("echo", 0)].store.marks()
        owner = Owner("team-a", bytes.fromhex(credential.rpartition(":")[2]))
        assert marks[owned_prefix(owner, victim)].seq == 4 and marks[victim].seq == LAST_SEQ
        await core.close_all()

    asyncio.run(main())


def test_n4_a_credential_the_cluster_did_not_issue_is_refused(tmp_path: object) -> None:
    """A credential made with another worker token, or malformed, is UNAUTHENTICATED with what
    to do; nothing of its call is taken."""
    import dataclasses

    from runtime.errors import ConfigError

    me = producer_prefix("injector/team-a")

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(("collect", "tests.core.jobs:Collector", ["in"], [], {"name": "out"})))
        delivery = request("collect", 0, 1, [Record(b"k", b"v", BASE, sequence_id(me, 1))], {me: (0, 0)})
        async with _served(core) as stub:
            forged = injector_credential("not the worker token", "team-a")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub("injector", forged).Deliver(delivery)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "millstream credential team-a" in (refused.value.details() or "")
        assert _outputs() == []
        await core.close_all()

    asyncio.run(main())
    with pytest.raises(ConfigError, match="NAME:<64 hex digits>"):
        Security(injector_credential="team-a:123")
    with pytest.raises(ConfigError, match="NAME:<64 hex digits>"):
        dataclasses.replace(Security(), injector_credential="no colon")


def test_n4_a_worker_that_requires_credentials_refuses_records_without_one(tmp_path: object) -> None:
    """``--require-injector-credentials``: a caller outside the worker role that shows no
    credential is refused (PERMISSION_DENIED, saying how to get one), on a call and on a
    stream's frame alike; with one it is taken; workers need none."""
    from runtime.delivery import Status, answered
    from runtime.links import delivery_stream
    from runtime.record import worker_producer
    from runtime.streams import StreamError

    me = producer_prefix("injector/team-a")
    credential = injector_credential(TOKENS["worker"], "team-a")

    async def main() -> None:
        core = await make_core(str(tmp_path), routing(("collect", "tests.core.jobs:Collector", ["in"], [], {"name": "out"})))

        def mine(seq: int) -> pb.DeliverRequest:
            return request("collect", 0, 1, [Record(b"k", b"v%d" % seq, BASE + seq, sequence_id(me, seq))],
                           {me: (0, 0)}, "injector/team-a")

        async with _served(core, require_credentials=True) as stub:
            for role in ("injector", "operator"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub(role).Deliver(mine(1))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "millstream credential NAME" in (refused.value.details() or "")
            plain = delivery_stream(stub("injector"))
            with pytest.raises(StreamError, match="--require-injector-credentials"):
                await plain.send(pb.DeliverManyRequest(deliveries=[mine(1)]))
            await plain.close()
            assert (await stub("injector", credential).Deliver(mine(1))).status == OK
            stream = delivery_stream(stub("injector", credential))
            both = await stream.send(pb.DeliverManyRequest(deliveries=[mine(2)]))
            assert [answered(a).status for a in both.answers.answers] == [Status.OK]
            await stream.close()
            up = worker_producer(producer_prefix("tablet\x00up/0"))
            own = request("collect", 0, 1, [Record(b"k", b"from a tablet", BASE, sequence_id(up, 1))],
                          {up: (0, 1)}, sender="up")
            assert (await stub("worker").Deliver(own)).status == OK
            await _outputs_reach(3)
        assert sorted(_outputs()) == [b"from a tablet", b"v1", b"v2"]
        await core.close_all()

    asyncio.run(main())
