"""Talking to the masters: leader discovery, submission, routing, status.

A client may be given every master address; a follower answers with the
leader's address and the client follows it. :func:`connect` returns the
blocking :class:`Client` users call; :class:`AsyncMasterClient` is the
asyncio flavour the workers use.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from runtime.errors import ConfigError, MasterUnavailableError, MillstreamError, TopologyError
from runtime.imports import load
from runtime.keyspace import from_wire_end
from runtime.record import END_OF_TIME
from runtime.security import Security
from runtime.topology import Topology
from runtime.wire import millstream_pb2 as pb
from runtime.wire import millstream_pb2_grpc as rpc

if TYPE_CHECKING:
    from runtime.dataflow import Dataflow

log = logging.getLogger(__name__)

T = TypeVar("T")
# A master that is not the leader refuses a call with FAILED_PRECONDITION and this trailing
# metadata: the leader's address, or "" while none is known (master/server.py).
NOT_LEADER_METADATA = "millstream-not-leader"
_ADDRESS = re.compile(r"^[^\s:/]+:\d{1,5}$")


def parse_addresses(masters: str | Iterable[str]) -> list[str]:
    """``"a:1,b:2"`` or a list of addresses -> a validated list."""
    items = masters.split(",") if isinstance(masters, str) else list(masters)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ConfigError("no master address given; pass HOST:PORT[,HOST:PORT...] "
                          "(or set MILLSTREAM_MASTERS)")
    for a in out:
        if not _ADDRESS.match(a) or not 0 < int(a.rpartition(":")[2]) < 65536:
            raise ConfigError(f"master address {a!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return out


def _unavailable(addresses: Sequence[str], last: str) -> MasterUnavailableError:
    return MasterUnavailableError(
        f"cannot reach a millstream master at {','.join(addresses)} ({last}); "
        "check the address (and --tls-ca if the cluster uses TLS), or start a cluster with `millstream up`"
    )


def leader_redirect(e: grpc.RpcError) -> str | None:
    """For a follower's refusal, the leader's address it names ("" if none is known yet);
    None when ``e`` is not a refusal for not leading."""
    for key, value in e.trailing_metadata() or ():
        if key == NOT_LEADER_METADATA:
            return str(value)
    return None


def _raise_for(e: grpc.RpcError) -> None:
    """Turn a master's refusal into the matching :class:`MillstreamError`."""
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        raise TopologyError(details) from None
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        raise MillstreamError(details) from None
    if code == grpc.StatusCode.FAILED_PRECONDITION and leader_redirect(e) is None:
        raise MillstreamError(details) from None


