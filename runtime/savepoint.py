"""Savepoints: a consistent, self-describing copy of a job, and restoring one (docs/lifecycle.md).

Layout of a savepoint directory::

    manifest.json                    written last: a directory without it is not a savepoint
    tablets/<computation>/<range>/   a RocksDB checkpoint of that tablet (state, timers, dedup
                                     data, checkpointed productions, sink positions)

``manifest.json`` holds the format, the job's name and topology, when it was taken, every
tablet (computation, range id, hash bounds ``[start, end)``, sequencer token, and every file
of its checkpoint with its size and SHA-256) and the published low watermarks.

Taking one (:func:`take`): the leader pauses the job (workers answer injectors BUSY, so they
wait and retry, and fire none of its timers; the pause is stored in etcd, so a new leader
keeps it) and freezes its watermarks, waits until the job is at rest, and says where each
tablet is; this client then streams a checkpoint of every tablet from its primary, renewing
the pause meanwhile, and ends the pause with a check that it held and nothing ran: only then
is the manifest written. Restoring (:func:`restore`): the files are checked against the
manifest, the leader creates the job with its tablets placed on this cluster's workers but
closed, this client loads every tablet's files into its primary (which checks them again),
and the leader opens them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from runtime.errors import MillstreamError
from runtime.keyspace import from_wire_end
from runtime.routing import RoutingTable
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

T = TypeVar("T")


class Client(Protocol):
    """What a savepoint needs of :class:`runtime.client.Client`: calls to the leader, channels
    to workers."""

    timeout: float

    def call(self, fn: Callable[[rpc.MasterStub], T]) -> T: ...

    def worker_channel(self, address: str) -> grpc.Channel: ...

    def routing(self) -> pb.Routing: ...


MANIFEST = "manifest.json"
FORMAT = 2    # 2: every tablet lists its files (1: without; still restored)
FORMATS = (1, 2)
CHUNK = 4 << 20
RENEW_EVERY_S = 5.0  # the leader ends a pause not renewed for a minute (master.jobs.PAUSE_LIMIT_S)


def tablet_dir(directory: str, computation: str, key_range: int) -> str:
    return os.path.join(directory, "tablets", computation, str(key_range))


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of the savepoint in ``directory``; a clear error if it is not one, or if a
    tablet's files are missing or of another size than the manifest says."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise MillstreamError(f"{directory!r} is not a millstream savepoint (it has no {MANIFEST}); give a "
                              "directory `millstream savepoint` wrote") from None
    except ValueError as e:
        raise MillstreamError(f"{path!r} is not a savepoint manifest ({e}); the savepoint is damaged") from None
    if not isinstance(doc, dict) or doc.get("format") not in FORMATS or "topology" not in doc:
        raise MillstreamError(f"{path!r} is not a savepoint manifest of format {' or '.join(map(str, FORMATS))}")
    for t in doc.get("tablets", []):
        where = tablet_dir(directory, t["computation"], int(t["key_range"]))
        name = f"{t['computation']}/{t['key_range']}"
        if not os.path.isdir(where):
            raise MillstreamError(f"savepoint {directory!r} lacks tablet {name}; it is damaged")
        files = t.get("files")
        if files is None:  # format 1: at least a RocksDB database, never an empty directory
            files = [{"name": "CURRENT"}]
        for f in files:
            try:
                size = os.path.getsize(os.path.join(where, str(f["name"])))
            except OSError:
                raise MillstreamError(f"savepoint {directory!r}: tablet {name} lacks its file {f['name']!r}; the "
                                      "savepoint is damaged (restoring it would start that tablet from empty "
                                      "state): restore another savepoint") from None
            if "size" in f and size != int(f["size"]):
                raise MillstreamError(f"savepoint {directory!r}: tablet {name}'s file {f['name']!r} has {size} "
                                      f"bytes, the manifest says {f['size']}; the savepoint is damaged")
    return doc


def take(client: Client, name: str, directory: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Take a savepoint of job ``name`` into ``directory`` (new or empty); returns its manifest."""
    if os.path.exists(directory) and os.listdir(directory):
        raise MillstreamError(f"{directory!r} is not empty; give a new directory for the savepoint")
    os.makedirs(directory, exist_ok=True)
    req = pb.SavepointRequest(topology=name, timeout_s=timeout_s)
    plan = client.call(lambda s: s.Savepoint(req, timeout=timeout_s + client.timeout))
    sid = plan.savepoint_id
    renewer = _Renewer(client, name, sid)
    ended = False
    try:
        tablets = []
        waits = _Waits(timeout_s)
        for t in plan.tablets:
            target = tablet_dir(directory, t.computation, t.key_range)
            t = _copy(client, t, target, waits, renewer)
            tablets.append({"computation": t.computation, "key_range": t.key_range, "start": t.start,
                            "end": from_wire_end(t.end), "token": t.token, "files": digests(target)})
        renewer.stop()
        renewer.check()
        # The leader checks that the pause held and every tablet is as it was at the agreed
        # point (and raises otherwise); the pause ends either way.
        ended = True
        client.call(lambda s: s.Savepoint(pb.SavepointRequest(topology=name, end=True, savepoint_id=sid,
                                                              verify=True), timeout=client.timeout + 30))
    except BaseException:
        shutil.rmtree(os.path.join(directory, "tablets"), ignore_errors=True)
        if not ended:
            try:
                client.call(lambda s: s.Savepoint(pb.SavepointRequest(topology=name, end=True, savepoint_id=sid),
                                                  timeout=client.timeout))
            except MillstreamError:
                pass  # the error that brought us here says more; the pause ends by itself anyway
        raise
    finally:
        renewer.stop()
    manifest = {"format": FORMAT, "job": name, "savepoint_id": sid, "topology": plan.topology_json,
                "taken": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "tablets": tablets, "watermarks": dict(plan.watermarks)}
    tmp = os.path.join(directory, f".{MANIFEST}.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, MANIFEST))
    return manifest


class _Renewer:
    """Renews a savepoint's pause every :data:`RENEW_EVERY_S` while the tablets are copied (a
    copy may take longer than the leader keeps an unrenewed pause); the first refusal is kept
    and raised by :meth:`check`."""

    def __init__(self, client: Client, name: str, savepoint_id: str) -> None:
        self._stop = threading.Event()
        self.error: MillstreamError | None = None
        req = pb.SavepointRequest(topology=name, renew=True, savepoint_id=savepoint_id)

        def run() -> None:
            while not self._stop.wait(RENEW_EVERY_S):
                try:
                    client.call(lambda s: s.Savepoint(req, timeout=client.timeout))
                except MillstreamError as e:
                    self.error = e
                    return

        self._thread = threading.Thread(target=run, name=f"savepoint {name}: renew", daemon=True)
        self._thread.start()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def digests(directory: str) -> list[dict[str, Any]]:
    """Every file of a tablet's copy: name, size and SHA-256 (the manifest keeps them)."""
    out = []
    for name in sorted(os.listdir(directory)):
        h = hashlib.sha256()
        size = 0
        with open(os.path.join(directory, name), "rb") as f:
            while data := f.read(CHUNK):
                h.update(data)
                size += len(data)
        out.append({"name": name, "size": size, "sha256": h.hexdigest()})
    return out


class _Unreachable(MillstreamError):
    """A tablet's copy could not be had from where it was asked for: its worker is gone, or
    the tablet is no longer open there (it moved), or the stream broke off."""


class _Waits:
    """How long a savepoint's copy may spend, in all, on tries that failed and on waiting for
    tablets' new primaries (the job's input is paused meanwhile): ``wait_s``."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.spent = 0.0


def _copy(client: Client, t: pb.TabletPlace, target: str, waits: _Waits, renewer: _Renewer) -> pb.TabletPlace:
    """Copy tablet ``t`` into ``target`` from its primary; returns where it was copied from.

    A pause holds the job still, not its machines: a primary lost during the copy fails over
    to an in-sync follower, which holds the same commit (the job is at rest: nothing commits),
    so the copy is taken from the new primary, under its token, found in fresh routing (for
    as long as ``waits`` allows). The leader's final check (every tablet still at the commit of
    the cut) says whether that held; if not, the savepoint fails there."""
    while True:
        renewer.check()
        started = time.monotonic()
        why = f"tablet {t.computation}/{t.key_range} has no primary now"
        if t.address:
            try:
                _fetch(client, t, target)
                return t
            except _Unreachable as e:
                why = str(e)
                shutil.rmtree(target, ignore_errors=True)  # a part copied: none of it is kept
        if waits.spent > waits.wait_s:
            raise MillstreamError(f"savepoint: tablet {t.computation}/{t.key_range} could not be copied "
                                  f"({why}), and the copy has waited {waits.wait_s:g} s in all for tablets' new "
                                  "primaries; nothing was kept, try again once `millstream status` shows the tablet "
                                  "healthy")
        time.sleep(0.1)  # its failover: the leader must see the worker's lease run out first
        now = RoutingTable(client.routing()).destination(t.computation, t.key_range)
        moved = pb.TabletPlace()
        moved.CopyFrom(t)
        moved.address, moved.token = now.address, now.token
        t = moved
        waits.spent += time.monotonic() - started


# Its worker is gone or going, or the tablet is not open there (it moved, or is opening).
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED)


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
        if e.code() in _RETRIED:
            raise _Unreachable(f"tablet {t.computation}/{t.key_range} at {t.address}: {e.details()}") from None
        raise MillstreamError(f"savepoint: tablet {t.computation}/{t.key_range} at {t.address}: "
                              f"{e.details()}; nothing was kept, try again") from None
    raise _Unreachable(f"tablet {t.computation}/{t.key_range} at {t.address}: its files ended early")


def restore(client: Client, directory: str, name: str | None = None) -> str:
    """Submit the job saved in ``directory`` to this cluster (as ``name``); returns its name."""
    manifest = read_manifest(directory)
    files = {(str(t["computation"]), int(t["key_range"])): t.get("files") for t in manifest["tablets"]}
    for (c, r), listed in files.items():
        if listed is not None:
            _check(directory, c, r, listed)  # before anything changes in the cluster
    # The leader needs the tablets, not their file lists (this client and the workers check those).
    doc = json.dumps({**manifest, "tablets": [{k: v for k, v in t.items() if k != "files"}
                                              for t in manifest["tablets"]]})
    begun = client.call(lambda s: s.Restore(pb.RestoreRequest(manifest_json=doc, name=name or ""),
                                            timeout=client.timeout))
    for t in begun.tablets:
        source = tablet_dir(directory, t.computation, t.saved_key_range)
        listed = files.get((t.computation, t.saved_key_range))
        stub = rpc.WorkerStub(client.worker_channel(t.address))
        try:
            resp = stub.LoadTablet(_chunks(source, t, listed), timeout=600)
        except grpc.RpcError as e:
            raise MillstreamError(f"restore: loading tablet {t.computation}/{t.key_range} into {t.address} "
                                  f"failed: {e.details()}; cancel the job (`millstream cancel {begun.name}`) "
                                  "and restore again") from None
        if resp.status != pb.ReplicateResponse.OK:
            raise MillstreamError(f"restore: {t.address} refused tablet {t.computation}/{t.key_range}: {resp.detail}")
    client.call(lambda s: s.Restore(pb.RestoreRequest(name=begun.name, commit=True), timeout=client.timeout))
    return str(begun.name)


def _check(directory: str, computation: str, key_range: int, listed: list[dict[str, Any]]) -> None:
    """The tablet's files are those the manifest lists, byte for byte."""
    have = {d["name"]: d for d in digests(tablet_dir(directory, computation, key_range))}
    for f in listed:
        got = have.get(str(f["name"]))
        if got is None or got["size"] != int(f["size"]) or got["sha256"] != f["sha256"]:
            what = "is missing" if got is None else "differs from what the manifest says (size or SHA-256)"
            raise MillstreamError(f"savepoint {directory!r}: tablet {computation}/{key_range}'s file "
                                  f"{f['name']!r} {what}; the savepoint is damaged, restore another one")


def _chunks(source: str, t: pb.TabletPlace, listed: list[dict[str, Any]] | None) -> Iterator[pb.SnapshotChunk]:
    """The files of a tablet's copy (those the manifest lists), then a last chunk listing them."""
    names = sorted(os.listdir(source)) if listed is None else [str(f["name"]) for f in listed]
    for file in names:
        with open(os.path.join(source, file), "rb") as f:
            offset = 0
            while True:
                data = f.read(CHUNK)
                yield pb.SnapshotChunk(computation=t.computation, key_range=t.key_range, token=t.token,
                                       file=file, offset=offset, data=data)
                offset += len(data)
                if len(data) < CHUNK:
                    break
    files = [pb.FileDigest(name=str(f["name"]), size=int(f["size"]), sha256=str(f["sha256"])) for f in listed or ()]
    yield pb.SnapshotChunk(computation=t.computation, key_range=t.key_range, token=t.token, done=True, files=files)
