"""The leader's injector registry: the promises injectors report, and the rules of their names.

An injector reports its watermark (a promise: nothing older will come) every round and every
10 s while idle. Several live injectors may share a name (``incarnation`` tells them apart):
the name holds its stream at the lowest promise of its active incarnations, and one that
finishes releases only its own hold (review W4). Releasing every hold under a name is an
operator's action (review N9), or the leader's own once a name is silent past
``injector_expiry_s`` (review G4) or a drain closes its stream. A name all of whose
incarnations finished holds nothing; the next tick deletes it and marks its stream finished
(master/progress.py), so the registry does not grow with every injection.

Reports land on the image's entries (:class:`~master.image.InjectorEntry`) at once and are
written to etcd by the next tick, with the watermarks they allow.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from master.image import ClusterImage
from master.jobs import closed_streams
from runtime.errors import ConfigError, MillstreamError, RoleError
from runtime.record import END_OF_TIME

log = logging.getLogger(__name__)

MAX_INJECTOR_NAME_BYTES = 512
MAX_INCARNATION_CHARS = 64
STREAM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def check_injector_name(name: str) -> None:
    """Injector names are stored in etcd and shown on the web page: bounded and printable."""
    if not name:
        raise ConfigError("an injector needs a name (it seeds its record ids and holds its watermark)")
    size = len(name.encode("utf-8", "replace"))
    if size > MAX_INJECTOR_NAME_BYTES:
        raise ConfigError(f"injector name of {size:,} bytes is too long; use at most {MAX_INJECTOR_NAME_BYTES} bytes")
    if not name.isprintable():
        raise ConfigError(f"injector name {name[:80]!r} has control characters; use printable text")


def report(image: ClusterImage, name: str, stream: str, watermark: int, now: float, incarnation: str = "",
           release: bool = False, operator: bool = False, idle: bool = False, retired: bool = False) -> None:
    """An injector's current promise; a new injector holds its stream from now on. ``release``
    (every hold under the name) needs ``operator``, the caller's role. An ``idle`` incarnation
    counts only when all of the name's are idle (:func:`master.watermarks.with_idleness`); a
    ``retired`` one leaves its promise as the name's floor (:meth:`~master.image.InjectorEntry.report`)."""
    check_injector_name(name)
    if release and not operator:
        raise RoleError(f"releasing injector {name!r} drops every hold under the name, an "
                        "operator's action; call it with the operator token (an injector "
                        "ends its own hold with finish())")
    if not isinstance(stream, str) or not STREAM_NAME.fullmatch(stream):
        raise ConfigError(f"injector {name!r}: stream {stream[:80]!r} is not a stream name (letters, "
                          "digits, '_', '.', '-'; at most 128 characters)")
    closed = closed_streams(image.topologies, image.jobs).get(stream)
    if closed is not None:
        if watermark == END_OF_TIME or release:
            return  # an injector finishing on a closed stream: it holds nothing anyway
        raise MillstreamError(f"injector {name!r}: {closed}")
    if len(incarnation) > MAX_INCARNATION_CHARS or not incarnation.isprintable():
        raise ConfigError(f"injector {name!r}: incarnation {incarnation[:80]!r} is not an id of at most "
                          f"{MAX_INCARNATION_CHARS} printable characters; let the Injector pick it")
    inj = image.injectors.get(name)
    if release:  # an operator gives up on every incarnation of the name (crashed, stale)
        if inj is None or inj.stream != stream:
            raise MillstreamError(
                f"no injector {name!r} holds stream {stream!r}; `millstream status` lists the injectors")
        log.warning("injector %s on %s released by an operator at watermark %s", name, stream, inj.watermark)
        inj.release(now)
        image.settler.forget(("injector", name))
        return
    if inj is None:
        inj = image.add_injector(name, stream, watermark)
    elif inj.stream != stream:
        if not inj.finished:
            # Else any caller could drop a live name's holds by naming another stream (N9).
            raise MillstreamError(
                f"injector {name!r} still holds stream {inj.stream!r} (at {inj.watermark}); finish it "
                f"there, or have an operator release it, before using the name for {stream!r}")
        inj.reset(stream)
    inj.report(incarnation, watermark, idle, now, retired)
    image.settler.observe(("injector", name), inj.watermark, now)


def release_streams(image: ClusterImage, streams: Iterable[str], now: float) -> list[str]:
    """Drop every injector's hold on ``streams`` (a drain): their watermarks go to the end of
    time. Returns the streams, to be marked finished (also those nobody fed yet, which would
    otherwise hold their readers back)."""
    streams = sorted(set(streams))
    for name, inj in image.injectors.items():
        if inj.stream in streams:
            inj.release(now)
            image.settler.forget(("injector", name))
    return streams


def expire(image: ClusterImage, now: float, expiry_ms: float) -> list[str]:
    """Release the names no injector has reported for ``expiry_ms`` (review G4): a live
    ``Injector`` reports every 10 s, so the process that held them is gone. Records a later
    injector sends under such a name may be late; the log and the status say so. A name
    with a retired run falls back to that run's promise instead. Returns the names released."""
    if expiry_ms <= 0:
        return []
    gone = [n for n, inj in image.injectors.items()
            if not inj.finished and not inj.waiting and now - (inj.seen if inj.seen is not None else now) > expiry_ms]
    for n in list(gone):
        inj = image.injectors[n]
        if inj.floor is not None:  # an earlier run retired: its promise stands, waiting for a next run
            log.warning("injector %s on %s: its live incarnations expired (no report for %.0f s); it holds the "
                        "stream at its retired runs' promise %s again", n, inj.stream, (now - (inj.seen or now)) / 1000,
                        inj.floor)
            inj.expire_live(now)
            gone.remove(n)
            continue
        log.warning("injector %s on %s expired: no report for %.0f s (MasterConfig.injector_expiry_s); "
                    "its hold at watermark %s is released, and records sent later under the name may "
                    "be late", n, inj.stream, (now - (inj.seen or now)) / 1000, inj.watermark)
        image.note_expired(now, n, inj.stream, inj.watermark)
        inj.release(now)  # the leader's own release
        image.settler.forget(("injector", n))
    return gone