class Client:
    """A blocking client of the masters (see :func:`connect`)."""

    def __init__(self, masters: str | Iterable[str], *, timeout: float = 10.0,
                 security: Security = Security()) -> None:
        self.addresses = parse_addresses(masters)
        self.timeout = timeout
        self.security = security
        self._channels: dict[str, grpc.Channel] = {}
        # One stub per master: a stub registers a callable for each of its 17 methods; made per
        # call, that was ~40 % of a master call's Python time (an injector reports every 20 ms).
        self._stubs: dict[str, rpc.MasterStub] = {}
        self._preferred = self.addresses[0]

    def _stub(self, address: str) -> rpc.MasterStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = self.security.channel(address)
            stub = self._stubs[address] = rpc.MasterStub(ch)
        return stub

    def call(self, fn: Callable[[rpc.MasterStub], T]) -> T:
        """Call the leader, following redirects, until ``timeout`` runs out."""
        deadline = time.monotonic() + self.timeout
        last = "no answer"
        delay = 0.05
        while True:
            for address in dict.fromkeys([self._preferred, *self.addresses]):
                try:
                    result = fn(self._stub(address))
                    self._preferred = address
                    return result
                except grpc.RpcError as e:
                    _raise_for(e)
                    last = f"{address}: {e.code().name} {e.details()}"
                    leader = leader_redirect(e)
                    if leader:
                        try:
                            result = fn(self._stub(leader))
                            self._preferred = leader
                            return result
                        except grpc.RpcError as e2:
                            _raise_for(e2)
                            last = f"{leader}: {e2.code().name} {e2.details()}"
            if time.monotonic() + delay > deadline:
                raise _unavailable(self.addresses, last)
            time.sleep(delay)  # retry pacing against an unreachable master, not a test wait
            delay = min(delay * 2, 1.0)

    def submit(self, topology: Topology | Dataflow) -> int:
        """Validate ``topology`` (a :class:`Topology`, or a :class:`Dataflow`, which compiles
        to one) importing its code here to catch bad paths early, and run it.

        Returns the number of tablets created.
        """
        doc = _checked_doc(topology)
        resp = self.call(lambda s: s.Submit(pb.SubmitRequest(topology_json=doc), timeout=self.timeout))
        return int(resp.tablets)

    def status(self) -> dict[str, Any]:
        resp = self.call(lambda s: s.Status(pb.StatusRequest(), timeout=self.timeout))
        return dict(json.loads(resp.json))

    def move(self, computation: str, key_range: int, worker: str) -> int:
        """Move one tablet to a worker (id or address); returns its new sequencer token."""
        req = pb.MoveTabletRequest(computation=computation, key_range=key_range, worker=worker)
        return int(self.call(lambda s: s.MoveTablet(req, timeout=self.timeout)).token)

    def split(self, computation: str, key_range: int, at: int | None = None) -> list[dict[str, Any]]:
        """Cut a key range in two while the job runs (at hash ``at``; else where its recent load
        divides evenly, else the middle);
        returns the two new ranges: ``key_range`` (id), ``start``, ``end``, ``primary``, ``token``."""
        req = pb.SplitRequest(computation=computation, key_range=key_range, at=at or 0, has_at=at is not None)
        return _ranges(self.call(lambda s: s.Split(req, timeout=self.timeout)))

    def merge(self, computation: str, left: int, right: int) -> list[dict[str, Any]]:
        """Join two adjacent key ranges (``right`` starts where ``left`` ends) while the job
        runs; returns the merged range."""
        req = pb.MergeRequest(computation=computation, left=left, right=right)
        return _ranges(self.call(lambda s: s.Merge(req, timeout=max(self.timeout, 90.0))))

    def release_injector(self, name: str, stream: str) -> None:
        """Stop every injector registered as ``name`` holding ``stream`` (one that crashed or
        went silent, flagged stale in status). Records sent under that name later may be late."""
        req = pb.InjectorReport(name=name, stream=stream, watermark=END_OF_TIME, release=True)
        self.call(lambda s: s.ReportInjector(req, timeout=self.timeout))

    def routing(self) -> pb.Routing:
        return self.call(lambda s: s.GetRouting(pb.RoutingRequest(), timeout=self.timeout))

    # ------------------------------------------------------------ job lifecycle (docs/lifecycle.md)

    def jobs(self) -> list[dict[str, Any]]:
        """Every job with its state (running, draining, drained, cancelled), computations, their
        ranges and low watermarks."""
        return list(self.status()["jobs"])

    def update(self, topology: Topology | Dataflow, *, drop_state: bool = False,
               reset_state: Iterable[str] = ()) -> dict[str, Any]:
        """Change a running job in place. Unchanged and changed computations keep their state
        (changed ones reopen with the new code and options); ``reset_state`` names computations
        to start over empty; removing a computation deletes its state and needs ``drop_state``.
        Returns the computations ``added``, ``removed``, ``changed``, ``reset`` and ``same``.
        A :class:`Dataflow`'s steps keep their state across an update by their names."""
        doc = _checked_doc(topology)
        req = pb.UpdateRequest(topology_json=doc, drop_state=drop_state, reset_state=list(reset_state))
        return dict(json.loads(self.call(lambda s: s.Update(req, timeout=self.timeout)).summary_json))

    def drain(self, name: str, *, wait: bool = True, timeout: float | None = None) -> str:
        """Close the job's input streams and let it finish every timer and window; with
        ``wait``, return once it is drained (raises :class:`MillstreamError` after ``timeout``
        seconds). Returns its state."""
        state = self.call(lambda s: s.Drain(pb.JobRequest(topology=name), timeout=self.timeout)).state
        deadline = None if timeout is None else time.monotonic() + timeout
        while wait and state != "drained":
            if state == "cancelled":
                raise MillstreamError(f"job {name!r} was cancelled while it drained")
            if deadline is not None and time.monotonic() > deadline:
                raise MillstreamError(f"job {name!r} is still {state} after {timeout:.0f}s; `millstream jobs` shows "
                                      "its computations' watermarks (one that stays low names what holds it)")
            time.sleep(0.2)  # polling the leader, not a test wait
            state = next((j["state"] for j in self.jobs() if j["name"] == name), "cancelled")
        return str(state)

    def cancel(self, name: str, *, keep_state: bool = False) -> str:
        """Stop a job at once. Its state is deleted, unless ``keep_state``: then submitting the
        same job again resumes it from that state."""
        req = pb.JobRequest(topology=name, keep_state=keep_state)
        return str(self.call(lambda s: s.Cancel(req, timeout=self.timeout)).state)

    def savepoint(self, name: str, directory: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """Write a consistent copy of job ``name`` (every tablet's state, timers, dedup data and
        productions, its topology, ranges and watermarks) into ``directory``, without stopping
        it: its input pauses until nothing is in flight (at most ``timeout`` s) and while the
        tablets are copied. Returns the savepoint's manifest."""
        from runtime import savepoint

        return savepoint.take(self, name, directory, timeout)

    def restore(self, directory: str, *, name: str | None = None) -> str:
        """Submit the job saved in ``directory`` (by :meth:`savepoint`) to this cluster, under
        ``name`` if given; its tablets continue from their saved state. Returns the job name."""
        from runtime import savepoint

        check_importable(Topology.from_json(str(savepoint.read_manifest(directory)["topology"])))
        return savepoint.restore(self, directory, name)

    def state(self, computation: str, key: bytes) -> bytes | None:
        """One key's committed state (``ctx.state``) in a running computation; None if unset."""
        found = self._read_state(computation, key, "")
        return found.value if found.found else None

    def state_names(self, computation: str) -> list[str]:
        """The typed states of a running computation, by the names :meth:`typed_state` takes:
        those its class declares; of a flow's stage, its steps' (which have no ``ctx.state``)."""
        return self.state_and_names(computation, b"")[1]

    def state_and_names(self, computation: str, key: bytes) -> tuple[bytes | None, list[str]]:
        """:meth:`state` and :meth:`state_names` in one call (`millstream state get`)."""
        found = self._read_state(computation, key, "")
        return (found.value if found.found else None), list(found.states)

    def typed_state(self, computation: str, key: bytes, name: str) -> Any:
        """One key's committed typed state ``name`` (a ``ValueState``, ``ListState`` or
        ``MapState`` declared on the computation's class) in a running computation, as JSON
        values: the value, a list, or a dict (keys as text); None if nothing is stored. The
        worker decodes it with the state's codec (bytes come back as text, or ``0x…`` hex)."""
        found = self._read_state(computation, key, name)
        return json.loads(found.value) if found.found else None

    def _read_state(self, computation: str, key: bytes, name: str) -> pb.ReadStateResponse:
        from runtime.routing import RoutingTable

        deadline = time.monotonic() + self.timeout
        while True:
            table = RoutingTable(self.routing())
            if computation not in table.computations:
                raise MillstreamError(f"no computation {computation!r} is running; `millstream jobs` lists the jobs")
            dest = table.destination(computation, table.range_for(computation, key))
            last = f"tablet {computation}/{dest.key_range} has no primary now"
            if dest.address:
                req = pb.ReadStateRequest(computation=computation, key_range=dest.key_range,
                                          token=dest.token, key=key, state=name)
                try:
                    resp = rpc.WorkerStub(self.worker_channel(dest.address)).ReadState(req, timeout=self.timeout)
                    return resp  # type: ignore[no-any-return]
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                    grpc.StatusCode.INVALID_ARGUMENT):
                        raise MillstreamError(e.details() or "refused") from None
                    last = f"{dest.address}: {e.code().name} {e.details()}"
            if time.monotonic() > deadline:
                raise MillstreamError(f"cannot read {computation!r} state: {last}; try again once "
                                      "`millstream status` shows the tablet healthy")
            time.sleep(0.1)  # the tablet is moving: retry against fresh routing

    def worker_channel(self, address: str) -> grpc.Channel:
        ch = self._channels.get("worker " + address)
        if ch is None:
            ch = self._channels["worker " + address] = self.security.channel(address)
        return ch

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# etcd refuses a request over --max-request-bytes (1.5 MiB by default); the topology shares
# its transaction with its first tablet assignments, so it must stay well below (B31).
MAX_TOPOLOGY_BYTES = 1_000_000


