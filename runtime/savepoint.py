"""Savepoints: a consistent, self-describing copy of a job, and restoring one (docs/lifecycle.md).

Layout of a savepoint directory::

    manifest.json                    written last: a directory without it is not a savepoint
    tablets/<computation>/<range>/   a RocksDB checkpoint of that tablet (state, timers, dedup
                                     data, checkpointed productions, sink positions)

``manifest.json`` holds the format, the job's name and topology, when it was taken, every
tablet (computation, range id, hash bounds ``[start, end)``, sequencer token) and the
published low watermarks.

Taking one (:func:`take`): the leader pauses the job's input (workers answer injectors BUSY,
so they wait and retry; nothing is refused) and freezes its watermarks, waits until no
record or production is in flight anywhere in the job, and says where each tablet is; this
client then streams a checkpoint of every tablet from its primary, and the leader resumes
the input. Restoring (:func:`restore`): the leader creates the job with its tablets placed
on this cluster's workers but closed, this client loads every tablet's files into its
primary, and the leader opens them.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from runtime.errors import MillstreamError
from runtime.keyspace import from_wire_end
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

T = TypeVar("T")


class Client(Protocol):
    """What a savepoint needs of :class:`runtime.client.Client`: calls to the leader, channels
    to workers."""

    timeout: float

    def call(self, fn: Callable[[rpc.MasterStub], T]) -> T: ...

    def worker_channel(self, address: str) -> grpc.Channel: ...


MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 4 << 20


def tablet_dir(directory: str, computation: str, key_range: int) -> str:
    return os.path.join(directory, "tablets", computation, str(key_range))


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of the savepoint in ``directory``; a clear error if it is not one."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise MillstreamError(f"{directory!r} is not a millstream savepoint (it has no {MANIFEST}); give a "
                              "directory `millstream savepoint` wrote") from None
    except ValueError as e:
        raise MillstreamError(f"{path!r} is not a savepoint manifest ({e}); the savepoint is damaged") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "topology" not in doc:
        raise MillstreamError(f"{path!r} is not a savepoint manifest of format {FORMAT}")
    for t in doc.get("tablets", []):
        if not os.path.isdir(tablet_dir(directory, t["computation"], int(t["key_range"]))):
            raise MillstreamError(f"savepoint {directory!r} lacks tablet {t['computation']}/{t['key_range']}; "
                                  "it is damaged")
    return doc


def take(client: Client, name: str, directory: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Take a savepoint of job ``name`` into ``directory`` (new or empty); returns its manifest."""
    if os.path.exists(directory) and os.listdir(directory):
        raise MillstreamError(f"{directory!r} is not empty; give a new directory for the savepoint")
    os.makedirs(directory, exist_ok=True)
    req = pb.SavepointRequest(topology=name, timeout_s=timeout_s)
    plan = client.call(lambda s: s.Savepoint(req, timeout=timeout_s + client.timeout))
    try:
        tablets = []
        for t in plan.tablets:
            if not t.address:
                raise MillstreamError(f"tablet {t.computation}/{t.key_range} has no primary now; try again")
            _fetch(client, t, tablet_dir(directory, t.computation, t.key_range))
            tablets.append({"computation": t.computation, "key_range": t.key_range, "start": t.start,
                            "end": from_wire_end(t.end), "token": t.token})
    except BaseException:
        shutil.rmtree(os.path.join(directory, "tablets"), ignore_errors=True)
        raise
    finally:
        client.call(lambda s: s.Savepoint(pb.SavepointRequest(topology=name, end=True), timeout=client.timeout))
    manifest = {"format": FORMAT, "job": name, "topology": plan.topology_json,
                "taken": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "tablets": tablets, "watermarks": dict(plan.watermarks)}
    tmp = os.path.join(directory, f".{MANIFEST}.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, MANIFEST))
    return manifest


def _fetch(client: Client, t: pb.TabletPlace, target: str) -> None:
    stub = rpc.WorkerStub(client.worker_channel(t.address))
    req = pb.CheckpointRequest(computation=t.computation, key_range=t.key_range, token=t.token)
    os.makedirs(target, exist_ok=True)
    try:
        for chunk in stub.Checkpoint(req, timeout=600):
            if chunk.done:
                return
            if not chunk.file or "/" in chunk.file or chunk.file.startswith("."):
                raise MillstreamError(f"tablet {t.computation}/{t.key_range}: bad file name {chunk.file!r}")
            with open(os.path.join(target, chunk.file), "r+b" if chunk.offset else "wb") as f:
                f.seek(chunk.offset)
                f.write(chunk.data)
    except grpc.RpcError as e:
        raise MillstreamError(f"savepoint: tablet {t.computation}/{t.key_range} at {t.address}: "
                              f"{e.details()}; nothing was kept, try again") from None
    raise MillstreamError(f"savepoint: tablet {t.computation}/{t.key_range}: its files ended early; try again")


def restore(client: Client, directory: str, name: str | None = None) -> str:
    """Submit the job saved in ``directory`` to this cluster (as ``name``); returns its name."""
    manifest = read_manifest(directory)
    doc = json.dumps(manifest)
    begun = client.call(lambda s: s.Restore(pb.RestoreRequest(manifest_json=doc, name=name or ""),
                                            timeout=client.timeout))
    for t in begun.tablets:
        source = tablet_dir(directory, t.computation, t.saved_key_range)
        stub = rpc.WorkerStub(client.worker_channel(t.address))
        try:
            resp = stub.LoadTablet(_chunks(source, t), timeout=600)
        except grpc.RpcError as e:
            raise MillstreamError(f"restore: loading tablet {t.computation}/{t.key_range} into {t.address} "
                                  f"failed: {e.details()}; cancel the job (`millstream cancel {begun.name}`) "
                                  "and restore again") from None
        if resp.status != pb.ReplicateResponse.OK:
            raise MillstreamError(f"restore: {t.address} refused tablet {t.computation}/{t.key_range}: {resp.detail}")
    client.call(lambda s: s.Restore(pb.RestoreRequest(name=begun.name, commit=True), timeout=client.timeout))
    return str(begun.name)


def _chunks(source: str, t: pb.TabletPlace) -> Iterator[pb.SnapshotChunk]:
    for file in sorted(os.listdir(source)):
        with open(os.path.join(source, file), "rb") as f:
            offset = 0
            while True:
                data = f.read(CHUNK)
                yield pb.SnapshotChunk(computation=t.computation, key_range=t.key_range, token=t.token,
                                       file=file, offset=offset, data=data)
                offset += len(data)
                if len(data) < CHUNK:
                    break
    yield pb.SnapshotChunk(computation=t.computation, key_range=t.key_range, token=t.token, done=True)
