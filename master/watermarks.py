"""Low-watermark math (DESIGN.md §7), as pure functions over the cluster's state.

``lwm(A) = min(oldest work of A's tablets, lwm(C) for every computation or
injector C feeding A)``. A tablet whose latest report was made under an older
token than its current one (it moved and the new owner has not reported yet)
holds ``A`` at its last published watermark. A stream nobody produces yet
holds its readers at the minimum: data may still come ("delayed or not
there?"). Published watermarks never decrease.

A computation *acts* on its input watermark (:func:`inputs`): the published watermarks of
what feeds it. Its own pending timers hold what it publishes for its readers, never what it
fires them on: otherwise each timer would fire only once the one before it had left the
computation's own watermark, one round of progress reports per distinct timer time (a
burst of session windows closing at the end of an input took a minute).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from master.scheduler import Ownership, TabletKey
from runtime.record import END_OF_TIME, MIN_TIME
from runtime.topology import ComputationSpec

MIN = MIN_TIME  # the start of time, under its name in this module's math

__all__ = ["END_OF_TIME", "MIN", "Settler", "TabletReport", "Watermark", "compute", "inputs", "publish",
           "with_idleness"]


@dataclass(frozen=True, slots=True)
class TabletReport:
    """The latest progress report of one tablet: its token and oldest work (None: idle)."""

    token: int
    oldest: int | None


@dataclass(frozen=True, slots=True)
class Watermark:
    """A computed low watermark and what holds it there."""

    value: int
    holder: str


def _lower(current: Watermark, value: int, holder: str) -> Watermark:
    return Watermark(value, holder) if value < current.value else current


def compute(
    specs: Iterable[ComputationSpec],
    tablets: Mapping[TabletKey, Ownership],
    reports: Mapping[TabletKey, TabletReport],
    injectors: Mapping[str, tuple[str, int]],
    published: Mapping[str, int],
    finished: Collection[str] = (),
) -> dict[str, Watermark]:
    """The low watermark of every computation (before the never-decrease rule). ``injectors``:
    name -> (stream, watermark); ``finished``: streams every injector of which finished (they
    count as fed, at the end of time)."""
    by_name = {s.name: s for s in specs}
    producers: dict[str, list[str]] = {}
    for s in by_name.values():
        for out in s.all_outputs:
            producers.setdefault(out, []).append(s.name)
    by_stream: dict[str, list[tuple[str, int]]] = {}
    for name, (stream, wm) in injectors.items():
        by_stream.setdefault(stream, []).append((name, wm))

    own: dict[str, Watermark] = {n: Watermark(END_OF_TIME, "idle") for n in by_name}
    for (comp, r), ownership in tablets.items():
        if comp not in own:
            continue
        rep = reports.get((comp, r))
        if rep is None or rep.token != ownership.token:
            held = published.get(comp, MIN)
            own[comp] = _lower(own[comp], held, f"tablet {comp}/{r} (no recent report: moved, or its worker is silent)")
        elif rep.oldest is not None:
            own[comp] = _lower(own[comp], rep.oldest, f"tablet {comp}/{r}")

    result: dict[str, Watermark] = {}

    def lwm(name: str) -> Watermark:
        # Topologies are acyclic (validated), so this recursion ends; depth = pipeline length.
        if name in result:
            return result[name]
        wm = own[name]
        for stream in by_name[name].inputs:
            feeders = [p for p in producers.get(stream, []) if p in by_name]
            sources = by_stream.get(stream, [])
            if not feeders and not sources and stream not in finished:
                wm = _lower(wm, MIN, f"stream {stream!r} (no injector or computation feeds it yet)")
            for p in feeders:
                up = lwm(p)
                wm = _lower(wm, up.value, up.holder)
            for inj, value in sources:
                wm = _lower(wm, value, f"injector {inj!r}")
        result[name] = wm
        return wm

    for name in by_name:
        lwm(name)
    return result


def with_idleness(injectors: Mapping[str, tuple[str, int]], idle: Collection[str]) -> dict[str, tuple[str, int]]:
    """What each injector holds its stream at, when those named in ``idle`` report themselves
    idle (nothing queued or unconfirmed, marked idle or silent for their ``idle_after``; Flink's
    ``withIdleness``). An idle injector holds nothing while another injector on its stream is
    active (not idle and not finished). When every unfinished injector on a stream is idle, the
    stream holds at the highest of their watermarks, as Flink's watermark valve advances to the
    highest of its inputs' watermarks once all of them are idle: a quiet source, however many
    partitions it has, does not stall its readers below what it promised. An idle injector
    that sends again reports itself active first; its records older than what its readers
    reached meanwhile are late."""
    if not idle:
        return dict(injectors)
    active: set[str] = set()
    highest: dict[str, int] = {}
    for name, (stream, wm) in injectors.items():
        if name in idle:
            highest[stream] = max(highest.get(stream, MIN), wm)
        elif wm != END_OF_TIME:
            active.add(stream)
    return {name: (stream, (END_OF_TIME if stream in active else highest[stream]) if name in idle else wm)
            for name, (stream, wm) in injectors.items()}


def publish(computed: Mapping[str, Watermark], published: Mapping[str, int]) -> dict[str, int]:
    """The new published values: never below what was published before."""
    return {name: max(wm.value, published.get(name, MIN)) for name, wm in computed.items()}


def inputs(specs: Iterable[ComputationSpec], published: Mapping[str, int],
           injectors: Mapping[str, tuple[str, int]], finished: Collection[str] = ()) -> dict[str, int]:
    """Each computation's input watermark: the lowest of the published watermarks of the
    computations producing its input streams and of the injectors on them (a stream nobody
    feeds yet holds it at the start of time). Event-time timers fire, and records count as
    late, on this value. Every record below it has been committed where it was sent: its
    producer holds its own watermark until the receiver's commit is reported."""
    by_name = {s.name: s for s in specs}
    producers: dict[str, list[str]] = {}
    for s in by_name.values():
        for out in s.all_outputs:
            producers.setdefault(out, []).append(s.name)
    by_stream: dict[str, list[int]] = {}
    for stream, wm in injectors.values():
        by_stream.setdefault(stream, []).append(wm)
    for stream in finished:
        by_stream.setdefault(stream, []).append(END_OF_TIME)
    out_: dict[str, int] = {}
    for name, spec in by_name.items():
        wm = END_OF_TIME
        for stream in spec.inputs:
            feeders = [published.get(p, MIN) for p in producers.get(stream, []) if p in by_name]
            sources = by_stream.get(stream, [])
            wm = min(wm, *feeders, *sources) if feeders or sources else MIN
        out_[name] = wm
    return out_