def check_topology_size(name: str, doc: str) -> None:
    """Refuse a topology whose JSON is too large to store in etcd."""
    size = len(doc.encode())
    if size > MAX_TOPOLOGY_BYTES:
        raise TopologyError(
            f"topology {name!r} is {size} bytes of JSON, over the limit of {MAX_TOPOLOGY_BYTES} "
            "bytes; keep large data out of computation params (pass a path or URL instead) or "
            "split the job into several topologies")


def warn_unsynced(topology: Topology) -> list[str]:
    """Warn, in one line, about exactly-once computations with ``fsync=False`` (review E6): their
    commits are acknowledged before they are on disk, so a host crash can lose acknowledged
    records (docs/guide.md#fsync). Returns their names."""
    names = [s.name for s in topology.computations.values() if s.exactly_once and s.fsync is False]
    if names:
        log.warning("topology %r: %s %s exactly_once=True with fsync=False: commits are acknowledged before "
                    "they reach the disk, so a host crash (power loss, kernel panic) can lose acknowledged "
                    "records unless another in-sync copy's host survives (replication >= 2); "
                    "see docs/guide.md#fsync", topology.name, ", ".join(names),
                    "is" if len(names) == 1 else "are")
    return names


def _checked_doc(job: Topology | Dataflow) -> str:
    """The job as the leader gets it: validated, its code imported here, its sinks' paths
    absolute; refused with one line if any of that fails."""
    topology = with_absolute_paths(as_topology(job))
    topology.validate()
    check_importable(topology)
    check_not_main(topology)
    warn_unsynced(topology)
    doc = topology.to_json()
    check_topology_size(topology.name, doc)
    return doc


