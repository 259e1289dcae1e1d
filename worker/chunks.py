"""A checkpoint directory's files as messages of at most 4 MiB: how a primary ships a snapshot
to a follower (worker/replication.py) and a worker a tablet copy it was asked for
(worker/server.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from runtime.wire import millstream_pb2 as pb

SNAPSHOT_CHUNK = 4 << 20      # bytes of a checkpoint file per message


def read_chunk(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(SNAPSHOT_CHUNK)


async def checkpoint_chunks(path: str, base: pb.SnapshotChunk) -> AsyncIterator[pb.SnapshotChunk]:
    """The files of the checkpoint directory ``path`` as chunks of at most 4 MiB (copies of
    ``base`` with ``file``, ``offset`` and ``data`` set), each read off the event loop."""
    for name in sorted(os.listdir(path)):
        offset = 0
        while True:
            data = await asyncio.to_thread(read_chunk, os.path.join(path, name), offset)
            chunk = pb.SnapshotChunk()
            chunk.CopyFrom(base)
            chunk.file, chunk.offset, chunk.data = name, offset, data
            yield chunk
            offset += len(data)
            if len(data) < SNAPSHOT_CHUNK:
                break