class Settler:
    """Lets a reported value's *increases* take effect only after ``settle_ms``.

    A sender drops a record from its report as soon as the receiver acknowledges
    it, but the receiver's next report (which covers the record) can reach the
    master a little later. Using, for each source, the minimum of what it
    reported over the last ``settle_ms`` closes that window, provided a report
    reaches the master within ``settle_ms`` of the commit it follows (workers
    report every 50 ms). Decreases take effect at once.
    """

    def __init__(self, settle_ms: float) -> None:
        self.settle_ms = settle_ms
        self._history: dict[object, list[tuple[float, int]]] = {}

    def observe(self, source: object, value: int, now_ms: float) -> None:
        self._history.setdefault(source, []).append((now_ms, value))
        self._prune(source, now_ms)

    def _prune(self, source: object, now_ms: float) -> None:
        # Keep the newest entry at or before the window's start: it was in force then.
        h = self._history[source]
        cut = now_ms - self.settle_ms
        i = 0
        while i + 1 < len(h) and h[i + 1][0] <= cut:
            i += 1
        if i:
            del h[:i]

    def value(self, source: object, now_ms: float) -> int | None:
        """The minimum of what ``source`` reported over the last ``settle_ms``."""
        if source not in self._history:
            return None
        self._prune(source, now_ms)
        return min(v for _, v in self._history[source])

    def forget(self, source: object) -> None:
        self._history.pop(source, None)