def with_absolute_paths(topology: Topology) -> Topology:
    """``topology`` with its sinks' relative local paths (the params a Sink class names in
    ``local_paths``: FileSink's and ParquetSink's ``path``) made absolute against this
    process's working directory, where the user wrote them (a worker would resolve them
    against its own); a copy if any changed. (A flow's sinks get theirs in ``Dataflow.sink``.)"""
    from runtime.sinks import absolute_paths

    copy = None
    for name, spec in topology.computations.items():
        cls = load(spec.code, f"computation {name!r}: code")
        fixed = absolute_paths(cls, spec.params)
        if fixed != spec.params:
            if copy is None:
                copy = Topology(topology.name)
                copy.computations = dict(topology.computations)
            copy.computations[name] = dataclasses.replace(spec, params=fixed)
    return topology if copy is None else copy


def as_topology(job: Topology | Dataflow) -> Topology:
    """A topology, or the one a dataflow compiles to."""
    from runtime.dataflow import Dataflow

    if isinstance(job, Dataflow):
        return job.topology()
    if not isinstance(job, Topology):
        raise TopologyError(f"submit() takes a Topology or a Dataflow, not {type(job).__name__}")
    return job


def check_not_main(topology: Topology) -> None:
    """Refuse code of ``__main__``: the workers would import their own main module, not the
    script that submitted the job."""
    for spec in topology.computations.values():
        for path in [spec.code, *(p for p in spec.inputs.values() if p), *spec.params.values()]:
            if "__main__:" in path:
                name = path[path.index("__main__:"):].split('"')[0]
                raise TopologyError(
                    f"computation {spec.name!r} uses {name}, defined in the script you are running; the workers "
                    "import code by module path: move it into a module they can import (e.g. jobs.py beside the "
                    "script, on their PYTHONPATH)")


def check_importable(topology: Topology) -> None:
    """Import every computation and key extractor path, as workers will (a dataflow stage
    loads the code its plan names)."""
    from runtime.computation import Computation
    from runtime.flows import FLOW_CODE, SINK_FLOW_CODE

    for spec in topology.computations.values():
        cls = load(spec.code, f"computation {spec.name!r}: code")
        if not (isinstance(cls, type) and issubclass(cls, Computation)):
            raise TopologyError(
                f"computation {spec.name!r}: {spec.code!r} is {cls!r}, not a Computation "
                "subclass; point it at a class deriving from runtime.Computation"
            )
        if (cls.process_record is Computation.process_record and cls.process_timer is Computation.process_timer
                and not hasattr(cls, "process_batch")):
            raise TopologyError(
                f"computation {spec.name!r}: {spec.code!r} overrides neither process_record nor "
                "process_timer, so it would do nothing; define process_record(self, ctx, record)")
        if spec.code in (FLOW_CODE, SINK_FLOW_CODE):
            cls().setup(spec.params)  # every function, class and codec of the stage's plan
        for stream, path in spec.inputs.items():
            if path is not None and not callable(load(path, f"key extractor for {stream!r}")):
                raise TopologyError(f"key extractor {path!r} for {stream!r} is not callable")
    importlib.invalidate_caches()


def connect(masters: str | Iterable[str], *, timeout: float = 10.0,
            security: Security = Security()) -> Client:
    """A client of the masters at ``masters`` (``"host:port"``, comma-separated, or a list).

    ``security`` carries TLS settings and the shared token when the cluster requires them.
    """
    return Client(masters, timeout=timeout, security=security)


class AsyncMasterClient:
    """The asyncio flavour, used by workers: follows the leader, retries forever."""

    def __init__(self, masters: Sequence[str], timeout: float = 5.0, security: Security = Security()) -> None:
        self.addresses = list(masters)
        self.timeout = timeout
        self.security = security
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, rpc.MasterStub] = {}  # one per master (see Client._stubs)
        self.leader = self.addresses[0]

    def stub(self, address: str | None = None) -> rpc.MasterStub:
        address = address or self.leader
        stub = self._stubs.get(address)
        if stub is None:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = self.security.aio_channel(address)
            stub = self._stubs[address] = rpc.MasterStub(ch)
        return stub

    def follow(self, e: grpc.RpcError) -> None:
        """After a failed call: move to the named leader, or to the next address."""
        leader = leader_redirect(e)
        if leader:
            self.leader = leader
        else:
            candidates = self.addresses
            i = candidates.index(self.leader) if self.leader in candidates else -1
            self.leader = candidates[(i + 1) % len(candidates)]

    async def watch(self, known: int) -> AsyncIterator[pb.Routing]:
        async for r in self.stub().WatchRouting(pb.RoutingRequest(known_version=known)):
            yield r

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._stubs.clear()


def _ranges(resp: pb.ReshardResponse) -> list[dict[str, Any]]:
    return [{"key_range": r.key_range, "start": r.start, "end": from_wire_end(r.end),
             "primary": r.worker_id, "token": r.token} for r in resp.ranges]
